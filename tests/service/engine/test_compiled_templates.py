"""Templates compiled by inductor (``template_compile``, ``compiled_templates``): answers equal to the
runner's within torch's compile tolerance (``torch.testing.assert_close``'s defaults for the dtype, as
inductor's own tests compare with eager torch), input writes kept, a compile that fails said in the
log and the template left on the runner, compiles shared by a tenant's sessions and bounded by its
budget. Inductor's compiles cost seconds each: one small graph is compiled here (marked ``inductor``:
``make test-fast`` leaves it out), into a cache directory of this test run's own."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import decode_tensor, encode_tensor

from remote_autograd.service.engine import template_compile
from remote_autograd.service.engine.template_compile import Compiler

from ...conftest import PROTOCOL_HEADERS
from ..wire import new_id
from .template_cases import (Case, by_compiled_way, by_runner, call, mlp_backward, ref, template_step, train_step,
                             variants_of_its_own)

pytestmark = pytest.mark.inductor

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """Inductor's caches in this run's temporary directory (one for every module of the run)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "inductor"))
        yield


@pytest.fixture(autouse=True)
def own_variants():
    with variants_of_its_own():
        yield


def _submit(compiler: Compiler, case: Case, tenant: str = "open", key=None, budget: float = 600.0):
    return compiler.submit(tenant, key or (case.name,), case.template(), case.layouts(CPU), case.scalars, CPU,
                           budget=budget, cuda_graphs=False)


def test_a_compiled_template_gives_the_runners_answers_within_torchs_tolerance():
    if template_compile.compiler_missing():
        pytest.skip(template_compile.compiler_missing())
    case, compiler = train_step(), Compiler()
    variant = _submit(compiler, case)
    compiler.wait(timeout=600)
    assert variant.state == "ready", variant.reason
    got, want = by_compiled_way(case, variant), by_runner(case)
    assert got.keys() == want.keys()
    for name in want:
        (v1, g1), (v2, g2) = got[name], want[name]
        torch.testing.assert_close(v1, v2, msg=name)  # w1, b1 written in place; out the loss
        assert (g1 is None) == (g2 is None), name
        if g1 is not None:
            torch.testing.assert_close(g1, g2, msg=name)
    assert not torch.equal(got["w1"][0], case.inputs["w1"][0])  # the step did write into its input


def test_a_compile_that_fails_leaves_the_template_on_the_runner_and_says_so(caplog):
    """inductor without a working C++ compiler: the variant fails, the log says so, nothing raises."""
    if template_compile.compiler_missing():
        pytest.skip(template_compile.compiler_missing())
    from torch._inductor import config

    case = Case("fails", [call("mul", ref("x"), 3.0, out=["m"]), call("relu", ref("m"), out=["r"])],
                {"x": (torch.randn(7, 3), False, None)}, ["r"])
    compiler = Compiler()
    # in this process (a compile pool started before has its own config), with no cache to hit
    with config.patch({"cpp.cxx": ("/bin/false",), "fx_graph_cache": False, "compile_threads": 1}), \
            caplog.at_level(logging.WARNING, logger="remote_autograd.service.engine.template_compile"):
        variant = _submit(compiler, case)
        compiler.wait(timeout=600)
    assert variant.state == "failed" and variant.fn is None
    assert "compiling it failed; it runs uncompiled" in caplog.text and "fails" in caplog.text


_DROPOUT = Case("dropout", [call("nn.functional.dropout", ref("x"), 0.5, out=["d"])],
                {"x": (torch.randn(4), False, None)}, ["d"])


def test_a_template_a_graph_cannot_hold_is_never_compiled():
    compiler = Compiler()
    variant = _submit(compiler, _DROPOUT)
    compiler.wait(timeout=60)
    assert variant.state == "unfit" and "dropout" in variant.reason


def test_a_tenants_sessions_share_a_variant_and_tenants_do_not():
    compiler = Compiler()
    first = _submit(compiler, _DROPOUT, tenant="a", key=("k",))
    assert _submit(compiler, _DROPOUT, tenant="a", key=("k",)) is first
    assert compiler.get("a", ("k",)) is first
    assert _submit(compiler, _DROPOUT, tenant="b", key=("k",)) is not first
    compiler.wait(timeout=60)


_EXIT_WITH_COMPILES_QUEUED = """
import time
from remote_autograd.service.engine import template_compile
from tests.service.engine.test_compiled_templates import _DROPOUT, _submit

template_compile.build = lambda *args, **kwargs: time.sleep(600)  # compiles that take ten minutes
compiler = template_compile.Compiler()
for n in range(3):
    _submit(compiler, _DROPOUT, key=(n,))
time.sleep(0.5)  # the first one under way
"""


def test_a_process_exits_with_compiles_under_way_and_queued():
    # a server stopped with compiles queued ran each before its process could exit (a pool's worker runs
    # every queued item first), longer than a front waits for a tenant worker to stop
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _EXIT_WITH_COMPILES_QUEUED], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - began < 60


def test_a_spent_budget_compiles_nothing_more_and_says_so_once(caplog):
    compiler = Compiler()
    with caplog.at_level(logging.WARNING, logger="remote_autograd.service.engine.template_compile"):
        assert _submit(compiler, _DROPOUT, key=("one",), budget=0.0) is None
        assert _submit(compiler, _DROPOUT, key=("two",), budget=0.0) is None
    assert caplog.text.count("compile budget") == 1


# -- through run_template, on the service's app ------------------------------------------------------


def _app(**settings) -> httpx.Client:
    return httpx.Client(transport=client.InProcessTransport(service_app(**settings)), base_url="http://in-process",
                        headers=PROTOCOL_HEADERS, timeout=600)


def _program(c: httpx.Client, sid: str, steps: list) -> list:
    r = c.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": steps})
    assert r.status_code == 200, r.text
    return r.json()["results"]


def _train(c: httpx.Client, runs: int, between=lambda: None) -> dict:
    """``runs`` runs of the training-step template on a new session: the losses, then the parameters."""
    case = train_step()
    sid = c.post("/v1/sessions").json()["session_id"]
    puts = [{"kind": "put", "id": name, "value": encode_tensor(v, as_json=True), "requires_grad": rg,
             **({"grad": encode_tensor(g, as_json=True)} if g is not None else {})}
            for name, (v, rg, g) in case.inputs.items()]
    _program(c, sid, [*puts, template_step(case, "step")])
    losses = []
    for n in range(runs):
        run = {"kind": "run_template", "template": "step", "inputs": [{"ref": name} for name in case.inputs],
               "scalars": [case.scalars["neg_lr"]], "out": [f"loss{n}"]}
        losses.append(decode_tensor(_program(c, sid, [run, {"kind": "fetch", "id": f"loss{n}"}])[1]["tensor"]["value"]))
        between()
    params = {}
    for name in ("w1", "b1", "w2", "b2"):
        got = _program(c, sid, [{"kind": "fetch", "id": name}])[0]["tensor"]
        params[name] = (decode_tensor(got["value"]), decode_tensor(got["grad"]))
    return {"losses": losses, "params": params}


def test_a_template_runs_compiled_after_its_first_run_with_the_plain_ways_answers():
    """REMOTE_AUTOGRAD_COMPILE=on: the first run plain (its variant compiles meanwhile), the rest compiled;
    losses, parameters and grads as the plain way's, within torch's tolerance."""
    if template_compile.compiler_missing():
        pytest.skip(template_compile.compiler_missing())
    before = template_compile.COMPILER.figures()["runs"]
    with _app(compile="on") as c:
        compiled = _train(c, 4, between=lambda: template_compile.COMPILER.wait(timeout=600))
    assert template_compile.COMPILER.figures()["runs"] - before == 3
    with _app() as c:  # off, the default
        plain = _train(c, 4)
    torch.testing.assert_close(compiled, plain)


def _forward_then_backward(c: httpx.Client, runs: int, between=lambda: None) -> dict:
    """``torch.compile(model)``'s way: the forward a template whose loss requires grad, the backward a step of
    its own after it; the losses, then the parameters' grads (accumulated over the runs)."""
    case = mlp_backward()
    forward = Case("forward", case.steps[:4], case.inputs, ["loss"])
    sid = c.post("/v1/sessions").json()["session_id"]
    puts = [{"kind": "put", "id": name, "value": encode_tensor(v, as_json=True), "requires_grad": rg}
            for name, (v, rg, _) in forward.inputs.items()]
    _program(c, sid, [*puts, template_step(forward, "forward")])
    losses = []
    for n in range(runs):
        run = {"kind": "run_template", "template": "forward", "inputs": [{"ref": name} for name in forward.inputs],
               "scalars": [], "out": [f"loss{n}"]}
        results = _program(c, sid, [run, {"kind": "backward", "tensors": [f"loss{n}"]}, {"kind": "fetch", "id": f"loss{n}"}])
        losses.append(decode_tensor(results[2]["tensor"]["value"]))
        between()
    grads = {name: decode_tensor(_program(c, sid, [{"kind": "fetch", "id": name, "value": False, "grad": True}])[0]
                                 ["tensor"]["grad"]) for name in ("w1", "b1", "w2", "b2")}
    return {"losses": losses, "grads": grads}


def test_a_forward_template_whose_loss_requires_grad_runs_compiled_and_its_backward_after_it():
    """The loss of a compiled run carries the compiled backward: a backward step after the run fills the
    parameters' grads as the plain way does, within torch's tolerance (it was never compiled: "output
    requires grad")."""
    if template_compile.compiler_missing():
        pytest.skip(template_compile.compiler_missing())
    before = template_compile.COMPILER.figures()["runs"]
    with _app(compile="on") as c:  # the first run without grads, the second with: two variants, two plain runs
        compiled = _forward_then_backward(c, 4, between=lambda: template_compile.COMPILER.wait(timeout=600))
    assert template_compile.COMPILER.figures()["runs"] - before == 2
    with _app() as c:
        plain = _forward_then_backward(c, 4)
    torch.testing.assert_close(compiled, plain)

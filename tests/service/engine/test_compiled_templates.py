"""Templates compiled by inductor (``template_compile``, ``compiled_templates``): answers equal to the
runner's within torch's compile tolerance (``torch.testing.assert_close``'s defaults for the dtype, as
inductor's own tests compare with eager torch), input writes kept, a compile that fails said in the
log and the template left on the runner, compiles shared by a tenant's sessions and bounded by its
budget. Inductor's compiles cost seconds each: one small graph is compiled here (marked ``inductor``:
``make test-fast`` leaves it out), into a cache directory of this test run's own."""

from __future__ import annotations

import logging

import pytest
import torch

from remote_autograd.service.engine import template_compile
from remote_autograd.service.engine.template_compile import Compiler

from .template_cases import Case, by_compiled_way, by_runner, call, mlp_backward, ref

pytestmark = pytest.mark.inductor

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """Inductor's caches in this run's temporary directory (one for every module of the run)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "inductor"))
        yield


def _backward_then_sgd() -> Case:
    """A training step in one template: forward, ``backward`` (grads added into the two a leaf holds,
    given to the others), then SGD in place on two parameters, its lr a number."""
    base = mlp_backward(grads=True)
    sgd = call("_foreach_add_", [ref("w1"), ref("b1")], [{"grad_of": "w1"}, {"grad_of": "b1"}],
               alpha={"scalar": "neg_lr"}, grad_enabled=False)
    return Case("train-step", [*base.steps, sgd], base.inputs, base.outputs, {"neg_lr": -0.1})


def _submit(compiler: Compiler, case: Case, tenant: str = "open", key=None, budget: float = 600.0):
    return compiler.submit(tenant, key or (case.name,), case.template(), case.layouts(CPU), case.scalars, CPU,
                           budget=budget, cuda_graphs=False)


def test_a_compiled_template_gives_the_runners_answers_within_torchs_tolerance():
    if template_compile.compiler_missing():
        pytest.skip(template_compile.compiler_missing())
    case, compiler = _backward_then_sgd(), Compiler()
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
    assert "compiling it failed; it runs on the runner" in caplog.text and "fails" in caplog.text


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


def test_a_spent_budget_compiles_nothing_more_and_says_so_once(caplog):
    compiler = Compiler()
    with caplog.at_level(logging.WARNING, logger="remote_autograd.service.engine.template_compile"):
        assert _submit(compiler, _DROPOUT, key=("one",), budget=0.0) is None
        assert _submit(compiler, _DROPOUT, key=("two",), budget=0.0) is None
    assert caplog.text.count("compile budget") == 1

"""Templates over raw HTTP, written by hand as a non-Python client would (``proto/SPEC.md`` §5): a
``template`` step defines one once, each ``run_template`` step runs it with other tensors and numbers,
and its answers equal torch's. Refusals: validation (an op not in the table, a forbidden step kind,
a name read before it is made), a run with another layout than declared, an unknown template, the
session's limit, and a step failing inside a run (no output kept, the message names the step).
A worker process's crash mid-template loses only that tenant's session.
"""

from __future__ import annotations

import httpx
import pytest
import torch

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import decode_tensor

from ...conftest import PROTOCOL_HEADERS
from ..wire import Wire, call_step, decode, expect_error, new_id, put_step, ref


def _template(tid: str = "T", **changes) -> dict:
    """y = (x @ w) * scale, loss = y.sum(); gw = d loss / d w, which also becomes w's grad."""
    template = {
        "kind": "template", "id": tid,
        "inputs": [{"id": "x", "dtype": "float32", "shape": [2, 3]},
                   {"id": "w", "dtype": "float32", "shape": [3, 4], "requires_grad": True}],
        "scalars": [{"id": "scale", "kind": "float"}],
        "steps": [
            call_step("matmul", ref("x"), ref("w"), out=["h"]),
            call_step("mul", ref("h"), {"scalar": "scale"}, out=["y"]),
            call_step("sum", ref("y"), out=["loss"]),
            {"kind": "grad", "outputs": ["loss"], "inputs": ["w"], "out": ["gw"], "retain_graph": True},
            {"kind": "set_grad", "id": "w", "grad": ref("gw")},
        ],
        "outputs": ["y", "gw"],
    }
    return {**template, **changes}


def _run(x: str, w: str, scale, out: list[str], tid: str = "T") -> dict:
    return {"kind": "run_template", "template": tid, "inputs": [ref(x), ref(w)], "scalars": [scale], "out": out}


def _fetch(wire: Wire, sid: str, tid: str, grad: bool = False) -> torch.Tensor:
    body = decode(wire.get(f"/v1/sessions/{sid}/tensors/{tid}"))
    return decode_tensor(body["grad" if grad else "value"])


def _tensors(wire: Wire, sid: str) -> int:
    return decode(wire.get(f"/v1/sessions/{sid}"))["tensors"]


def test_a_template_runs_again_with_other_tensors_and_numbers_as_torch_would(wire: Wire, sid: str):
    g = torch.Generator().manual_seed(0)
    xs, w = [torch.randn(2, 3, generator=g) for _ in range(2)], torch.randn(3, 4, generator=g)
    wire.ok(sid, [put_step("x0", wire.tensor(xs[0])), put_step("x1", wire.tensor(xs[1])),
                  put_step("w", wire.tensor(w), True), _template()])
    held = _tensors(wire, sid)
    results = wire.ok(sid, [_run("x0", "w", 2.0, ["y0", "g0"]), _run("x1", "w", 3, ["y1", "g1"])])
    assert results == [{"tensors": [{"id": "y0", "dtype": "float32", "shape": [2, 4], "requires_grad": True},
                                    {"id": "g0", "dtype": "float32", "shape": [3, 4], "requires_grad": False}]},
                       {"tensors": [{"id": "y1", "dtype": "float32", "shape": [2, 4], "requires_grad": True},
                                    {"id": "g1", "dtype": "float32", "shape": [3, 4], "requires_grad": False}]}]
    assert _tensors(wire, sid) == held + 4  # the outputs, and none of the template's temporaries
    for k, (x, scale) in enumerate(zip(xs, (2.0, 3.0))):
        local = w.clone().requires_grad_()
        y = (x @ local) * scale
        y.sum().backward()
        assert torch.equal(_fetch(wire, sid, f"y{k}"), y.detach())
        assert torch.equal(_fetch(wire, sid, f"g{k}"), local.grad)
    assert torch.equal(_fetch(wire, sid, "w", grad=True), _fetch(wire, sid, "g1"))  # the last run's set_grad
    # the outputs are the session's tensors like any other: a backward through one reaches w (its grad is g1
    # itself, as after torch's ``w.grad = g1``: the backward accumulates into it in place)
    before = _fetch(wire, sid, "g1")
    wire.ok(sid, [call_step("sum", ref("y0"), out=["s"]), {"kind": "backward", "tensors": ["s"]}])
    want = before + 2.0 * xs[0].sum(0)[:, None]
    assert torch.equal(_fetch(wire, sid, "w", grad=True), want) and torch.equal(_fetch(wire, sid, "g1"), want)


def test_a_template_updates_parameters_in_place_through_their_grads(wire: Wire, sid: str):
    """An optimizer's step: ``p.add_(p.grad, alpha=-lr)`` with the grad bound by ``{grad_of}``."""
    p = torch.tensor([1.0, 2.0, 3.0])
    sgd = {"kind": "template", "id": "sgd",
           "inputs": [{"id": "p", "dtype": "float32", "shape": [3], "requires_grad": True},
                      {"id": "g", "dtype": "float32", "shape": [3]}],
           "scalars": [{"id": "lr", "kind": "float"}],
           "steps": [call_step("mul", ref("g"), {"scalar": "lr"}, out=["d"]),
                     {**call_step("Tensor.sub_", ref("p"), ref("d")), "grad_enabled": False}]}
    wire.ok(sid, [put_step("p", wire.tensor(p), True), call_step("mul", ref("p"), ref("p"), out=["sq"]),
                  call_step("sum", ref("sq"), out=["l"]), {"kind": "backward", "tensors": ["l"]}, sgd])
    for lr in (0.5, 0.25):
        wire.ok(sid, [{"kind": "run_template", "template": "sgd", "inputs": [ref("p"), {"grad_of": "p"}],
                       "scalars": [lr], "out": []}])
    assert torch.equal(_fetch(wire, sid, "p"), p - (0.5 + 0.25) * 2 * p)


@pytest.mark.parametrize("case", ["op not in the table", "put inside", "fetch inside", "read before made",
                                  "made twice", "output not made", "out_many", "scalar not declared"])
def test_a_template_that_fails_validation_is_refused_and_not_kept(wire: Wire, sid: str, case: str):
    steps = _template()["steps"]
    change, status, code, words = {
        "op not in the table": ({"steps": [call_step("os.system", "true", out=["h"]), *steps[1:]]}, 404,
                                "unknown_op", ["step 0 of template 'T'", "os.system"]),
        "put inside": ({"steps": [put_step("h", wire.tensor(torch.ones(2, 4))), *steps[1:]]}, 400, "bad_request",
                       ["steps.0.template.steps.0"]),
        "fetch inside": ({"steps": [*steps, {"kind": "fetch", "id": "y"}]}, 400, "bad_request",
                         ["steps.0.template.steps.5"]),
        "read before made": ({"steps": [steps[1], steps[0], *steps[2:]]}, 400, "bad_request",
                             ["step 0 of template 'T'", "'h' is read before"]),
        "made twice": ({"steps": [*steps, call_step("neg", ref("y"), out=["h"])]}, 400, "bad_request",
                       ["step 5 of template 'T'", "'h' is made twice"]),
        "output not made": ({"outputs": ["y", "x"]}, 400, "bad_request", ["output 'x' is not made"]),
        "out_many": ({"steps": [{**steps[0], "out_many": True}, *steps[1:]]}, 400, "bad_request", ["out_many"]),
        "scalar not declared": ({"scalars": []}, 400, "bad_request", ["step 1 of template 'T'", "'scale'"]),
    }[case]
    st, body = wire.program(sid, [_template(**change)])
    assert st == status, body
    # the program's validation names the field (no step ran); the template's own, the step that defines it
    assert body["error"]["code"] == code and body["error"]["step"] == (None if case.endswith("inside") else 0)
    for w in words:
        assert w in body["error"]["message"], body["error"]["message"]
    wire.ok(sid, [put_step("x", wire.tensor(torch.ones(2, 3))), put_step("w", wire.tensor(torch.ones(3, 4)), True)])
    expect_error(wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode(
        {"id": new_id(), "steps": [_run("x", "w", 1.0, ["y"])]})), 404, "unknown_template", "'T'")


def test_a_run_must_bind_the_layouts_and_numbers_the_template_declares(wire: Wire, sid: str):
    wire.ok(sid, [put_step("x", wire.tensor(torch.ones(2, 3))), put_step("w", wire.tensor(torch.ones(3, 4)), True),
                  put_step("wide", wire.tensor(torch.ones(2, 5))), put_step("w64", wire.tensor(torch.ones(3, 4,
                  dtype=torch.float64)), True), put_step("frozen", wire.tensor(torch.ones(3, 4))), _template()])
    held = _tensors(wire, sid)
    for run, words in (
            (_run("wide", "w", 1.0, ["y", "g"]), ["input 0 ('x')", "[2, 3]", "[2, 5]"]),
            (_run("x", "w64", 1.0, ["y", "g"]), ["input 1 ('w')", "float32", "float64"]),
            (_run("x", "frozen", 1.0, ["y", "g"]), ["input 1 ('w')", "requires_grad=True", "requires_grad=False"]),
            (_run("x", "w", "2", ["y", "g"]), ["run_template.scalars.0"]),  # not a number at all
            (_run("x", "w", True, ["y", "g"]), ["scalar 0 ('scale')", "expected a float"]),
            (_run("x", "w", 1.0, ["y"]), ["takes 2 out"]),
            ({**_run("x", "w", 1.0, ["y", "g"]), "inputs": [ref("x")]}, ["takes 2 inputs"]),
            ({**_run("x", "w", 1.0, ["y", "g"]), "inputs": [ref("x"), {"dtype": "float32"}]}, ["input 1"])):
        st, body = wire.program(sid, [run])
        assert st == 400 and body["error"]["code"] == "bad_request", body
        for w in words:
            assert w in body["error"]["message"], body["error"]["message"]
    assert _tensors(wire, sid) == held


def test_a_failing_step_inside_a_run_keeps_no_output_and_names_the_step(wire: Wire, sid: str):
    bad = {"kind": "template", "id": "bad",
           "inputs": [{"id": "a", "dtype": "float32", "shape": [2, 2]}, {"id": "b", "dtype": "float32", "shape": [3]}],
           "steps": [call_step("Tensor.add_", ref("a"), 1.0), call_step("neg", ref("a"), out=["n"]),
                     call_step("matmul", ref("n"), ref("b"), out=["m"])],
           "outputs": ["n", "m"]}
    wire.ok(sid, [put_step("a", wire.tensor(torch.zeros(2, 2))), put_step("b", wire.tensor(torch.ones(3))), bad])
    held = _tensors(wire, sid)
    st, body = wire.program(sid, [call_step("neg", ref("b"), out=["before"]),
                                  {"kind": "run_template", "template": "bad", "inputs": [ref("a"), ref("b")],
                                   "out": ["n", "m"]},
                                  call_step("neg", ref("b"), out=["after"])])
    assert st == 422, body
    err = body["error"]
    assert err["code"] == "op_error" and err["step"] == 1 and err["op"] == "run_template"
    assert err["message"].startswith("step 2 of template 'bad': matmul: "), err["message"]
    assert _tensors(wire, sid) == held + 1  # "before": no output of the run, no temporary, nothing after it
    for tid in ("n", "m", "after"):
        assert wire.get(f"/v1/sessions/{sid}/tensors/{tid}").status_code == 404
    assert torch.equal(_fetch(wire, sid, "a"), torch.ones(2, 2))  # the step before the failing one stays done


def test_a_definition_is_kept_once_and_an_id_means_one_template(wire: Wire, sid: str):
    wire.ok(sid, [_template(), _template()])  # the same again: nothing new
    st, body = wire.program(sid, [_template(outputs=["y"])])
    assert st == 409 and body["error"]["code"] == "conflict" and "'T'" in body["error"]["message"], body


@pytest.fixture
def small_app() -> httpx.Client:
    with httpx.Client(transport=client.InProcessTransport(service_app(max_templates_per_session=2,
                                                                      max_steps_per_program=4)),
                      base_url="http://in-process", headers=PROTOCOL_HEADERS) as c:
        yield c


def test_a_session_keeps_at_most_max_templates_per_session(small_app: httpx.Client):
    sid = small_app.post("/v1/sessions").json()["session_id"]
    assert small_app.post("/v1/sessions").json()["limits"]["max_templates_per_session"] == 2
    one = {**_template("A"), "steps": _template()["steps"][:3], "outputs": ["y"]}
    for tid in ("A", "B"):
        r = small_app.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [{**one, "id": tid}]})
        assert r.status_code == 200, r.text
    r = small_app.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [{**one, "id": "C"}]})
    expect_error(r, 413, "too_large", "max_templates_per_session=2")
    r = small_app.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [_template("D")]})
    expect_error(r, 413, "too_large", "template has 5 steps", "max_steps_per_program=4")


@pytest.mark.backends("tenants")
def test_a_worker_that_crashes_mid_template_loses_only_its_session(http: httpx.Client):
    """The test-only crash op inside a template, with a worker process per tenant: the run's session is
    lost (410), the server goes on and the tenant's next session works."""
    sid = http.post("/v1/sessions").json()["session_id"]
    crash = {"kind": "template", "id": "crash", "inputs": [{"id": "x", "dtype": "float32", "shape": [2]}],
             "steps": [call_step("neg", ref("x"), out=["n"]), call_step("_test_abort", ref("n"), out=["z"])],
             "outputs": ["n"]}
    r = http.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [
        {"kind": "put", "id": "x", "value": {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}}, crash,
        {"kind": "run_template", "template": "crash", "inputs": [ref("x")], "out": ["n"]}]})
    expect_error(r, 410, "session_lost", "SIGABRT")
    fresh = http.post("/v1/sessions").json()["session_id"]
    r = http.post(f"/v1/sessions/{fresh}/programs", json={"id": new_id(), "steps": [
        {"kind": "put", "id": "x", "value": {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}},
        {**crash, "steps": crash["steps"][:1]},
        {"kind": "run_template", "template": "crash", "inputs": [ref("x")], "out": ["n"]},
        {"kind": "fetch", "id": "n", "grad": False}]})
    assert r.status_code == 200, r.text
    assert decode_tensor(r.json()["results"][3]["tensor"]["value"]).tolist() == [-1.0, -2.0]

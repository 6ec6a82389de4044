"""The ``function`` step and a backward's ``hooks`` over raw HTTP, written by hand as a non-Python client
would (``proto/SPEC.md`` §4): a Function's forward sent as ordinary steps, then one ``function`` step makes
its outputs a node of the session's graph whose backward runs a template; gradients and a double backward
equal torch's; a hook runs its template for its step alone. Refusals name the field, and a refused step
leaves the session as it was."""

from __future__ import annotations

import httpx
import torch

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import decode_tensor

from ...conftest import PROTOCOL_HEADERS
from ..wire import Wire, call_step, decode, expect_error, new_id, put_step, ref

# Cube: y = x ** 3, saving x; backward 3 * x ** 2 * g (grad on: twice differentiable)
_CUBE_BACKWARD = {
    "kind": "template", "id": "cube-bw",
    "inputs": [{"id": "g", "dtype": "float64", "shape": [4]}, {"id": "x", "dtype": "float64", "shape": [4]}],
    "steps": [call_step("pow", ref("x"), 2, out=["x2"]), call_step("mul", ref("x2"), 3, out=["d"]),
              call_step("mul", ref("d"), ref("g"), out=["gx"])],
    "outputs": ["gx"],
}


def _cube(y: str = "y", **changes) -> list:
    step = {"kind": "function", "name": "Cube", "backward": "cube-bw", "inputs": ["x"], "outputs": [y],
            "saved": ["x"], "grads": [2], **changes}
    return [{**call_step("pow", ref("x"), 3, out=[y]), "grad_enabled": False}, step]


def _grad(wire: Wire, sid: str, tid: str) -> torch.Tensor:
    return decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/{tid}"))["grad"])


def test_a_function_step_makes_a_node_whose_backward_runs_its_template(wire: Wire, sid: str):
    x = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True), _CUBE_BACKWARD, *_cube()])
    meta = decode(wire.get(f"/v1/sessions/{sid}/tensors/y"))
    assert meta["requires_grad"] is True
    wire.ok(sid, [call_step("sum", ref("y"), out=["s"]),
                  {"kind": "grad", "outputs": ["s"], "inputs": ["x"], "out": ["gx"], "create_graph": True},
                  call_step("sum", ref("gx"), out=["s2"]), {"kind": "backward", "tensors": ["s2"]}])
    local = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad((local ** 3).sum(), local, create_graph=True)
    gx.sum().backward()
    assert torch.equal(_grad(wire, sid, "x"), local.grad)  # 6 x: through the template's own steps


def test_a_function_step_that_does_not_fit_is_refused_naming_the_field(wire: Wire, sid: str):
    x = torch.ones(4, dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True), _CUBE_BACKWARD])
    held = decode(wire.get(f"/v1/sessions/{sid}"))["tensors"]
    cases = [
        ({"grads": [3]}, 400, "bad_request", "grad 3 is out of range"),
        ({"grads": [2, None]}, 400, "bad_request", "grads has 2 entries for 1 inputs"),
        ({"saved": []}, 400, "bad_request", "takes 2 inputs"),
        ({"dirty": [0]}, 400, "bad_request", "dirty input 0"),
        ({"non_differentiable": [1]}, 400, "bad_request", "non_differentiable output 1"),
        ({"backward": "nope"}, 404, "unknown_template", "nope"),
        ({"variants": [{"present": [False], "grads": [None]}]}, 400, "bad_request", "for materialize_grads false"),
        ({"materialize_grads": False, "variants": [{"present": [False, True], "grads": [None]}]}, 400,
         "bad_request", "present has 2 entries for 1 outputs"),
        ({"materialize_grads": False, "variants": [{"present": [False], "backward": "cube-bw", "grads": [0]}]}, 400,
         "bad_request", "the step binds 0 grads, 1 saved"),
        ({"materialize_grads": False, "variants": [{"present": [False], "backward": "gone", "grads": [0]}]}, 404,
         "unknown_template", "gone"),
    ]
    for k, (changes, status, code, words) in enumerate(cases):
        r = wire.post_raw(f"/v1/sessions/{sid}/programs",
                          wire.encode({"id": new_id(), "steps": _cube(f"y{k}", **changes)}))
        expect_error(r, status, code, words)
        assert decode(wire.get(f"/v1/sessions/{sid}/tensors/y{k}"))["requires_grad"] is False  # the forward's alone
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
        {"kind": "function", "name": "F", "inputs": ["x"], "outputs": ["x"], "grads": [0]}]}))
    expect_error(r, 400, "bad_request", "an input the forward did not mark dirty")
    assert decode(wire.get(f"/v1/sessions/{sid}"))["tensors"] == held + len(cases)


def test_a_hook_of_a_backward_step_runs_its_template_and_goes_with_the_step(wire: Wire, sid: str):
    x = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=torch.float64)
    double = {"kind": "template", "id": "double", "inputs": [{"id": "g", "dtype": "float64", "shape": [4]}],
              "steps": [call_step("mul", ref("g"), 2, out=["h"])], "outputs": ["h"]}
    wire.ok(sid, [put_step("x", wire.tensor(x), True), double, call_step("sum", ref("x"), out=["s"]),
                  {"kind": "backward", "tensors": ["s"], "retain_graph": True,
                   "hooks": [{"id": "x", "template": "double"}]},
                  {"kind": "backward", "tensors": ["s"]}])
    assert torch.equal(_grad(wire, sid, "x"), torch.full((4,), 3.0, dtype=torch.float64))  # 2, then 1: removed
    wire.ok(sid, [put_step("n", wire.tensor(x))])
    for hooks, status, code, words in (([{"id": "x", "template": "nope"}], 404, "unknown_template", "nope"),
                                       ([{"id": "x", "template": "cube-bw"}], 400, "bad_request", "one input"),
                                       ([{"id": "n", "template": "double"}], 422, None, "doesn't require gradient")):
        r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
            _CUBE_BACKWARD, call_step("sum", ref("x"), out=[f"s{status}"]),
            {"kind": "backward", "tensors": [f"s{status}"], "hooks": hooks}]}))
        expect_error(r, status, code, words)
    assert torch.equal(_grad(wire, sid, "x"), torch.full((4,), 3.0, dtype=torch.float64))  # nothing ran


def test_an_observing_hook_keeps_the_gradient_its_hook_would_see_once_the_step_succeeds(wire: Wire, sid: str):
    x = torch.tensor([0.5, -1.0, 2.0, 3.0], dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True), call_step("mul", ref("x"), ref("x"), out=["y"]),
                  call_step("sum", ref("y"), out=["s"])])
    results = wire.ok(sid, [{"kind": "backward", "tensors": ["s"], "retain_graph": True,
                             "hooks": [{"id": "x", "observe": "ox"}, {"id": "y", "observe": "oy"}]}])
    assert results[0]["observed"] == ["oy", "ox"]  # in the order torch called the hooks: y's gradient first
    assert torch.equal(decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/ox"))["value"]), 2 * x)
    for hooks, status, words in (([{"id": "x", "observe": "ox"}], 409, "ox"),  # an id the session holds
                                 ([{"id": "x", "observe": "o2", "template": "t"}], 400, "one of template and observe"),
                                 ([{"id": "x", "observe": "o3"}, {"id": "x", "template": "nope"}], 404, "nope")):
        r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
            {"kind": "backward", "tensors": ["s"], "retain_graph": True, "hooks": hooks}]}))
        expect_error(r, status, None, words)
        assert wire.get(f"/v1/sessions/{sid}/tensors/o3").status_code == 404  # a refused step keeps none
    assert torch.equal(_grad(wire, sid, "x"), 2 * x)


def test_a_limit_the_observed_gradients_meet_leaves_every_grad_as_it_was():
    # x (32 bytes), y (32), s (8) and x's new grad (32) fit in 120 bytes; y's observed gradient (32) does not
    with httpx.Client(transport=client.InProcessTransport(service_app(max_session_bytes=120)),
                      base_url="http://in-process", headers=PROTOCOL_HEADERS) as http:
        sid = http.post("/v1/sessions").json()["session_id"]
        x = [0.5, -1.0, 2.0, 3.0]
        r = http.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [
            put_step("x", {"dtype": "float64", "shape": [4], "data": x}, True),
            call_step("mul", ref("x"), ref("x"), out=["y"]), call_step("sum", ref("y"), out=["s"])]})
        assert r.status_code == 200, r.text
        r = http.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [
            {"kind": "backward", "tensors": ["s"], "hooks": [{"id": "y", "observe": "oy"}]}]})
        expect_error(r, 413, "too_large", "max_session_bytes=120")
        assert http.get(f"/v1/sessions/{sid}/tensors/x").json()["grad"] is None
        assert http.get(f"/v1/sessions/{sid}/tensors/oy").status_code == 404


def test_a_limit_met_inside_a_nodes_backward_keeps_its_status(wire: Wire, sid: str):
    huge = {"kind": "template", "id": "huge-bw", "inputs": [{"id": "g", "dtype": "float64", "shape": [4]}],
            "steps": [call_step("repeat", ref("g"), [1 << 27], out=["big"])], "outputs": ["big"]}
    wire.ok(sid, [put_step("x", wire.tensor(torch.ones(4, dtype=torch.float64)), True), huge,
                  {**call_step("mul", ref("x"), 2, out=["y"]), "grad_enabled": False},
                  {"kind": "function", "name": "Huge", "backward": "huge-bw", "inputs": ["x"], "outputs": ["y"],
                   "grads": [1]}, call_step("sum", ref("y"), out=["s"])])
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
        {"kind": "backward", "tensors": ["s"]}]}))
    expect_error(r, 413, None, "Huge.backward", "max_tensor_elements")


def test_post_accumulate_ids_are_answered_where_torch_accumulates_and_keep_nothing(wire: Wire, sid: str):
    x = torch.tensor([0.5, -1.0], dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True), put_step("w", wire.tensor(x), True),
                  call_step("mul", ref("x"), ref("w"), out=["y"]), call_step("sum", ref("y"), out=["s"])])
    results = wire.ok(sid, [{"kind": "backward", "tensors": ["s"], "retain_graph": True, "inputs": ["x"],
                             "hooks": [{"id": "x", "observe": "px", "post_accumulate": True},
                                       {"id": "w", "observe": "pw", "post_accumulate": True},
                                       {"id": "x", "observe": "ox"}]}])
    assert results[0]["observed"] == ["ox", "px"]  # w is not filled; x's own hook first
    assert wire.get(f"/v1/sessions/{sid}/tensors/px").status_code == 404  # nothing kept under it
    for step, status, words in (({"kind": "grad", "outputs": ["s"], "inputs": ["x"], "out": ["gx"], "retain_graph": True},
                                 400, "in a backward step"),
                                ({"kind": "backward", "tensors": ["s"], "retain_graph": True}, 422, "non-leaf")):
        hooked = "y" if status == 422 else "x"
        r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
            {**step, "hooks": [{"id": hooked, "observe": "p2", "post_accumulate": True}]}]}))
        expect_error(r, status, None, words)


def test_node_hooks_keep_the_named_nodes_gradients_and_answer_the_nodes_gone(wire: Wire, sid: str):
    x = torch.tensor([0.5, -1.0], dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True),
                  {**call_step("mul", ref("x"), 1, out=["y"]), "grad_enabled": False},
                  {"kind": "function", "name": "Identity", "inputs": ["x"], "outputs": ["y"], "grads": [0],
                   "node": "n1"},
                  call_step("mul", ref("y"), 3, out=["z"]), call_step("sum", ref("z"), out=["s"])])
    results = wire.ok(sid, [{"kind": "backward", "tensors": ["s"], "retain_graph": True, "node_hooks": [
        {"node": "n1", "grads": "outputs", "observe": "e1", "keep": ["k1"]},
        {"node": "n0", "grads": "inputs", "observe": "e0", "keep": ["k0"]}]}])
    assert results[0]["observed"] == ["e1", "k1"] and results[0]["gone"] == ["n0"]
    assert torch.equal(decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/k1"))["value"]),
                       torch.full((2,), 3.0, dtype=torch.float64))
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
        {"kind": "backward", "tensors": ["s"], "retain_graph": True,
         "node_hooks": [{"node": "n1", "grads": "inputs", "observe": "e2", "keep": ["k2", "k3"]}]}]}))
    expect_error(r, 400, None, "keep names 2 ids")
    assert torch.equal(_grad(wire, sid, "x"), torch.full((2,), 3.0, dtype=torch.float64))  # committed once


def test_module_hooks_replace_the_gradients_their_nodes_pass_on(wire: Wire, sid: str):
    """A module call's identity nodes (inputs: x to y; outputs: z to w) and a template that scales the
    gradient the inputs' node passes on by 3."""
    x = torch.tensor([0.5, -1.0], dtype=torch.float64)
    layout = {"dtype": "float64", "shape": [2]}
    wire.ok(sid, [
        put_step("x", wire.tensor(x), True),
        {**call_step("mul", ref("x"), 1, out=["y"]), "grad_enabled": False},
        {"kind": "function", "name": "In", "inputs": ["x"], "outputs": ["y"], "grads": [0], "node": "ni"},
        call_step("mul", ref("y"), 2, out=["z"]),
        {**call_step("mul", ref("z"), 1, out=["w"]), "grad_enabled": False},
        {"kind": "function", "name": "Out", "inputs": ["z"], "outputs": ["w"], "grads": [0], "node": "no"},
        call_step("sum", ref("w"), out=["s"]),
        {"kind": "template", "id": "thrice", "inputs": [{"id": "go", **layout}, {"id": "gi", **layout}],
         "steps": [call_step("mul", ref("gi"), 3, out=["m"])], "outputs": ["m"]}])
    hook = {"outputs_node": "no", "inputs_node": "ni", "template": "thrice", "outputs": [0], "inputs": [2]}
    wire.ok(sid, [{"kind": "backward", "tensors": ["s"], "retain_graph": True, "module_hooks": [hook]}])
    assert torch.equal(_grad(wire, sid, "x"), torch.full((2,), 6.0, dtype=torch.float64))
    for bad, status, words in (({"inputs": [3]}, 400, "must name one of its 3 tensors"),
                               ({"template": "nope"}, 404, "nope")):
        r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": [
            {"kind": "backward", "tensors": ["s"], "retain_graph": True, "module_hooks": [{**hook, **bad}]}]}))
        expect_error(r, status, None, words)
    assert torch.equal(_grad(wire, sid, "x"), torch.full((2,), 6.0, dtype=torch.float64))  # nothing ran


def test_a_client_backward_node_cuts_the_graph_and_a_capture_keeps_its_gradient(wire: Wire, sid: str):
    x = torch.tensor([0.5, -1.0], dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True),
                  {**call_step("mul", ref("x"), 2, out=["y"]), "grad_enabled": False},
                  {"kind": "function", "name": "ReadsValues", "inputs": [], "outputs": ["y"], "grads": [],
                   "node": "c1", "client_backward": True},
                  call_step("mul", ref("y"), 3, out=["z"]), call_step("add", ref("z"), ref("x"), out=["w"]),
                  call_step("sum", ref("w"), out=["s"])])
    results = wire.ok(sid, [{"kind": "backward", "tensors": ["s"], "retain_graph": True,
                             "capture": [{"node": "c1", "output": 0, "out": "g1"}]}])
    assert results[0]["captured"] == [True]
    assert torch.equal(decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/g1"))["value"]),
                       torch.full((2,), 3.0, dtype=torch.float64))
    assert torch.equal(_grad(wire, sid, "x"), torch.ones(2, dtype=torch.float64))  # around the node only: it cuts
    results = wire.ok(sid, [{"kind": "grad", "outputs": ["s"], "inputs": ["x"], "out": ["gx"], "allow_unused": True,
                             "retain_graph": True, "capture": [{"node": "c1", "output": 0, "out": "g2"}]}])
    assert results[0]["captured"] == [True] and results[0]["tensors"][0]["id"] == "gx"
    cases = [
        ([{"kind": "function", "name": "F", "inputs": ["x"], "outputs": ["y2"], "grads": [None], "node": "c2",
           "client_backward": True}], 400, "bad_request", "names its outputs and node only"),
        ([{"kind": "backward", "tensors": ["s"], "retain_graph": True,
           "capture": [{"node": "c9", "output": 0, "out": "g3"}]}], 404, "unknown_tensor", "no graph holds node"),
        ([{"kind": "backward", "tensors": ["s"], "retain_graph": True,
           "capture": [{"node": "c1", "output": 1, "out": "g3"}]}], 400, "bad_request", "has no output 1"),
        ([{"kind": "grad", "outputs": ["s"], "inputs": ["x"], "out": ["g4"], "retain_graph": True,
           "capture": [{"node": "c1", "output": 0, "out": "g3"}]}], 400, "bad_request", "allows unused inputs"),
        ([{"kind": "backward", "tensors": ["s"], "retain_graph": True}], 422, "op_error",
         "ReadsValues.backward runs on the client"),  # its gradient would stop there without a word
    ]
    wire.ok(sid, [{**call_step("mul", ref("x"), 1, out=["y2"]), "grad_enabled": False}])
    for steps, status, code, words in cases:
        expect_error(wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": steps})),
                     status, code, words)
    assert torch.equal(_grad(wire, sid, "x"), torch.ones(2, dtype=torch.float64))  # nothing refused left a trace

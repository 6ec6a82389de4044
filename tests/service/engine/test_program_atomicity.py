"""A program over raw HTTP runs all of its steps or stops at the failing one, leaving what ran
before it; a retried program answers its first answer; limits refuse a program before any
step of it runs. In msgpack and in JSON, on both backends where sessions live.

Every response is checked to be below 500 (``wire.fail_on_5xx``).
"""

from __future__ import annotations

import json

import pytest
import torch

from remote_autograd.proto import decode_tensor

from ...conftest import PROTOCOL_HEADERS, start_server
from ..wire import (BOTH_BACKENDS, JSON, MSGPACK, Wire, assert_untouched, call_step, checked_client, decode,
                   expect_error, new_id, put_step, ref, snapshot)


# -- atomicity ----------------------------------------------------------------------------

FAILING_STEP_2 = {
    "op-refuses": (lambda w: call_step("matmul", ref("p0"), ref("p0"), out=["p2"]), 422, "op_error", "matmul"),
    "unknown-ref": (lambda w: call_step("add", ref("p0"), ref("ghost"), out=["p2"]), 404, "unknown_tensor", "add"),
    "unknown-op": (lambda w: call_step("nope", ref("p0"), out=["p2"]), 404, "unknown_op", "nope"),
    "id-reused": (lambda w: call_step("add", ref("p0"), ref("p1"), out=["p1"]), 409, "conflict", "add"),
    "data-mismatch": (lambda w: put_step("p2", {"dtype": "float32", "shape": [5], "data": [1.0]}), 400, "bad_request", "put"),
    "backward-of-nothing": (lambda w: {"kind": "backward", "tensors": ["p1"]}, 422, "op_error", "backward"),
}


@BOTH_BACKENDS
@pytest.mark.parametrize("case", list(FAILING_STEP_2), ids=list(FAILING_STEP_2))
def test_program_stops_at_the_failing_step(wire: Wire, held: dict, case: str):
    sid = held["sid"]
    make, status, code, op = FAILING_STEP_2[case]
    steps = [
        put_step("p0", wire.tensor(torch.ones(2, 3))),
        call_step("add", ref("p0"), ref("p0"), out=["p1"]),
        make(wire),
        put_step("p3", wire.tensor(torch.ones(1))),
        call_step("add", ref("p0"), ref("p0"), out=["p4"]),
    ]
    st, body = wire.program(sid, steps)
    assert st == status, body
    assert body["error"]["code"] == code and body["error"]["step"] == 2 and body["error"]["op"] == op
    assert body["results"] == [
        {"tensors": [{"id": "p0", "dtype": "float32", "shape": [2, 3], "requires_grad": False}]},
        {"tensors": [{"id": "p1", "dtype": "float32", "shape": [2, 3], "requires_grad": False}]},
    ]
    for tid in ("p0", "p1"):
        assert wire.get(f"/v1/sessions/{sid}/tensors/{tid}").status_code == 200
    for tid in ("p2", "p3", "p4"):
        r = wire.get(f"/v1/sessions/{sid}/tensors/{tid}")
        assert r.status_code == 404 and decode(r)["error"]["code"] == "unknown_tensor"
    assert torch.equal(decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/p1"))["value"]),
                       torch.full((2, 3), 2.0))
    # the tensors held before the program are as they were
    snap = snapshot(wire, sid)
    assert {k: v for k, v in snap.items() if k != "info"} == {
        k: v for k, v in held["snapshot"].items() if k != "info"}


@BOTH_BACKENDS
def test_a_limit_refuses_the_whole_program_before_running_it(wire: Wire, held: dict):
    # Limits are checked before anything else about a body: nothing of the program runs.
    sid = held["sid"]
    steps = [put_step("p0", wire.tensor(torch.ones(2, 3))),
             put_step("p2", {"dtype": "float32", "shape": [10**12], "data": [1.0]})]
    st, body = wire.program(sid, steps)
    assert st == 413 and body["error"]["code"] == "too_large" and body["error"]["step"] == 1
    assert "max_tensor_elements" in body["error"]["message"] and body["results"] == []
    assert wire.get(f"/v1/sessions/{sid}/tensors/p0").status_code == 404


@BOTH_BACKENDS
def test_failing_backward_leaves_grads_untouched(wire: Wire, held: dict):
    sid = held["sid"]
    # a grad_tensors of the wrong shape fails inside autograd, after the graph was walked
    wire.ok(sid, [put_step("gwrong", wire.tensor(torch.ones(5)))])
    held["snapshot"] = snapshot(wire, sid)
    st, body = wire.program(sid, [{"kind": "backward", "tensors": ["c"], "grad_tensors": [ref("gwrong")],
                                   "retain_graph": True}])
    assert st == 422 and body["error"]["op"] == "backward"
    assert_untouched(wire, held)


@BOTH_BACKENDS
def test_failing_inplace_leaves_the_target_untouched(wire: Wire, held: dict):
    sid = held["sid"]
    st, body = wire.program(sid, [call_step("add_", ref("b"), ref("a"))])  # [3,2] += [2,3]: no broadcast
    assert st == 422 and body["error"]["op"] == "add_"
    assert_untouched(wire, held)


# -- idempotency --------------------------------------------------------------------------


@BOTH_BACKENDS
def test_retried_program_answers_the_first_answer(wire: Wire, sid: str):
    pid = new_id()
    body = wire.encode({"id": pid, "steps": [
        put_step("once", wire.tensor(torch.tensor([1.0, 2.0])), True),
        call_step("mul", ref("once"), ref("once"), out=["sq"]),
        {"kind": "fetch", "id": "sq"},
    ]})
    path = f"/v1/sessions/{sid}/programs"
    first = wire.post_raw(path, body)
    assert first.status_code == 200
    second = wire.post_raw(path, body)
    assert second.status_code == 200 and second.content == first.content  # not a 409 for "once": it ran once
    assert decode(wire.get(f"/v1/sessions/{sid}"))["tensors"] == 2
    # the same id with another body is a conflict, and nothing of it runs
    other = wire.encode({"id": pid, "steps": [put_step("twice", wire.tensor(torch.ones(1)))]})
    body409 = expect_error(wire.post_raw(path, other), 409, "conflict", pid)
    assert body409["error"]["step"] is None
    assert wire.get(f"/v1/sessions/{sid}/tensors/twice").status_code == 404
    # and the original answer is still remembered
    assert wire.post_raw(path, body).content == first.content


@BOTH_BACKENDS
def test_retried_failing_program_answers_the_same_error(wire: Wire, sid: str):
    pid = new_id()
    body = wire.encode({"id": pid, "steps": [
        put_step("r0", wire.tensor(torch.ones(2))),
        call_step("matmul", ref("r0"), ref("r0"), out=["r1"]),  # 1-d @ 1-d is fine: a dot product
        call_step("nope", ref("r0"), out=["r2"]),
    ]})
    path = f"/v1/sessions/{sid}/programs"
    first = wire.post_raw(path, body)
    second = wire.post_raw(path, body)
    assert first.status_code == second.status_code == 404
    assert first.content == second.content
    assert decode(first)["error"]["step"] == 2


@BOTH_BACKENDS
def test_retry_with_another_accept_is_answered_in_that_format(server_url: str):
    with checked_client(server_url, headers=PROTOCOL_HEADERS) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        w = Wire(c, "msgpack")
        body = w.encode({"id": "p", "steps": [put_step("x", w.tensor(torch.ones(2))), {"kind": "fetch", "id": "x"}]})
        path = f"/v1/sessions/{sid}/programs"
        assert w.post_raw(path, body).status_code == 200
        r = c.post(path, content=body, headers={"Content-Type": MSGPACK, "Accept": JSON})
        assert r.status_code == 200
        assert torch.equal(decode_tensor(r.json()["results"][1]["tensor"]["value"]), torch.ones(2))


# -- limits (a server of its own) ---------------------------------------------------------


def test_limits_are_413_naming_the_limit():
    with start_server(REMOTE_AUTOGRAD_MAX_BODY_BYTES="2000", REMOTE_AUTOGRAD_MAX_STEPS_PER_PROGRAM="3",
                      REMOTE_AUTOGRAD_MAX_TENSORS_PER_SESSION="2", REMOTE_AUTOGRAD_MAX_TENSOR_ELEMENTS="100") as url:
        with checked_client(url, headers=PROTOCOL_HEADERS) as c:
            created = c.post("/v1/sessions").json()
            assert created["limits"]["max_body_bytes"] == 2000 and created["limits"]["max_steps_per_program"] == 3
            sid = created["session_id"]
            path = f"/v1/sessions/{sid}/programs"
            w = Wire(c, "json")
            big = {"id": "big", "steps": [put_step("z", {"dtype": "uint8", "shape": [3000], "data": "A" * 4000})]}
            expect_error(c.post(path, json=big), 413, "too_large", "max_body_bytes")
            # also when the body comes without a Content-Length (chunked)
            r = c.post(path, content=iter([json.dumps(big).encode()[:1000]] * 3), headers={"Content-Type": JSON})
            expect_error(r, 413, "too_large", "max_body_bytes")
            assert c.get(f"/v1/sessions/{sid}").json()["tensors"] == 0
            many = {"id": "many", "steps": [{"kind": "free", "ids": []}] * 4}
            expect_error(c.post(path, json=many), 413, "too_large", "max_steps_per_program")
            st, body = w.program(sid, [put_step("e", {"dtype": "uint8", "shape": [101], "data": "!"})])
            assert st == 413 and "max_tensor_elements=100" in body["error"]["message"]
            st, body = w.program(sid, [put_step(f"t{i}", w.tensor(torch.ones(1))) for i in range(3)])
            assert st == 413 and body["error"]["step"] == 2 and "max_tensors_per_session" in body["error"]["message"]
            assert len(body["results"]) == 2

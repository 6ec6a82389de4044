"""Integration tests over raw HTTP against a real server, in msgpack and in JSON: the happy
path, and bad input (each bad request leaves the session's tensors untouched, byte for byte).

Every response any test here receives is checked to be below 500 (``wire.fail_on_5xx``), so
a 5xx fails the test that provoked it. Helpers in ``wire.py``, fixtures in ``conftest.py``.
"""

from __future__ import annotations

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import decode_tensor
from remote_autograd.proto.messages import Health

from ..wire import (BOTH_BACKENDS, JSON, MSGPACK, Wire, assert_untouched, call_step, checked_client, decode,
                   expect_error, new_id, put_step, ref)


# -- the happy path -----------------------------------------------------------------------


@BOTH_BACKENDS
def test_create_run_fetch_delete(wire: Wire):
    r = wire.c.post("/v1/sessions", headers={"Accept": wire.ct})
    assert r.status_code == 201
    created = decode(r)
    assert created["protocol"] == "1" and created["session_id"] and created["device"] and created["server_version"]
    limits = created["limits"]
    assert set(limits) >= {"max_body_bytes", "max_steps_per_program", "max_tensor_elements",
                           "max_tensors_per_session", "max_session_bytes", "session_ttl_seconds",
                           "max_total_bytes", "max_sessions", "max_concurrent_programs"}
    assert all(isinstance(v, (int, float)) and v > 0 for v in limits.values())
    sid = created["session_id"]

    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, generator=g, dtype=torch.float64)
    b = torch.randn(4, 2, generator=g, dtype=torch.float64)
    res = wire.ok(sid, [put_step("a", wire.tensor(a), True), put_step("b", wire.tensor(b), True)])
    assert res[0] == {"tensors": [{"id": "a", "dtype": "float64", "shape": [3, 4], "requires_grad": True}]}
    res = wire.ok(sid, [
        call_step("matmul", ref("a"), ref("b"), out=["c"]),
        call_step("sum", ref("c"), out=["loss"]),
        {"kind": "backward", "tensors": ["loss"]},
        {"kind": "fetch", "id": "a"},
        {"kind": "fetch", "id": "b", "value": False},
        {"kind": "fetch", "id": "loss"},
    ])
    assert res[0]["tensors"][0]["shape"] == [3, 2] and res[1]["tensors"][0]["shape"] == []
    assert res[2] == {"tensors": []}

    al, bl = a.clone().requires_grad_(), b.clone().requires_grad_()
    loss = (al @ bl).sum()
    loss.backward()
    fa, fb, fl = res[3]["tensor"], res[4]["tensor"], res[5]["tensor"]
    if wire.fmt == "msgpack":
        assert isinstance(fa["value"]["data"], bytes)
    assert torch.equal(decode_tensor(fa["value"]), a)
    torch.testing.assert_close(decode_tensor(fa["grad"]), al.grad)
    assert fb["value"] is None and fb["requires_grad"] is True
    torch.testing.assert_close(decode_tensor(fb["grad"]), bl.grad)
    torch.testing.assert_close(decode_tensor(fl["value"]), loss.detach())
    assert fl["grad"] is None  # a non-leaf without retain_grad: None, not zeros

    info = decode(wire.get(f"/v1/sessions/{sid}"))
    assert info["session_id"] == sid and info["tensors"] == 4
    r = wire.c.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 204 and r.content == b""
    for r in (wire.get(f"/v1/sessions/{sid}"), wire.c.delete(f"/v1/sessions/{sid}"),
              wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": "x", "steps": []})),
              wire.get(f"/v1/sessions/{sid}/tensors/a")):
        assert r.status_code == 404, r.text
        assert decode(r)["error"]["code"] == "unknown_session"


def test_ops_listing(api, bare):
    r = api.get("/v1/ops")
    assert r.status_code == 200
    ops = r.json()["ops"]
    by_name = {o["name"]: o for o in ops}
    assert {"matmul", "sum", "mul", "add"} <= set(by_name)
    for o in ops:
        assert {"name", "signature", "torch_names", "exact", "double_grad"} <= set(o)
        assert isinstance(o["signature"], str) and o["signature"].startswith(o["name"] + "(")
        assert isinstance(o["torch_names"], list) and all(isinstance(n, str) for n in o["torch_names"])
        assert isinstance(o["exact"], bool) and isinstance(o["double_grad"], bool)
        assert not (o["double_grad"] and not o["exact"])  # double_grad implies an exact gradient
    assert "torch.matmul" in by_name["matmul"]["torch_names"]
    r = api.get("/v1/ops", headers={"Accept": MSGPACK})
    assert msgpack.unpackb(r.content)["ops"] == ops
    r = bare.get("/v1/ops")
    assert r.status_code == 400 and r.json()["error"]["code"] == "protocol_mismatch"


def test_health_routes_need_no_header(bare):
    r = bare.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok" and body["protocol"] == "1" and body["device"]
    assert Health.model_validate(body).cuda_graphs == "off"  # the answer is the schema SPEC §13 documents
    r = bare.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"


@BOTH_BACKENDS
def test_read_tensor_route(wire: Wire, sid: str):
    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    wire.ok(sid, [
        put_step("x", wire.tensor(x), True),
        put_step("k", wire.tensor(torch.tensor([2**60, -3]))),
        call_step("mul", ref("x"), ref("x"), out=["y"]),
        call_step("sum", ref("y"), out=["s"]),
        {"kind": "backward", "tensors": ["s"]},
    ])
    r = wire.get(f"/v1/sessions/{sid}/tensors/x")
    assert r.status_code == 200 and r.headers["content-type"].startswith(wire.ct)
    m = decode(r)
    assert m["id"] == "x" and m["requires_grad"] is True
    assert torch.equal(decode_tensor(m["value"]), x)
    assert torch.equal(decode_tensor(m["grad"]), 2 * x)
    m = decode(wire.get(f"/v1/sessions/{sid}/tensors/x", params={"grad": "false"}))
    assert m["grad"] is None and torch.equal(decode_tensor(m["value"]), x)
    m = decode(wire.get(f"/v1/sessions/{sid}/tensors/x", params={"value": "false"}))
    assert m["value"] is None and torch.equal(decode_tensor(m["grad"]), 2 * x)
    m = decode(wire.get(f"/v1/sessions/{sid}/tensors/x", params={"value": "0", "grad": "0"}))
    assert m == {"id": "x", "value": None, "grad": None, "requires_grad": True}
    m = decode(wire.get(f"/v1/sessions/{sid}/tensors/k"))
    assert m["grad"] is None and m["requires_grad"] is False
    assert torch.equal(decode_tensor(m["value"]), torch.tensor([2**60, -3]))
    if wire.fmt == "json":
        assert isinstance(m["value"]["data"], str)  # beyond 2**53: base64
    r = wire.get(f"/v1/sessions/{sid}/tensors/nope")
    assert r.status_code == 404
    err = decode(r)["error"]
    assert err["code"] == "unknown_tensor" and "nope" in err["message"]


# -- bad input ----------------------------------------------------------------------------


def _program_case(steps_fn, status, code, *words, step=0, op=None):
    def run(wire: Wire, sid: str) -> httpx.Response:
        body = {"id": new_id(), "steps": steps_fn(wire)}
        return wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode(body))

    run.expect = (status, code, words, step, op)
    return run


def _raw_case(body: bytes | None, status, code, *words, content_type=None):
    def run(wire: Wire, sid: str) -> httpx.Response:
        return wire.post_raw(f"/v1/sessions/{sid}/programs", body if body is not None else b"",
                             **({"Content-Type": content_type} if content_type else {}))

    run.expect = (status, code, words, None, None)
    return run


F32 = {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}

BAD_PROGRAMS = {
    "malformed-msgpack": _raw_case(b"\xc1\x92", 400, "bad_request", "malformed msgpack", content_type=MSGPACK),
    "truncated-msgpack": _raw_case(msgpack.packb({"id": "p", "steps": []})[:-3], 400, "bad_request", "msgpack",
                                   content_type=MSGPACK),
    "malformed-json": _raw_case(b'{"id": "p", "steps": [', 400, "bad_request", "malformed JSON", content_type=JSON),
    "deep-json": _raw_case(b"[" * 200_000, 400, "bad_request", "JSON", content_type=JSON),
    "not-utf8-json": _raw_case(b'{"id": "\xff"}', 400, "bad_request", "JSON", content_type=JSON),
    "empty-body": _raw_case(b"", 400, "bad_request", "body", content_type=JSON),
    "wrong-content-type": _raw_case(b"{}", 400, "bad_request", "Content-Type", content_type="text/plain"),
    "not-an-object": _raw_case(b"[1, 2]", 400, "bad_request", "body", content_type=JSON),
    "unknown-step-kind": _program_case(lambda w: [{"kind": "launch"}], 400, "bad_request", "steps.0", "launch",
                                       step=None),
    "unknown-key": _program_case(lambda w: [{"kind": "fetch", "id": "a", "colour": 1}], 400, "bad_request",
                                 "steps.0.fetch.colour", step=None),
    "unknown-dtype": _program_case(lambda w: [put_step("z", {**F32, "dtype": "float8"})], 400, "bad_request",
                                   "steps.0.put.value.dtype", step=None),
    "negative-dim": _program_case(lambda w: [put_step("z", {**F32, "shape": [2, -1]})], 400, "bad_request",
                                  "steps.0.put.value.shape.1", step=None),
    "bytes-length-mismatch": _program_case(
        lambda w: [put_step("z", {"dtype": "float32", "shape": [3], "data": b"\0" * 8 if w.fmt == "msgpack" else "AAAAAAAAAAA="})],
        400, "bad_request", "value.data", "8 bytes", "12", op="put"),
    "list-length-mismatch": _program_case(lambda w: [put_step("z", {**F32, "shape": [3]})], 400, "bad_request",
                                          "value.data", "2 values", op="put"),
    "string-in-list": _program_case(lambda w: [put_step("z", {**F32, "data": [1.0, "2"]})], 400, "bad_request",
                                    "value.data.1", op="put"),
    "invalid-base64": _program_case(lambda w: [put_step("z", {**F32, "data": "!!not base64!!"})], 400, "bad_request",
                                    "value.data", "base64", op="put"),
    "bfloat16-as-list": _program_case(lambda w: [put_step("z", {**F32, "dtype": "bfloat16"})], 400, "bad_request",
                                      "value.data", "bfloat16", "base64", op="put"),
    "grad-shape-mismatch": _program_case(
        lambda w: [{**put_step("z", F32, True), "grad": {**F32, "shape": [1], "data": [1.0]}}], 400, "bad_request",
        "grad", op="put"),
    "unknown-op": _program_case(lambda w: [call_step("frobnicate", ref("a"), out=["z"])], 404, "unknown_op",
                                "frobnicate", op="frobnicate"),
    "unknown-inplace-op": _program_case(lambda w: [call_step("frobnicate_", ref("a"))], 404, "unknown_op",
                                        "frobnicate_", op="frobnicate_"),
    "unknown-tensor-ref": _program_case(lambda w: [call_step("add", ref("a"), ref("ghost"), out=["z"])], 404,
                                        "unknown_tensor", "ghost", op="add"),
    "unknown-tensor-fetch": _program_case(lambda w: [{"kind": "fetch", "id": "ghost"}], 404, "unknown_tensor",
                                          "ghost", op="fetch"),
    "unknown-tensor-backward": _program_case(lambda w: [{"kind": "backward", "tensors": ["ghost"]}], 404,
                                             "unknown_tensor", "ghost", op="backward"),
    "matmul-shape-mismatch": _program_case(lambda w: [call_step("matmul", ref("a"), ref("a"), out=["z"])], 422,
                                           "op_error", op="matmul"),
    "int-requires-grad": _program_case(lambda w: [put_step("z", w.tensor(torch.tensor([1, 2])), True)], 422,
                                       "op_error", op="put"),
    "grad-of-none": _program_case(lambda w: [call_step("add", ref("b"), {"grad_of": "b"}, out=["z"])], 422,
                                  "op_error", "b", op="add"),
    "inplace-on-leaf-requiring-grad": _program_case(lambda w: [call_step("mul_", ref("a"), ref("a"))], 422,
                                                    "op_error", "leaf", op="mul_"),
    "out-count-mismatch": _program_case(lambda w: [call_step("add", ref("a"), ref("a"), out=["z1", "z2"])], 422,
                                        "op_error", op="add"),
    "backward-non-scalar": _program_case(lambda w: [{"kind": "backward", "tensors": ["a"]}], 422, "op_error",
                                         op="backward"),
    "unknown-argument-object": _program_case(lambda w: [call_step("add", ref("a"), {"tensor": "a"}, out=["z"])], 400,
                                             "bad_request", "argument", op="add"),
    "id-reused": _program_case(lambda w: [put_step("a", F32)], 409, "conflict", "'a'", op="put"),
    "out-id-reused": _program_case(lambda w: [call_step("add", ref("a"), ref("a"), out=["b"])], 409, "conflict", "'b'",
                                   op="add"),
    "claimed-shape-too-large": _program_case(
        lambda w: [put_step("z", {"dtype": "float32", "shape": [10**12],
                              "data": b"\0" * 16 if w.fmt == "msgpack" else "A" * 24})],
        413, "too_large", "max_tensor_elements", op="put"),
    "claimed-shape-too-large-bad-data": _program_case(
        lambda w: [put_step("z", {"dtype": "float32", "shape": [10**6, 10**6], "data": "!!"})],
        413, "too_large", "max_tensor_elements", op="put"),
}


@BOTH_BACKENDS
@pytest.mark.parametrize("case", list(BAD_PROGRAMS), ids=list(BAD_PROGRAMS))
def test_bad_program(wire: Wire, held: dict, case: str):
    run = BAD_PROGRAMS[case]
    status, code, words, step, op = run.expect
    body = expect_error(run(wire, held["sid"]), status, code, *words)
    assert body["error"]["step"] == step
    assert body["error"]["op"] == op
    assert body["results"] == []
    assert_untouched(wire, held)


@BOTH_BACKENDS
def test_unknown_session(wire: Wire, held: dict):
    for r in (
        wire.post_raw("/v1/sessions/not-a-session/programs", wire.encode({"id": "p", "steps": []})),
        wire.get("/v1/sessions/not-a-session"),
        wire.get("/v1/sessions/not-a-session/tensors/a"),
        wire.c.delete("/v1/sessions/not-a-session"),
    ):
        expect_error(r, 404, "unknown_session", "not-a-session")
    assert_untouched(wire, held)


@BOTH_BACKENDS
def test_another_sessions_tensor_is_unknown(wire: Wire, held: dict):
    other = wire.session()
    try:
        wire.ok(other, [put_step("theirs", wire.tensor(torch.ones(2)))])
        status, body = wire.program(held["sid"], [call_step("add", ref("a"), ref("theirs"), out=["z"])])
        assert status == 404 and body["error"]["code"] == "unknown_tensor" and "theirs" in body["error"]["message"]
        r = wire.get(f"/v1/sessions/{held['sid']}/tensors/theirs")
        expect_error(r, 404, "unknown_tensor", "theirs")
        # and the same ids in two sessions are two tensors
        wire.ok(other, [put_step("a", wire.tensor(torch.zeros(1)))])
        assert_untouched(wire, held)
    finally:
        wire.c.delete(f"/v1/sessions/{other}")


# what each refusal says to do: a missing header is a first curl's, a whole number another version's
_HEADER_ADVICE = {None: "add the header `Remote-Autograd-Protocol: 1` to every request under /v1",
                  "": "add the header `Remote-Autograd-Protocol: 1`", "2": "upgrade the older side",
                  "1.0": "send `Remote-Autograd-Protocol: 1`", "one": "send `Remote-Autograd-Protocol: 1`"}


@pytest.mark.parametrize("header", list(_HEADER_ADVICE))
def test_protocol_header_missing_or_wrong(server_url: str, wire: Wire, held: dict, header):
    headers = {"Accept": JSON} if header is None else {"Accept": JSON, "Remote-Autograd-Protocol": header}
    with checked_client(server_url, headers=headers) as c:
        responses = [
            c.post("/v1/sessions"),
            c.post(f"/v1/sessions/{held['sid']}/programs", json={"id": "p", "steps": [{"kind": "free", "ids": ["a"]}]}),
            c.get(f"/v1/sessions/{held['sid']}/tensors/a"),
            c.delete(f"/v1/sessions/{held['sid']}"),
            c.get("/v1/ops"),
        ]
    for r in responses:
        body = expect_error(r, 400, "protocol_mismatch", "Remote-Autograd-Protocol", "server speaks 1")
        sent = "(none)" if not header else header
        assert f"client sent Remote-Autograd-Protocol: {sent}," in body["error"]["message"]
        assert _HEADER_ADVICE[header] in body["error"]["message"], body["error"]["message"]
    assert_untouched(wire, held)


@pytest.mark.parametrize("path, status", [("/tensors/a?grad=maybe", 400), ("/nonsense", 404),
                                          ("/programs", 405)])  # a GET on the raw program route: the router's 405
def test_framework_errors_use_the_error_body(wire: Wire, held: dict, path: str, status: int):
    r = wire.get(f"/v1/sessions/{held['sid']}{path}")
    expect_error(r, status, None)



def test_zero_element_shape_with_a_huge_dim(wire: Wire, held: dict):
    r = wire.post_raw(f"/v1/sessions/{held['sid']}/programs", wire.encode({"id": new_id(), "steps": [
        put_step("z", {"dtype": "float32", "shape": [0, 10**19], "data": b"" if wire.fmt == "msgpack" else ""})]}))
    expect_error(r, 400, "bad_request", "shape")
    assert_untouched(wire, held)

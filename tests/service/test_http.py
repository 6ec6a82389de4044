"""Integration tests over raw HTTP against a real server, in msgpack and in JSON.

Every response any test here receives is checked to be below 500 (an httpx response
hook), so a 5xx fails the test that provoked it.
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import decode_tensor, encode_tensor

from ..conftest import PROTOCOL_HEADERS, start_server

SPEC = Path(__file__).resolve().parents[2] / "proto" / "SPEC.md"
MSGPACK = "application/msgpack"
JSON = "application/json"
FORMATS = ["msgpack", "json"]


# -- plumbing -----------------------------------------------------------------------------


def _no_5xx(response: httpx.Response) -> None:
    if response.status_code >= 500:
        response.read()
        raise AssertionError(
            f"{response.request.method} {response.request.url} answered {response.status_code}: {response.text[:2000]}"
        )


# The tests of programs, errors and retries: they do not depend on where sessions live, so
# they also run against a front on the Ray backend (conftest: the backends marker).
BOTH_BACKENDS = pytest.mark.backends("inprocess", "ray")


def _client(url: str, **kw) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, event_hooks={"response": [_no_5xx]}, **kw)


@pytest.fixture
def api(http: httpx.Client) -> httpx.Client:
    """The shared ``http`` client, with the no-5xx check on every response."""
    http.event_hooks["response"].append(_no_5xx)
    return http


@pytest.fixture
def bare(server_url: str) -> Iterator[httpx.Client]:
    """A client without the protocol header."""
    with _client(server_url) as c:
        yield c


def _decode(r: httpx.Response) -> Any:
    if not r.content:
        return None
    if r.headers.get("content-type", "").startswith(MSGPACK):
        return msgpack.unpackb(r.content, raw=False)
    return r.json()


class Wire:
    """One body format: encodes requests, decodes answers."""

    def __init__(self, client: httpx.Client, fmt: str) -> None:
        self.c, self.fmt = client, fmt
        self.ct = MSGPACK if fmt == "msgpack" else JSON

    @property
    def headers(self) -> dict:
        return {"Content-Type": self.ct, "Accept": self.ct}

    def encode(self, obj: Any) -> bytes:
        if self.fmt == "msgpack":
            return msgpack.packb(obj, use_bin_type=True)
        return json.dumps(obj).encode()

    def tensor(self, t: torch.Tensor) -> dict:
        return encode_tensor(t, as_json=self.fmt == "json")

    def post_raw(self, path: str, body: bytes, **headers) -> httpx.Response:
        r = self.c.post(path, content=body, headers={**self.headers, **headers})
        if r.content:
            assert r.headers["content-type"].startswith(self.ct), r.headers
        return r

    def program(self, sid: str, steps: list, pid: str | None = None) -> tuple[int, dict]:
        r = self.post_raw(f"/v1/sessions/{sid}/programs", self.encode({"id": pid or _uid(), "steps": steps}))
        return r.status_code, _decode(r)

    def ok(self, sid: str, steps: list) -> list:
        status, body = self.program(sid, steps)
        assert status == 200, body
        assert "error" not in body
        assert len(body["results"]) == len(steps)
        return body["results"]

    def session(self) -> str:
        r = self.c.post("/v1/sessions", headers={"Accept": self.ct})
        assert r.status_code == 201, r.text
        return _decode(r)["session_id"]

    def get(self, path: str, **kw) -> httpx.Response:
        return self.c.get(path, headers={"Accept": self.ct}, **kw)


def _uid() -> str:
    return uuid.uuid4().hex


def _put(tid: str, wire_value: dict, requires_grad: bool = False) -> dict:
    return {"kind": "put", "id": tid, "value": wire_value, "requires_grad": requires_grad}


def _call(op: str, *args, out=(), **kwargs) -> dict:
    return {"kind": "call", "op": op, "args": list(args), "kwargs": kwargs, "out": list(out)}


def ref(tid: str) -> dict:
    return {"ref": tid}


@pytest.fixture(params=FORMATS)
def wire(request, api) -> Wire:
    return Wire(api, request.param)


@pytest.fixture
def sid(wire: Wire) -> Iterator[str]:
    s = wire.session()
    yield s
    wire.c.delete(f"/v1/sessions/{s}")


# -- the happy path -----------------------------------------------------------------------


@BOTH_BACKENDS
def test_create_run_fetch_delete(wire: Wire):
    r = wire.c.post("/v1/sessions", headers={"Accept": wire.ct})
    assert r.status_code == 201
    created = _decode(r)
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
    res = wire.ok(sid, [_put("a", wire.tensor(a), True), _put("b", wire.tensor(b), True)])
    assert res[0] == {"tensors": [{"id": "a", "dtype": "float64", "shape": [3, 4], "requires_grad": True}]}
    res = wire.ok(sid, [
        _call("matmul", ref("a"), ref("b"), out=["c"]),
        _call("sum", ref("c"), out=["loss"]),
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

    info = _decode(wire.get(f"/v1/sessions/{sid}"))
    assert info["session_id"] == sid and info["tensors"] == 4
    r = wire.c.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 204 and r.content == b""
    for r in (wire.get(f"/v1/sessions/{sid}"), wire.c.delete(f"/v1/sessions/{sid}"),
              wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": "x", "steps": []})),
              wire.get(f"/v1/sessions/{sid}/tensors/a")):
        assert r.status_code == 404, r.text
        assert _decode(r)["error"]["code"] == "unknown_session"


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
    r = bare.get("/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"


@BOTH_BACKENDS
def test_read_tensor_route(wire: Wire, sid: str):
    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    wire.ok(sid, [
        _put("x", wire.tensor(x), True),
        _put("k", wire.tensor(torch.tensor([2**60, -3]))),
        _call("mul", ref("x"), ref("x"), out=["y"]),
        _call("sum", ref("y"), out=["s"]),
        {"kind": "backward", "tensors": ["s"]},
    ])
    r = wire.get(f"/v1/sessions/{sid}/tensors/x")
    assert r.status_code == 200 and r.headers["content-type"].startswith(wire.ct)
    m = _decode(r)
    assert m["id"] == "x" and m["requires_grad"] is True
    assert torch.equal(decode_tensor(m["value"]), x)
    assert torch.equal(decode_tensor(m["grad"]), 2 * x)
    m = _decode(wire.get(f"/v1/sessions/{sid}/tensors/x", params={"grad": "false"}))
    assert m["grad"] is None and torch.equal(decode_tensor(m["value"]), x)
    m = _decode(wire.get(f"/v1/sessions/{sid}/tensors/x", params={"value": "false"}))
    assert m["value"] is None and torch.equal(decode_tensor(m["grad"]), 2 * x)
    m = _decode(wire.get(f"/v1/sessions/{sid}/tensors/x", params={"value": "0", "grad": "0"}))
    assert m == {"id": "x", "value": None, "grad": None, "requires_grad": True}
    m = _decode(wire.get(f"/v1/sessions/{sid}/tensors/k"))
    assert m["grad"] is None and m["requires_grad"] is False
    assert torch.equal(decode_tensor(m["value"]), torch.tensor([2**60, -3]))
    if wire.fmt == "json":
        assert isinstance(m["value"]["data"], str)  # beyond 2**53: base64
    r = wire.get(f"/v1/sessions/{sid}/tensors/nope")
    assert r.status_code == 404
    err = _decode(r)["error"]
    assert err["code"] == "unknown_tensor" and "nope" in err["message"]


# -- bad input ----------------------------------------------------------------------------


@pytest.fixture
def held(wire: Wire, sid: str) -> dict:
    """Tensors the session holds before the bad request, with the exact bytes they read back as."""
    wire.ok(sid, [
        _put("a", wire.tensor(torch.tensor([[1.5, -2.0, 3.0], [0.25, 5.0, -6.0]])), True),
        _put("b", wire.tensor(torch.arange(6, dtype=torch.float32).reshape(3, 2))),
        _put("n", wire.tensor(torch.tensor([2**62, -1, 7]))),
        _put("h", wire.tensor(torch.tensor([1.0, float("nan"), -0.0], dtype=torch.bfloat16))),
        _call("matmul", ref("a"), ref("b"), out=["c"]),
        _call("sum", ref("c"), out=["loss"]),
        {"kind": "backward", "tensors": ["loss"]},
    ])
    return {"sid": sid, "snapshot": _snapshot(wire, sid)}


def _snapshot(wire: Wire, sid: str) -> dict:
    snap = {}
    for tid in ("a", "b", "n", "h", "c", "loss"):
        for ct in (MSGPACK, JSON):
            r = wire.c.get(f"/v1/sessions/{sid}/tensors/{tid}", headers={"Accept": ct})
            assert r.status_code == 200
            snap[tid, ct] = r.content
    snap["info"] = wire.get(f"/v1/sessions/{sid}").content
    return snap


def _assert_untouched(wire: Wire, held: dict) -> None:
    assert _snapshot(wire, held["sid"]) == held["snapshot"]
    assert wire.c.get("/healthz").json()["status"] == "ok"


def _error(r: httpx.Response, status: int, code: str | None, *words: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = _decode(r)
    err = body["error"]
    assert set(err) == {"code", "message", "step", "op"}
    if code is not None:
        assert err["code"] == code, err
    for w in words:
        assert w.lower() in err["message"].lower(), (w, err["message"])
    return body


def _program_case(steps_fn, status, code, *words, step=0, op=None):
    def run(wire: Wire, sid: str) -> httpx.Response:
        body = {"id": _uid(), "steps": steps_fn(wire)}
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
    "unknown-dtype": _program_case(lambda w: [_put("z", {**F32, "dtype": "float8"})], 400, "bad_request",
                                   "steps.0.put.value.dtype", step=None),
    "negative-dim": _program_case(lambda w: [_put("z", {**F32, "shape": [2, -1]})], 400, "bad_request",
                                  "steps.0.put.value.shape.1", step=None),
    "bytes-length-mismatch": _program_case(
        lambda w: [_put("z", {"dtype": "float32", "shape": [3], "data": b"\0" * 8 if w.fmt == "msgpack" else "AAAAAAAAAAA="})],
        400, "bad_request", "value.data", "8 bytes", "12", op="put"),
    "list-length-mismatch": _program_case(lambda w: [_put("z", {**F32, "shape": [3]})], 400, "bad_request",
                                          "value.data", "2 values", op="put"),
    "string-in-list": _program_case(lambda w: [_put("z", {**F32, "data": [1.0, "2"]})], 400, "bad_request",
                                    "value.data.1", op="put"),
    "invalid-base64": _program_case(lambda w: [_put("z", {**F32, "data": "!!not base64!!"})], 400, "bad_request",
                                    "value.data", "base64", op="put"),
    "bfloat16-as-list": _program_case(lambda w: [_put("z", {**F32, "dtype": "bfloat16"})], 400, "bad_request",
                                      "value.data", "bfloat16", "base64", op="put"),
    "grad-shape-mismatch": _program_case(
        lambda w: [{**_put("z", F32, True), "grad": {**F32, "shape": [1], "data": [1.0]}}], 400, "bad_request",
        "grad", op="put"),
    "unknown-op": _program_case(lambda w: [_call("frobnicate", ref("a"), out=["z"])], 404, "unknown_op",
                                "frobnicate", op="frobnicate"),
    "unknown-inplace-op": _program_case(lambda w: [_call("frobnicate_", ref("a"))], 404, "unknown_op",
                                        "frobnicate_", op="frobnicate_"),
    "unknown-tensor-ref": _program_case(lambda w: [_call("add", ref("a"), ref("ghost"), out=["z"])], 404,
                                        "unknown_tensor", "ghost", op="add"),
    "unknown-tensor-fetch": _program_case(lambda w: [{"kind": "fetch", "id": "ghost"}], 404, "unknown_tensor",
                                          "ghost", op="fetch"),
    "unknown-tensor-backward": _program_case(lambda w: [{"kind": "backward", "tensors": ["ghost"]}], 404,
                                             "unknown_tensor", "ghost", op="backward"),
    "matmul-shape-mismatch": _program_case(lambda w: [_call("matmul", ref("a"), ref("a"), out=["z"])], 422,
                                           "op_error", op="matmul"),
    "int-requires-grad": _program_case(lambda w: [_put("z", w.tensor(torch.tensor([1, 2])), True)], 422,
                                       "op_error", op="put"),
    "grad-of-none": _program_case(lambda w: [_call("add", ref("b"), {"grad_of": "b"}, out=["z"])], 422,
                                  "op_error", "b", op="add"),
    "inplace-on-leaf-requiring-grad": _program_case(lambda w: [_call("mul_", ref("a"), ref("a"))], 422,
                                                    "op_error", "leaf", op="mul_"),
    "out-count-mismatch": _program_case(lambda w: [_call("add", ref("a"), ref("a"), out=["z1", "z2"])], 422,
                                        "op_error", op="add"),
    "backward-non-scalar": _program_case(lambda w: [{"kind": "backward", "tensors": ["a"]}], 422, "op_error",
                                         op="backward"),
    "unknown-argument-object": _program_case(lambda w: [_call("add", ref("a"), {"tensor": "a"}, out=["z"])], 400,
                                             "bad_request", "argument", op="add"),
    "id-reused": _program_case(lambda w: [_put("a", F32)], 409, "conflict", "'a'", op="put"),
    "out-id-reused": _program_case(lambda w: [_call("add", ref("a"), ref("a"), out=["b"])], 409, "conflict", "'b'",
                                   op="add"),
    "claimed-shape-too-large": _program_case(
        lambda w: [_put("z", {"dtype": "float32", "shape": [10**12],
                              "data": b"\0" * 16 if w.fmt == "msgpack" else "A" * 24})],
        413, "too_large", "max_tensor_elements", op="put"),
    "claimed-shape-too-large-bad-data": _program_case(
        lambda w: [_put("z", {"dtype": "float32", "shape": [10**6, 10**6], "data": "!!"})],
        413, "too_large", "max_tensor_elements", op="put"),
}


@BOTH_BACKENDS
@pytest.mark.parametrize("case", list(BAD_PROGRAMS), ids=list(BAD_PROGRAMS))
def test_bad_program(wire: Wire, held: dict, case: str):
    run = BAD_PROGRAMS[case]
    status, code, words, step, op = run.expect
    body = _error(run(wire, held["sid"]), status, code, *words)
    assert body["error"]["step"] == step
    assert body["error"]["op"] == op
    assert body["results"] == []
    _assert_untouched(wire, held)


@BOTH_BACKENDS
def test_unknown_session(wire: Wire, held: dict):
    for r in (
        wire.post_raw("/v1/sessions/not-a-session/programs", wire.encode({"id": "p", "steps": []})),
        wire.get("/v1/sessions/not-a-session"),
        wire.get("/v1/sessions/not-a-session/tensors/a"),
        wire.c.delete("/v1/sessions/not-a-session"),
    ):
        _error(r, 404, "unknown_session", "not-a-session")
    _assert_untouched(wire, held)


@BOTH_BACKENDS
def test_another_sessions_tensor_is_unknown(wire: Wire, held: dict):
    other = wire.session()
    try:
        wire.ok(other, [_put("theirs", wire.tensor(torch.ones(2)))])
        status, body = wire.program(held["sid"], [_call("add", ref("a"), ref("theirs"), out=["z"])])
        assert status == 404 and body["error"]["code"] == "unknown_tensor" and "theirs" in body["error"]["message"]
        r = wire.get(f"/v1/sessions/{held['sid']}/tensors/theirs")
        _error(r, 404, "unknown_tensor", "theirs")
        # and the same ids in two sessions are two tensors
        wire.ok(other, [_put("a", wire.tensor(torch.zeros(1)))])
        _assert_untouched(wire, held)
    finally:
        wire.c.delete(f"/v1/sessions/{other}")


@pytest.mark.parametrize("header", [None, "2", "", "1.0", "one"])
def test_protocol_header_missing_or_wrong(server_url: str, wire: Wire, held: dict, header):
    headers = {"Accept": JSON} if header is None else {"Accept": JSON, "Remote-Autograd-Protocol": header}
    with _client(server_url, headers=headers) as c:
        responses = [
            c.post("/v1/sessions"),
            c.post(f"/v1/sessions/{held['sid']}/programs", json={"id": "p", "steps": [{"kind": "free", "ids": ["a"]}]}),
            c.get(f"/v1/sessions/{held['sid']}/tensors/a"),
            c.delete(f"/v1/sessions/{held['sid']}"),
            c.get("/v1/ops"),
        ]
    for r in responses:
        body = _error(r, 400, "protocol_mismatch", "Remote-Autograd-Protocol", "server speaks 1")
        sent = "(none)" if not header else header
        assert f"client sent Remote-Autograd-Protocol: {sent}," in body["error"]["message"]
    _assert_untouched(wire, held)


@pytest.mark.parametrize("path, status", [("/tensors/a?grad=maybe", 400), ("/nonsense", 404),
                                          ("/programs", 405)])  # a GET on the raw program route: the router's 405
def test_framework_errors_use_the_error_body(wire: Wire, held: dict, path: str, status: int):
    r = wire.get(f"/v1/sessions/{held['sid']}{path}")
    _error(r, status, None)


# -- atomicity ----------------------------------------------------------------------------

FAILING_STEP_2 = {
    "op-refuses": (lambda w: _call("matmul", ref("p0"), ref("p0"), out=["p2"]), 422, "op_error", "matmul"),
    "unknown-ref": (lambda w: _call("add", ref("p0"), ref("ghost"), out=["p2"]), 404, "unknown_tensor", "add"),
    "unknown-op": (lambda w: _call("nope", ref("p0"), out=["p2"]), 404, "unknown_op", "nope"),
    "id-reused": (lambda w: _call("add", ref("p0"), ref("p1"), out=["p1"]), 409, "conflict", "add"),
    "data-mismatch": (lambda w: _put("p2", {"dtype": "float32", "shape": [5], "data": [1.0]}), 400, "bad_request", "put"),
    "backward-of-nothing": (lambda w: {"kind": "backward", "tensors": ["p1"]}, 422, "op_error", "backward"),
}


@BOTH_BACKENDS
@pytest.mark.parametrize("case", list(FAILING_STEP_2), ids=list(FAILING_STEP_2))
def test_program_stops_at_the_failing_step(wire: Wire, held: dict, case: str):
    sid = held["sid"]
    make, status, code, op = FAILING_STEP_2[case]
    steps = [
        _put("p0", wire.tensor(torch.ones(2, 3))),
        _call("add", ref("p0"), ref("p0"), out=["p1"]),
        make(wire),
        _put("p3", wire.tensor(torch.ones(1))),
        _call("add", ref("p0"), ref("p0"), out=["p4"]),
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
        assert r.status_code == 404 and _decode(r)["error"]["code"] == "unknown_tensor"
    assert torch.equal(decode_tensor(_decode(wire.get(f"/v1/sessions/{sid}/tensors/p1"))["value"]),
                       torch.full((2, 3), 2.0))
    # the tensors held before the program are as they were
    snap = _snapshot(wire, sid)
    assert {k: v for k, v in snap.items() if k != "info"} == {
        k: v for k, v in held["snapshot"].items() if k != "info"}


@BOTH_BACKENDS
def test_a_limit_refuses_the_whole_program_before_running_it(wire: Wire, held: dict):
    # Limits are checked before anything else about a body: nothing of the program runs.
    sid = held["sid"]
    steps = [_put("p0", wire.tensor(torch.ones(2, 3))),
             _put("p2", {"dtype": "float32", "shape": [10**12], "data": [1.0]})]
    st, body = wire.program(sid, steps)
    assert st == 413 and body["error"]["code"] == "too_large" and body["error"]["step"] == 1
    assert "max_tensor_elements" in body["error"]["message"] and body["results"] == []
    assert wire.get(f"/v1/sessions/{sid}/tensors/p0").status_code == 404


@BOTH_BACKENDS
def test_failing_backward_leaves_grads_untouched(wire: Wire, held: dict):
    sid = held["sid"]
    # a grad_tensors of the wrong shape fails inside autograd, after the graph was walked
    wire.ok(sid, [_put("gwrong", wire.tensor(torch.ones(5)))])
    held["snapshot"] = _snapshot(wire, sid)
    st, body = wire.program(sid, [{"kind": "backward", "tensors": ["c"], "grad_tensors": [ref("gwrong")],
                                   "retain_graph": True}])
    assert st == 422 and body["error"]["op"] == "backward"
    _assert_untouched(wire, held)


@BOTH_BACKENDS
def test_failing_inplace_leaves_the_target_untouched(wire: Wire, held: dict):
    sid = held["sid"]
    st, body = wire.program(sid, [_call("add_", ref("b"), ref("a"))])  # [3,2] += [2,3]: no broadcast
    assert st == 422 and body["error"]["op"] == "add_"
    _assert_untouched(wire, held)


# -- idempotency --------------------------------------------------------------------------


@BOTH_BACKENDS
def test_retried_program_answers_the_first_answer(wire: Wire, sid: str):
    pid = _uid()
    body = wire.encode({"id": pid, "steps": [
        _put("once", wire.tensor(torch.tensor([1.0, 2.0])), True),
        _call("mul", ref("once"), ref("once"), out=["sq"]),
        {"kind": "fetch", "id": "sq"},
    ]})
    path = f"/v1/sessions/{sid}/programs"
    first = wire.post_raw(path, body)
    assert first.status_code == 200
    second = wire.post_raw(path, body)
    assert second.status_code == 200 and second.content == first.content  # not a 409 for "once": it ran once
    assert _decode(wire.get(f"/v1/sessions/{sid}"))["tensors"] == 2
    # the same id with another body is a conflict, and nothing of it runs
    other = wire.encode({"id": pid, "steps": [_put("twice", wire.tensor(torch.ones(1)))]})
    body409 = _error(wire.post_raw(path, other), 409, "conflict", pid)
    assert body409["error"]["step"] is None
    assert wire.get(f"/v1/sessions/{sid}/tensors/twice").status_code == 404
    # and the original answer is still remembered
    assert wire.post_raw(path, body).content == first.content


@BOTH_BACKENDS
def test_retried_failing_program_answers_the_same_error(wire: Wire, sid: str):
    pid = _uid()
    body = wire.encode({"id": pid, "steps": [
        _put("r0", wire.tensor(torch.ones(2))),
        _call("matmul", ref("r0"), ref("r0"), out=["r1"]),  # 1-d @ 1-d is fine: a dot product
        _call("nope", ref("r0"), out=["r2"]),
    ]})
    path = f"/v1/sessions/{sid}/programs"
    first = wire.post_raw(path, body)
    second = wire.post_raw(path, body)
    assert first.status_code == second.status_code == 404
    assert first.content == second.content
    assert _decode(first)["error"]["step"] == 2


@BOTH_BACKENDS
def test_retry_with_another_accept_is_answered_in_that_format(server_url: str):
    with _client(server_url, headers=PROTOCOL_HEADERS) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        w = Wire(c, "msgpack")
        body = w.encode({"id": "p", "steps": [_put("x", w.tensor(torch.ones(2))), {"kind": "fetch", "id": "x"}]})
        path = f"/v1/sessions/{sid}/programs"
        assert w.post_raw(path, body).status_code == 200
        r = c.post(path, content=body, headers={"Content-Type": MSGPACK, "Accept": JSON})
        assert r.status_code == 200
        assert torch.equal(decode_tensor(r.json()["results"][1]["tensor"]["value"]), torch.ones(2))


# -- limits (a server of its own) ---------------------------------------------------------


def test_limits_are_413_naming_the_limit():
    with start_server(REMOTE_AUTOGRAD_MAX_BODY_BYTES="2000", REMOTE_AUTOGRAD_MAX_STEPS_PER_PROGRAM="3",
                      REMOTE_AUTOGRAD_MAX_TENSORS_PER_SESSION="2", REMOTE_AUTOGRAD_MAX_TENSOR_ELEMENTS="100") as url:
        with _client(url, headers=PROTOCOL_HEADERS) as c:
            created = c.post("/v1/sessions").json()
            assert created["limits"]["max_body_bytes"] == 2000 and created["limits"]["max_steps_per_program"] == 3
            sid = created["session_id"]
            path = f"/v1/sessions/{sid}/programs"
            w = Wire(c, "json")
            big = {"id": "big", "steps": [_put("z", {"dtype": "uint8", "shape": [3000], "data": "A" * 4000})]}
            _error(c.post(path, json=big), 413, "too_large", "max_body_bytes")
            # also when the body comes without a Content-Length (chunked)
            r = c.post(path, content=iter([json.dumps(big).encode()[:1000]] * 3), headers={"Content-Type": JSON})
            _error(r, 413, "too_large", "max_body_bytes")
            assert c.get(f"/v1/sessions/{sid}").json()["tensors"] == 0
            many = {"id": "many", "steps": [{"kind": "free", "ids": []}] * 4}
            _error(c.post(path, json=many), 413, "too_large", "max_steps_per_program")
            st, body = w.program(sid, [_put("e", {"dtype": "uint8", "shape": [101], "data": "!"})])
            assert st == 413 and "max_tensor_elements=100" in body["error"]["message"]
            st, body = w.program(sid, [_put(f"t{i}", w.tensor(torch.ones(1))) for i in range(3)])
            assert st == 413 and body["error"]["step"] == 2 and "max_tensors_per_session" in body["error"]["message"]
            assert len(body["results"]) == 2


# -- the SPEC's walkthrough ---------------------------------------------------------------


NO_BODY = object()


def _spec_examples() -> list[dict]:
    """The ``<!-- example: NAME -->`` curl blocks of SPEC.md with their ``<!-- response: NAME STATUS -->``."""
    text = SPEC.read_text()
    block = r"\s*```(\w+)\n(.*?)```"
    requests = {m.group(1): m.group(3) for m in re.finditer(r"<!-- example: ([\w-]+) -->" + block, text, re.S)}
    responses = {m.group(1): (int(m.group(2)), m.group(4))
                 for m in re.finditer(r"<!-- response: ([\w-]+) (\d+) -->" + block, text, re.S)}
    order = re.findall(r"<!-- example: ([\w-]+) -->", text)
    assert order and set(order) == set(responses), (order, sorted(responses))
    # an empty response block documents an answer without a body
    return [{"name": n, "curl": requests[n], "status": responses[n][0],
             "response": json.loads(responses[n][1]) if responses[n][1].strip() else NO_BODY} for n in order]


def _parse_curl(cmd: str, env: dict) -> tuple[str, str, dict, bytes | None]:
    words = shlex.split(cmd.replace("\\\n", " "))
    assert words[0] == "curl", words
    method, url, headers, body = "GET", None, {}, None
    i = 1
    while i < len(words):
        w = words[i]
        if w == "-s":
            pass
        elif w == "-X":
            i += 1
            method = words[i]
        elif w == "-H":
            i += 1
            k, _, v = words[i].partition(":")
            headers[k.strip()] = v.strip()
        elif w == "-d":
            i += 1
            body = words[i].encode()
            if method == "GET":
                method = "POST"
        else:
            assert url is None, f"unexpected curl argument {w!r}"
            url = w
        i += 1
    for k, v in env.items():
        url = url.replace("$" + k, v)
    assert "$" not in url, url
    return method, url, headers, body


def _matches(documented: Any, actual: Any, where: str = "") -> None:
    if isinstance(documented, str) and documented.startswith("<") and documented.endswith(">"):
        return  # stands for any value
    if isinstance(documented, dict):
        assert isinstance(actual, dict) and set(actual) == set(documented), (where, documented, actual)
        for k in documented:
            _matches(documented[k], actual[k], f"{where}.{k}")
    elif isinstance(documented, list):
        assert isinstance(actual, list) and len(actual) == len(documented), (where, documented, actual)
        for i, (d, a) in enumerate(zip(documented, actual)):
            _matches(d, a, f"{where}[{i}]")
    else:
        assert type(documented) is type(actual) or {type(documented), type(actual)} <= {int, float}, (where, documented, actual)
        assert documented == actual, (where, documented, actual)


def test_spec_walkthrough(server_url: str):
    examples = _spec_examples()
    names = [e["name"] for e in examples]
    assert names[0] == "create-session" and {"upload", "forward-backward", "read-grad"} <= set(names)
    env = {"URL": server_url}
    with _client(server_url) as c:
        for ex in examples:
            method, url, headers, body = _parse_curl(ex["curl"], env)
            assert headers.get("Remote-Autograd-Protocol") == "1", ex["name"]
            if body is not None:
                json.loads(body)  # the documented body is valid JSON as written
            r = c.request(method, url, headers=headers, content=body)
            assert r.status_code == ex["status"], (ex["name"], r.status_code, r.text)
            if ex["response"] is NO_BODY:
                assert r.content == b"" and "content-type" not in r.headers, (ex["name"], r.headers)
                continue
            actual = r.json()
            _matches(ex["response"], actual, ex["name"])
            if ex["name"] == "create-session":
                env["SID"] = actual["session_id"]
    # and the gradient it read is the true one
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * torch.tensor([4.0, 5.0, 6.0])).sum().backward()
    read_grad = next(e for e in examples if e["name"] == "read-grad")["response"]
    assert torch.equal(decode_tensor(read_grad["grad"]), x.grad)


def test_zero_element_shape_with_a_huge_dim(wire: Wire, held: dict):
    r = wire.post_raw(f"/v1/sessions/{held['sid']}/programs", wire.encode({"id": _uid(), "steps": [
        _put("z", {"dtype": "float32", "shape": [0, 10**19], "data": b"" if wire.fmt == "msgpack" else ""})]}))
    _error(r, 400, "bad_request", "shape")
    _assert_untouched(wire, held)

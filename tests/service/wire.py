"""Helpers for the tests that speak the protocol over raw HTTP, in msgpack and in JSON.

Shared by test_http, test_program_atomicity, test_spec_walkthrough and test_omit_known_meta;
their fixtures (``api``, ``bare``, ``wire``, ``sid``, ``held``) are in this folder's conftest.
Every response a ``checked_client`` (or the ``api`` fixture) receives is checked to be below
500, so a 5xx fails the test that provoked it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import encode_tensor

MSGPACK = "application/msgpack"
JSON = "application/json"
FORMATS = ["msgpack", "json"]

# The tests of programs, errors and retries: they do not depend on where sessions live, so
# they also run against a front on the Ray backend (conftest: the backends marker).
BOTH_BACKENDS = pytest.mark.backends("inprocess", "tenants", "ray")


def fail_on_5xx(response: httpx.Response) -> None:
    """An httpx response hook: a 5xx answer is an assertion error naming the request."""
    if response.status_code >= 500:
        response.read()
        raise AssertionError(
            f"{response.request.method} {response.request.url} answered {response.status_code}: {response.text[:2000]}"
        )


def checked_client(url: str, **kw) -> httpx.Client:
    """An httpx client on ``url`` that fails on any 5xx answer (no protocol header unless ``kw`` sets one)."""
    return httpx.Client(base_url=url, timeout=30, event_hooks={"response": [fail_on_5xx]}, **kw)


def decode(r: httpx.Response) -> Any:
    """A response's body, from msgpack or JSON as its content type says; None when empty."""
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
        r = self.post_raw(f"/v1/sessions/{sid}/programs", self.encode({"id": pid or new_id(), "steps": steps}))
        return r.status_code, decode(r)

    def ok(self, sid: str, steps: list) -> list:
        status, body = self.program(sid, steps)
        assert status == 200, body
        assert "error" not in body
        assert len(body["results"]) == len(steps)
        return body["results"]

    def session(self) -> str:
        r = self.c.post("/v1/sessions", headers={"Accept": self.ct})
        assert r.status_code == 201, r.text
        return decode(r)["session_id"]

    def get(self, path: str, **kw) -> httpx.Response:
        return self.c.get(path, headers={"Accept": self.ct}, **kw)


def new_id() -> str:
    """A fresh program or tensor id."""
    return uuid.uuid4().hex


def put_step(tid: str, wire_value: dict, requires_grad: bool = False) -> dict:
    return {"kind": "put", "id": tid, "value": wire_value, "requires_grad": requires_grad}


def call_step(op: str, *args, out=(), **kwargs) -> dict:
    return {"kind": "call", "op": op, "args": list(args), "kwargs": kwargs, "out": list(out)}


def ref(tid: str) -> dict:
    return {"ref": tid}


def snapshot(wire: Wire, sid: str) -> dict:
    """The exact bytes the ``held`` fixture's tensors and the session's info read back as, in both formats."""
    snap = {}
    for tid in ("a", "b", "n", "h", "c", "loss"):
        for ct in (MSGPACK, JSON):
            r = wire.c.get(f"/v1/sessions/{sid}/tensors/{tid}", headers={"Accept": ct})
            assert r.status_code == 200
            snap[tid, ct] = r.content
    snap["info"] = wire.get(f"/v1/sessions/{sid}").content
    return snap


def assert_untouched(wire: Wire, held: dict) -> None:
    """The ``held`` session reads back byte for byte as before, and the server is still healthy."""
    assert snapshot(wire, held["sid"]) == held["snapshot"]
    assert wire.c.get("/healthz").json()["status"] == "ok"


def expect_error(r: httpx.Response, status: int, code: str | None, *words: str) -> dict:
    """The error body of ``r``: its status, code, and a message naming each of ``words`` (any case)."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = decode(r)
    err = body["error"]
    assert set(err) == {"code", "message", "step", "op"}
    if code is not None:
        assert err["code"] == code, err
    for w in words:
        assert w.lower() in err["message"].lower(), (w, err["message"])
    return body

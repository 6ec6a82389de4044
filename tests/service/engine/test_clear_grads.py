"""``clear_grads``: a ``set_grad`` with null for each of its ids, as one step (the SDK sends an optimizer's
``zero_grad`` so: ``tests/client/session/test_clear_grads.py``). All or none: an unknown id is a 404
before any grad is cleared. The grads' bytes go back to the session."""

from __future__ import annotations

import httpx
import torch

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import encode_tensor

from ...conftest import PROTOCOL_HEADERS
from ..wire import new_id


def _session(c: httpx.Client) -> str:
    """A session holding leaves ``a`` and ``b`` (4 floats each) with grads, from one backward."""
    sid = c.post("/v1/sessions").json()["session_id"]
    steps = [{"kind": "put", "id": t, "value": encode_tensor(torch.ones(4), as_json=True), "requires_grad": True}
             for t in ("a", "b")]
    steps += [{"kind": "call", "op": "mul", "args": [{"ref": "a"}, {"ref": "b"}], "out": ["c"]},
              {"kind": "call", "op": "sum", "args": [{"ref": "c"}], "out": ["s"]},
              {"kind": "backward", "tensors": ["s"]}, {"kind": "free", "ids": ["c", "s"]}]
    assert _program(c, sid, steps).status_code == 200
    return sid


def _program(c: httpx.Client, sid: str, steps: list) -> httpx.Response:
    return c.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": steps})


def _grads(c: httpx.Client, sid: str) -> list[bool]:
    r = _program(c, sid, [{"kind": "fetch", "id": t, "value": False} for t in ("a", "b")])
    return [result["tensor"].get("grad") is not None for result in r.json()["results"]]


def _client() -> httpx.Client:
    return httpx.Client(transport=client.InProcessTransport(service_app()), base_url="http://in-process",
                        headers=PROTOCOL_HEADERS, timeout=60)


def test_each_grad_is_cleared_and_its_bytes_given_back():
    with _client() as c:
        sid = _session(c)
        held = c.get(f"/v1/sessions/{sid}").json()["bytes"]
        assert _grads(c, sid) == [True, True]
        r = _program(c, sid, [{"kind": "clear_grads", "ids": ["a", "b"]}])
        assert r.status_code == 200 and r.json()["results"] == [None]
        assert _grads(c, sid) == [False, False]
        assert c.get(f"/v1/sessions/{sid}").json()["bytes"] == held - 2 * 4 * 4


def test_an_unknown_id_is_a_404_and_no_grad_is_cleared():
    with _client() as c:
        sid = _session(c)
        r = _program(c, sid, [{"kind": "clear_grads", "ids": ["a", "ghost", "b"]}])
        error = r.json()["error"]
        assert r.status_code == 404 and error["code"] == "unknown_tensor" and error["op"] == "clear_grads"
        assert "ghost" in error["message"]
        assert _grads(c, sid) == [True, True]


def test_an_empty_list_is_refused_by_validation():
    with _client() as c:
        sid = _session(c)
        r = _program(c, sid, [{"kind": "clear_grads", "ids": []}])
        assert r.status_code == 400 and "ids" in r.json()["error"]["message"]

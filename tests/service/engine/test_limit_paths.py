"""The limits a program's body claims answer 413 on every path a program takes.

The step count and the put steps' element counts (value and grad) are checked once, at
admission (``service/engine/guards.check_limits``, called by ``LocalSessions.answer_program``, which
the Ray backend's worker actors run too; the Ray front passes the body on undecoded). So the
same over-limit program goes here as JSON, as msgpack and as a framed body, to both backends:
a path that skipped the check would answer something else, or run the program's first step.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import encode_tensor
from remote_autograd.proto.codec import FRAMES, pack_frames

pytestmark = pytest.mark.backends("inprocess", "tenants", "ray")

JSON, MSGPACK = "application/json", "application/msgpack"
WIRES = ["json", "msgpack", "framed"]


@pytest.fixture
def session(http: httpx.Client) -> Iterator[tuple[str, dict]]:
    """A fresh session's id and the limits it was created with."""
    created = http.post("/v1/sessions").json()
    yield created["session_id"], created["limits"]
    http.delete(f"/v1/sessions/{created['session_id']}")


def _tensor(t: torch.Tensor, wire: str) -> dict:
    return encode_tensor(t, as_json=wire == "json")


def _post(http: httpx.Client, sid: str, wire: str, steps: list) -> httpx.Response:
    """One program in ``wire``'s body format; the answer in JSON (Accept), to read it the same way for all."""
    message = {"id": os.urandom(6).hex(), "steps": steps}
    if wire == "json":
        body, ctype = json.dumps(message).encode(), JSON
    elif wire == "msgpack":
        body, ctype = msgpack.packb(message, use_bin_type=True), MSGPACK
    else:  # the first put's data travels as a frame, as the SDK sends big tensors
        data = memoryview(steps[0]["value"]["data"])
        steps = [{**steps[0], "value": {**steps[0]["value"], "data": {"frame": 0}}}, *steps[1:]]
        parts, _ = pack_frames({**message, "steps": steps}, [data])
        body, ctype = b"".join(bytes(p) for p in parts), FRAMES
    return http.post(f"/v1/sessions/{sid}/programs", content=body,
                     headers={"Content-Type": ctype, "Accept": JSON})


def _first_put(wire: str) -> dict:
    return {"kind": "put", "id": "p0", "value": _tensor(torch.arange(6.0), wire)}


def _refused(http: httpx.Client, sid: str, r: httpx.Response, status: int, code: str, starts: str) -> dict:
    """The error of a program refused before any step ran (``p0``, its first step, was never stored)."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    answer = r.json()
    assert answer["error"]["code"] == code and answer["error"]["message"].startswith(starts), answer
    assert answer["results"] == [] and "id" not in answer
    assert http.get(f"/v1/sessions/{sid}/tensors/p0").status_code == 404
    return answer["error"]


@pytest.mark.parametrize("wire", WIRES)
def test_too_many_steps(http: httpx.Client, session: tuple[str, dict], wire: str):
    sid, limits = session
    n = limits["max_steps_per_program"]
    steps = [_first_put(wire), *[{"kind": "free", "ids": []}] * n]
    err = _refused(http, sid, _post(http, sid, wire, steps), 413, "too_large", f"program has {n + 1} steps")
    assert f"max_steps_per_program={n}" in err["message"] and err["step"] is None
    ok = _post(http, sid, wire, steps[:n])  # at the limit: runs
    assert ok.status_code == 200, ok.text[:500]


@pytest.mark.parametrize("key", ["value", "grad"])
@pytest.mark.parametrize("wire", WIRES)
def test_a_put_claiming_too_many_elements(http: httpx.Client, session: tuple[str, dict], wire: str, key: str):
    sid, limits = session
    n = limits["max_tensor_elements"]
    claim = {"dtype": "float32", "shape": [n + 1], "data": b"\0" * 8 if wire != "json" else [0.0, 0.0]}
    small = _tensor(torch.zeros(2), wire)
    put = {"kind": "put", "id": "q", "value": claim if key == "value" else small, "requires_grad": True,
           **({"grad": claim} if key == "grad" else {})}
    err = _refused(http, sid, _post(http, sid, wire, [_first_put(wire), put]), 413, "too_large",
                   f"steps.1.put.{key}: shape [{n + 1}]")
    assert f"max_tensor_elements={n}" in err["message"] and (err["step"], err["op"]) == (1, "put")


@pytest.mark.parametrize("dim", ["3", 3.0, True], ids=["string", "float", "bool"])
def test_a_dim_is_an_integer_as_sent(http: httpx.Client, session: tuple[str, dict], dim):
    # The element limit is checked on the body as sent, before validation: a dim that validation
    # would turn into an integer ("3" -> 3) would escape it, so validation takes integers only.
    sid, _ = session
    put = {"kind": "put", "id": "q", "value": {"dtype": "float32", "shape": [dim], "data": [1.0, 2.0, 3.0]}}
    _refused(http, sid, _post(http, sid, "json", [_first_put("json"), put]), 400, "bad_request",
             "steps.1.put.value.shape.0: Input should be a valid integer")

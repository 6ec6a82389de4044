"""Fixtures of the raw-HTTP tests (helpers in ``wire.py``). A module's own fixture of the same
name (test_limits' ``sid`` and ``held``, test_fetch_while_writing's ``sid``) overrides these."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
import torch

from .wire import FORMATS, Wire, call_step, checked_client, fail_on_5xx, put_step, ref, snapshot


@pytest.fixture
def api(http: httpx.Client) -> httpx.Client:
    """The shared ``http`` client, with the no-5xx check on every response."""
    http.event_hooks["response"].append(fail_on_5xx)
    return http


@pytest.fixture
def bare(server_url: str) -> Iterator[httpx.Client]:
    """A client without the protocol header."""
    with checked_client(server_url) as c:
        yield c


@pytest.fixture(params=FORMATS)
def wire(request, api) -> Wire:
    return Wire(api, request.param)


@pytest.fixture
def sid(wire: Wire) -> Iterator[str]:
    s = wire.session()
    yield s
    wire.c.delete(f"/v1/sessions/{s}")


@pytest.fixture
def held(wire: Wire, sid: str) -> dict:
    """Tensors the session holds before the bad request, with the exact bytes they read back as."""
    wire.ok(sid, [
        put_step("a", wire.tensor(torch.tensor([[1.5, -2.0, 3.0], [0.25, 5.0, -6.0]])), True),
        put_step("b", wire.tensor(torch.arange(6, dtype=torch.float32).reshape(3, 2))),
        put_step("n", wire.tensor(torch.tensor([2**62, -1, 7]))),
        put_step("h", wire.tensor(torch.tensor([1.0, float("nan"), -0.0], dtype=torch.bfloat16))),
        call_step("matmul", ref("a"), ref("b"), out=["c"]),
        call_step("sum", ref("c"), out=["loss"]),
        {"kind": "backward", "tensors": ["loss"]},
    ])
    return {"sid": sid, "snapshot": snapshot(wire, sid)}

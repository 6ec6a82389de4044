"""The calls issue 31 found crashing a server, sent over HTTP by a hostile client: each answers a 4xx.

Each of ``tests/fuzz/_calls.known()`` (``segment_reduce`` with ``unsafe=True``, a packed sequence's
batch sizes for ``_pad_packed_sequence`` and ``lstm``, ``ctc_loss``'s labels, ``embedding_bag``'s
offsets) ended the process that ran it, SIGSEGV or SIGABRT (``tests/ops/test_value_fuzz.py`` shows it
in forked children): in one process, that was the server and every session in it; with a worker
process per token, the worker and every session of the token. Here both tenant modes of the shared
servers run them (``inprocess``, and ``tenants``: sessions in a worker process): each is a 422 naming
the bad value, the attacker's session lives on, and another session's tensor, in the same process,
reads back byte for byte.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch

from ..fuzz import _calls
from .wire import MSGPACK, Wire, checked_client, new_id, put_step

pytestmark = pytest.mark.backends("inprocess", "tenants")

SECRET = torch.full((4096,), 7.25)
KNOWN = _calls.known()


@pytest.fixture(scope="module")
def victim(server_url: str) -> Iterator[dict]:
    with checked_client(server_url, headers={"Remote-Autograd-Protocol": "1"}) as c:
        wire = Wire(c, "msgpack")
        sid = wire.session()
        wire.ok(sid, [put_step("secret", wire.tensor(SECRET))])
        yield {"wire": wire, "sid": sid, "bytes": _read(wire, sid)}
        c.delete(f"/v1/sessions/{sid}")


@pytest.fixture(scope="module")
def attacker(server_url: str) -> Iterator[tuple[Wire, str]]:
    with checked_client(server_url, headers={"Remote-Autograd-Protocol": "1"}) as c:
        wire = Wire(c, "msgpack")
        sid = wire.session()
        yield wire, sid
        c.delete(f"/v1/sessions/{sid}")


def _read(wire: Wire, sid: str) -> bytes:
    r = wire.c.get(f"/v1/sessions/{sid}/tensors/secret", headers={"Accept": MSGPACK})
    assert r.status_code == 200, r.text
    return r.content


def steps_of(call: _calls.BaseCall, wire: Wire) -> list[dict]:
    """A put step per tensor of ``call``, then its call step, as a client that is no SDK would write them."""
    puts: list[dict] = []
    prefix = new_id()

    def value(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            puts.append(put_step(f"{prefix}.{len(puts)}", wire.tensor(v)))
            return {"ref": puts[-1]["id"]}
        return [value(x) for x in v] if isinstance(v, (list, tuple)) else v

    args, kwargs = [value(a) for a in call.args], {k: value(v) for k, v in call.kwargs.items()}
    return [*puts, {"kind": "call", "op": call.spelling, "args": args, "kwargs": kwargs, "out": [prefix],
                    "out_many": True}]


@pytest.mark.parametrize("call", KNOWN, ids=[f"{c.op}-{i}" for i, c in enumerate(KNOWN)])
def test_a_crashing_call_answers_422_and_touches_nothing_else(call, attacker, victim):
    wire, sid = attacker
    steps = steps_of(call, wire)
    status, body = wire.program(sid, steps)
    assert status == 422, body
    assert body["error"]["code"] == "op_error" and body["error"]["step"] == len(steps) - 1, body
    assert "0x" not in body["error"]["message"]
    assert wire.c.get(f"/v1/sessions/{sid}").status_code == 200  # not 410: no worker died under the session
    assert _read(victim["wire"], victim["sid"]) == victim["bytes"]
    assert wire.c.get("/healthz").json()["status"] == "ok"


def test_offsets_that_read_before_the_input_answer_no_value_of_memory(attacker):
    """embedding_bag with a last offset of -31: torch read input[-31], before the tensor, and its 422
    printed what it found there ("Index -31 of input takes value 6870903275733463089"): a heap word."""
    wire, sid = attacker
    call = _calls.BaseCall("nn.functional.embedding_bag", "nn.functional.embedding_bag",
                           [torch.tensor([1, 2, 3, 4]), torch.randn(10, 3), torch.tensor([0, 2, -31])], {"mode": "sum"}, {})
    status, body = wire.program(sid, steps_of(call, wire))
    assert status == 422
    message = body["error"]["message"]
    assert "non-decreasing" in message and "takes value" not in message and "0x" not in message

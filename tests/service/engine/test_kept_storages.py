"""The in-place steps ``kept_storages`` spares the byte re-count change no storage: after each, counting
every tensor of the session again changes nothing, so the skipped re-count would have changed nothing."""

from __future__ import annotations

import pytest
import torch

from remote_autograd.proto import encode_tensor
from remote_autograd.proto.messages import validate_program
from remote_autograd.proto.op_contract import is_inplace_name
from remote_autograd.service.engine import kept_storages
from remote_autograd.service.engine.runner import run_steps
from remote_autograd.service.ops import OP_TABLE
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.service.settings import Settings

A, B, C = {"ref": "a"}, {"ref": "b"}, {"ref": "c"}
_ARGS = {  # each entry that keeps_storage: its arguments after the target (a, b and c: positive float32 (4,))
    "lerp": [B, 0.5], "addcmul": [B, C], "addcdiv": [B, C], "fill": [1.5], "clamp": [0.1, 0.9],
    "clamp_min": [0.1], "clamp_max": [0.9], "pow": [2], "masked_fill": [{"ref": "mask"}, 0.0],
    **{name: [B] for name in ("add", "sub", "mul", "div", "true_divide", "copy_")},
}
# every in-place spelling of every such entry (``Tensor.add_``, ``Tensor.__iadd__``, ``torch.abs_``), but the
# foreach ops' (below): (spelling, entry)
_KEEPING = sorted((w, e.name) for e in OP_TABLE if e.keeps_storage and not e.name.startswith("_foreach_")
                  for w in e.variants if is_inplace_name(w))
_FOREACH = {"_foreach_add_": [[B, C]], "_foreach_mul_": [0.5], "_foreach_lerp_": [[B, C], 0.25],
            "_foreach_addcdiv_": [[B, C], [C, B]], "_foreach_sqrt_": []}


def _session():
    settings = Settings()
    session = SessionStore(settings).create()
    puts = [{"kind": "put", "id": tid, "value": encode_tensor(torch.rand(4) + 0.5)} for tid in "abc"]
    puts.append({"kind": "put", "id": "mask", "value": encode_tensor(torch.tensor([True, False, True, False]))})
    assert run_steps(session, validate_program({"id": "setup", "steps": puts}), settings).status == 200
    return session, settings


def _after(op: str, args: list) -> tuple[int, int]:
    session, settings = _session()
    program = {"id": "p", "steps": [{"kind": "call", "op": op, "args": args, "out": [], "grad_enabled": False}]}
    outcome = run_steps(session, validate_program(program), settings)
    assert outcome.status == 200, outcome.body
    held = session.bytes_held
    session.storages.remeasure(list(session.tensors.values()))  # the plain path's re-count, of all
    return held, session.bytes_held


@pytest.mark.parametrize("wire, name", _KEEPING, ids=[w for w, _ in _KEEPING])
def test_an_elementwise_in_place_op_keeps_every_storage(wire, name):
    held, recounted = _after(wire, [A, *_ARGS.get(name, [])])
    assert held == recounted


@pytest.mark.parametrize("name", sorted(_FOREACH))
def test_a_foreach_in_place_op_keeps_every_storage(name):
    held, recounted = _after(name, [[A, B], *_FOREACH[name]])
    assert held == recounted


def test_an_op_that_points_a_tensor_elsewhere_is_counted_again():
    """set_data (x.data = y) is not spared, and the plain path's count follows it (the tests above could
    not fail on it)."""
    step = validate_program({"id": "x", "steps": [{"kind": "call", "op": "set_data", "args": [A, B],
                                                   "out": []}]}).steps[0]
    assert not kept_storages.keeps_storages(OP_TABLE.resolve(step.op), step)
    session, _ = _session()
    before = session.bytes_held
    held, recounted = _after("set_data", [A, B])
    assert held == recounted == before - 16  # a's own storage went; b's is counted once

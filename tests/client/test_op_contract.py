"""The op contract (``proto/op_contract.py``) is the one both sides read: no side keeps a copy.

Checked against the real service table (``service/ops``) and the SDK's own modules: the server
registers exactly the contract's factories, the ops whose in-place forms change their target's
layout run on the target and the SDK follows, every served shape rule is one the contract names, and each side's
modules hold the contract's very objects (not equal copies).
"""

from __future__ import annotations

import torch

from remote_autograd import client
from remote_autograd.client import _session
from remote_autograd.client import _core
from remote_autograd.client.session import _routes
from remote_autograd.proto import op_contract
from remote_autograd.service.ops import OP_TABLE, _registry, factories, surface
from tools.derive_ops import _names


def _served() -> list:
    return list(OP_TABLE)


def test_the_server_registers_exactly_the_contracts_factories():
    served = {e.name for e in _served() if getattr(e.fn, "__module__", None) == factories.__name__}
    assert served == set(op_contract.FACTORIES)
    assert set(op_contract.RANDOM_FACTORIES) <= served


def test_the_sdk_has_a_factory_method_for_each_and_infers_their_metadata_from_the_contract():
    for name in op_contract.FACTORIES:
        method = getattr(_session.Session, name)
        assert method.__name__ == name and f"torch.{name}" in method.__doc__
    assert _core.FACTORIES is op_contract.FACTORIES


def test_every_op_that_changes_its_targets_layout_runs_on_the_target_and_the_sdk_reads_the_fact():
    """An entry's ``relayout`` (probed by the generator, or declared): each of its in-place spellings runs
    torch's own op on the stored tensor (a copy written back could not change its shape), and the SDK
    gives the handle the layout torch's method gives a meta stand-in."""
    relayout = [e for e in _served() if e.relayout]
    assert relayout
    for entry in relayout:
        for wire in [w for w in entry.variants if op_contract.is_inplace_name(w)]:
            call = OP_TABLE.resolve(wire)
            assert call.inplace and call.writes and not call.by_copy, wire
    with client.connect(transport=client.InProcessTransport()) as sess:
        local = torch.randn(2, 3)
        x = sess.tensor(local)
        x.t_()
        local.t_()
        assert x.shape == local.shape and x.stride() == local.stride() and torch.equal(x.cpu(), local)


def test_both_sides_read_one_in_place_rule_and_one_list_of_shape_rules():
    assert _registry.is_inplace_name is _names.is_inplace_name is op_contract.is_inplace_name
    assert surface.is_inplace_name is _routes.is_inplace_name is op_contract.is_inplace_name
    assert _registry.SHAPE_RULES is op_contract.SHAPE_RULES
    assert {e.shape_rule for e in _served()} <= set(op_contract.SHAPE_RULES)
    for name, inplace in [("Tensor.add_", True), ("Tensor.__iadd__", True), ("Tensor.__invert__", False),
                          ("Tensor.__index__", False), ("torch._foreach_add_", True), ("add", False)]:
        assert op_contract.is_inplace_name(name) is inplace, name


def test_autocast_leaves_in_place_ops_alone_on_the_wire():
    with client.connect(transport=client.InProcessTransport()) as sess:
        x = sess.tensor(torch.randn(4, 4))
        with torch.autocast(device_type=sess.device.type, dtype=torch.bfloat16):
            x.add_(1.0)
            queued = sess._queue[-1]
            y = x @ x  # waits: the server's autocast rules give its dtype
            sess.manual_seed(0)  # a session op and a factory: nothing for autocast to cast
            z = sess.randn(2)
            seeded, made = sess._queue[-2:]
        assert queued["op"].endswith("add_") and "autocast" not in queued
        assert "autocast" not in seeded and "autocast" not in made and z.dtype == torch.float32
        assert y.dtype == torch.bfloat16 and x.dtype == torch.float32

"""The op contract (``proto/op_contract.py``) is the one both sides read: no side keeps a copy.

Checked against the real service table (``service/ops``) and the SDK's own modules: the server
registers exactly the contract's factories, the shape-changing in-place ops the op generator
probed are the contract's, every served shape rule is one the contract names, and each side's
modules hold the contract's very objects (not equal copies).
"""

from __future__ import annotations

import torch

from remote_autograd import client
from remote_autograd.client import _session
from remote_autograd.client import _core
from remote_autograd.client.session import _routes
from remote_autograd.client.tensor import _views
from remote_autograd.proto import op_contract
from remote_autograd.service.ops import OP_TABLE, _derive_names, _registry, factories, surface


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


def test_the_shape_changing_in_place_ops_the_generator_probed_are_the_contracts():
    probed = {path.rpartition(".")[2] for spec in surface.load()["ops"].values()
              for path in spec.get("layout_inplace", ())}
    assert probed <= set(op_contract.SHAPE_INPLACE), probed - set(op_contract.SHAPE_INPLACE)
    # every one the table serves runs on the stored tensor itself (a copy written back could not change
    # its shape), the probe's or not (its samples of as_strided_ and resize_as_ keep the layout)
    for name in op_contract.SHAPE_INPLACE:
        call = OP_TABLE.resolve(f"Tensor.{name}")
        assert call is None or (call.inplace and call.writes and not call.by_copy), name
    assert _views.SHAPE_INPLACE is op_contract.SHAPE_INPLACE


def test_both_sides_read_one_in_place_rule_and_one_list_of_shape_rules():
    assert _registry.is_inplace_name is _derive_names.is_inplace_name is op_contract.is_inplace_name
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

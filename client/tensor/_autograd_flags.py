"""The C++ tensor's autograd facts of a ``RemoteTensor``, kept those of the handle.

torch.compile's guards read the C++ tensor (its requires_grad, its .grad), and its epilogue code reads
.grad back, so the wrapper's C++ fields are kept in step with the SDK's own (``_rg``, ``_has_grad``).
"""

from __future__ import annotations

import torch
from torch._C import DisableTorchFunctionSubclass

_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass
_SET_REQUIRES_GRAD = torch.Tensor.requires_grad.__set__
_SET_GRAD = torch.Tensor.grad.__set__


def set_requires_grad_flag(t, value: bool) -> None:
    """The C++ ``requires_grad`` of ``t`` made its ``_rg``."""
    with DisableTorchFunctionSubclass():
        _SET_REQUIRES_GRAD(t, value)


def set_has_grad(t, value: bool) -> None:
    """Whether ``t`` has a ``.grad`` (``_has_grad``), and the C++ ``.grad`` to match: a stand-in of the
    grad's layout (the C++ grad must not hold ``t``, which holds it: no collector sees that cycle)."""
    t._has_grad = value
    with DisableTorchFunctionSubclass():
        _SET_GRAD(t, _grad_stand_in(t) if value else None)


def _grad_stand_in(t):
    g = t.__dict__.get("_grad_stand_in")  # kept: zero_grad and every backward set it again
    if g is not None and g._shape == t._shape and g._dtype == t._dtype:
        return g
    g = t.__dict__["_grad_stand_in"] = _MAKE_WRAPPER(type(t), t._shape, dtype=t._dtype,
                                                     device=t._session.device)
    g._session, g._id, g._shape, g._dtype, g._rg, g._is_leaf, g._leaves = t._session, None, t._shape, t._dtype, \
        False, True, frozenset()
    g._error = RuntimeError("the C++ .grad of a remote tensor stands in for its layout only; read it as `t.grad`")
    return g

"""Factories and uploads that name the ``remote`` device: Python kernels on the PrivateUse1 key.

``torch.zeros(3, device=sess.device)`` has no tensor argument, so ``__torch_function__``
never sees it; the dispatcher does, and sends it to the kernel registered here for
``(aten::zeros, PrivateUse1)``. The same holds inside ``with torch.device(sess.device):``
(torch's own mode adds the ``device`` keyword) and for ``local.to(sess.device)``,
``torch.tensor(data, device=...)`` and optimizer state loads, which all reach
``aten::_to_copy`` with a remote target. Local code never reaches these kernels, so
this costs ordinary torch nothing (an always-on TorchFunctionMode would tax every op).

Each kernel queues the server's op of the same name (random ones draw from the
session's generator). ``requires_grad=True`` is set by torch *after* the kernel
returns, on the C++ side; ``_factory_outputs.settle_requires_grad`` carries it over to the
handle before the SDK next looks at any RemoteTensor.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from .._core import RemoteTensor, call_op
from ..device._device import session_for
from ..tensor._factory_outputs import MADE
from ._moves import upload_move

KERNELS: dict[str, Callable] = {}  # aten overload name -> our kernel for it on the PrivateUse1 key
_LIB: torch.library.Library | None = None  # kept alive once registered: dropping it unregisters the kernels


def _kernel(*names: str):
    def register(fn: Callable) -> Callable:
        for name in names:
            KERNELS[name] = fn
        return fn

    return register


def _factory_call(op: str, args: list, kwargs: dict) -> Any:
    what = f"torch.{op}(..., device=...)"
    session = session_for(kwargs.get("device"), what)
    if kwargs.get("generator") is not None:
        raise RuntimeError(f"{what}: a local torch.Generator cannot drive the server; remote random factories "
                           "draw from the session's generator (seed it with torch.manual_seed or sess.manual_seed)")
    layout = kwargs.get("layout")
    if layout not in (None, torch.strided):
        raise RuntimeError(f"{what}: only the strided layout exists on the remote device, not {layout}")
    options = {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {}
    out = call_op(session, op, args, options)
    MADE.refs.append(weakref.ref(out))
    return out


@_kernel("empty.memory_format")
def _empty(size, **kw):
    return _factory_call("empty", [tuple(size)], kw)


@_kernel("empty_strided")
def _empty_strided(size, stride, **kw):
    return _factory_call("empty", [tuple(size)], kw)


@_kernel("zeros")
def _zeros(size, **kw):
    return _factory_call("zeros", [tuple(size)], kw)


@_kernel("ones")
def _ones(size, **kw):
    return _factory_call("ones", [tuple(size)], kw)


@_kernel("full")
def _full(size, fill_value, **kw):
    return _factory_call("full", [tuple(size), fill_value], kw)


@_kernel("scalar_tensor")
def _scalar_tensor(s, **kw):
    return _factory_call("full", [(), s], kw)


@_kernel("arange", "arange.start", "arange.start_step")
def _arange(*args, **kw):
    return _factory_call("arange", list(args), kw)


@_kernel("linspace")
def _linspace(start, end, steps, **kw):
    return _factory_call("linspace", [start, end, steps], kw)


@_kernel("eye", "eye.m")
def _eye(*args, **kw):
    return _factory_call("eye", list(args), kw)


@_kernel("rand", "rand.generator")
def _rand(size, generator=None, **kw):
    return _factory_call("rand", [tuple(size)], {**kw, "generator": generator})


@_kernel("randn", "randn.generator")
def _randn(size, generator=None, **kw):
    return _factory_call("randn", [tuple(size)], {**kw, "generator": generator})


@_kernel("randint", "randint.generator")
def _randint(high, size, generator=None, **kw):
    return _factory_call("randint", [high, tuple(size)], {**kw, "generator": generator})


@_kernel("randint.low", "randint.low_generator")
def _randint_low(low, high, size, generator=None, **kw):
    return _factory_call("randint", [low, high, tuple(size)], {**kw, "generator": generator})


@_kernel("randperm", "randperm.generator")
def _randperm(n, generator=None, **kw):
    return _factory_call("randperm", [n], {**kw, "generator": generator})


@_kernel("_to_copy")
def _to_copy(src: torch.Tensor, **kw):
    """A local tensor moved to the remote device: uploaded (its dtype converted locally first)."""
    out = upload_move(src, session_for(kw.get("device"), "Tensor.to(device)"), kw.get("dtype"))
    if isinstance(out, RemoteTensor):  # not a lazy module's uninitialized tensor, which stays local until used
        MADE.refs.append(weakref.ref(out))  # torch.tensor(data, device=..., requires_grad=True) sets the flag afterwards
    return out


def register_kernels() -> None:
    """Register every kernel of ``KERNELS`` with torch's dispatcher (once, as this module is imported)."""
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")
    for name, fn in KERNELS.items():
        _LIB.impl(name, fn, "PrivateUse1")


register_kernels()

"""An op's outputs worked out on the client: shapes, dtypes, and which outputs are views of which inputs.

The op's shape rule (from the server's table) says how. Elementwise ops, ``linear``, losses
and ops shaped like their input use the cheap rules of ``_infer`` (broadcasting, type
promotion); anything else runs the torch function on meta stand-ins of its arguments
(``_infer.on_meta``), whose outputs also say which are views of which input, with what
strides (``_views.describe``, what ``_views.settle`` reads). ``none`` (value-dependent
shapes) and anything meta cannot tell: the caller asks the server.

This is the plain path; ``_meta_memo`` keeps its answers for arguments it has seen.
An answer names a view's source by its position among the call's RemoteTensors
(``_core.tensors_of``), so that it holds no handle and fits any call with the same metadata.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._core import RemoteTensor, tensors_of
from ..tensor import _views
from . import _infer

# (metas, container type or None, views): metas are (shape, dtype) pairs; views one
# (source position or None, layout, byte offset from the source's start) per meta output, empty
# when a cheap rule answered
Answer = tuple[Any, Any, tuple]
NOTHING: Answer = (None, None, ())
_CHEAP: Answer = ()  # the views of a cheap rule's answer: none (those ops never return views)


def infer(rule: str, func: Callable | None, args: tuple, kwargs: dict, tensors: list) -> Answer:
    """The outputs of ``func(*args, **kwargs)`` under shape rule ``rule``, or ``NOTHING`` to ask the server.
    ``tensors``: the call's RemoteTensors in ``tensors_of`` order (filled here when empty)."""
    if rule in ("elementwise", "elementwise_float"):
        operands = [a if isinstance(a, (bool, int, float)) else _shape_dtype(a) for a in args]
        if None not in operands:
            metas = _infer.elementwise(operands, to_float=rule == "elementwise_float")
            if metas is not None:
                return tuple(metas), None, _CHEAP
    first = _shape_dtype(args[0]) if args else None
    if rule == "like_input" and first and not any(isinstance(v, torch.dtype) for v in (*args, *kwargs.values())):
        return (first,), None, _CHEAP
    if rule == "linear" and 2 <= len(args) <= 3 and not kwargs:
        bias = args[2] if len(args) > 2 else None
        x, w, b = first, _shape_dtype(args[1]), _shape_dtype(bias)
        metas = _infer.linear(x, w, b) if x and w and (bias is None or b) else None
        if metas is not None:
            return tuple(metas), None, _CHEAP
    if (rule == "loss" and len(args) <= 3 and kwargs.get("reduction", "mean") != "none"
            and kwargs.get("reduce") is None and kwargs.get("size_average") is None and first):
        return (((), first[1]),), None, _CHEAP
    if func is None or rule == "none":
        return NOTHING
    return on_meta(func, args, kwargs, tensors)


def on_meta(func: Callable, args: tuple, kwargs: dict, tensors: list) -> Answer:
    """``func`` on meta stand-ins; its outputs described for ``_views.settle``."""
    raw: list = []
    metas, container = _infer.on_meta(func, tuple(_to_meta(a) for a in args),
                                      {k: _to_meta(v) for k, v in kwargs.items()}, raw)
    if metas is None:
        return NOTHING
    if torch.is_grad_enabled() and _any_requires_grad((args, kwargs)):
        metas = _infer.mark_non_differentiable(metas, func, _to_grad_meta(args), _to_grad_meta(kwargs))
    if raw and not tensors:
        tensors_of((args, kwargs), tensors)
    views = tuple((None if src is None else _position(src, tensors), layout, offset)
                  for src, layout, offset in _views.describe(raw, tensors))
    return tuple(metas), container, views


def with_sources(found: Answer, tensors: list) -> Answer:
    """``found`` with each view's source as the RemoteTensor itself (``_views.settle`` takes those)."""
    metas, container, views = found
    if not views:
        return found
    sourced = []
    for pos, layout, offset in views:  # a loop, not tuple(genexpr): no generator frame per op
        sourced.append((None if pos is None else tensors[pos], layout, offset))
    return metas, container, tuple(sourced)


def _position(t, tensors: list) -> int:
    return next(i for i, seen in enumerate(tensors) if seen is t)


def _shape_dtype(v: Any) -> tuple[tuple[int, ...], torch.dtype] | None:
    """``(shape, dtype)`` of a tensor argument, read without a ``__torch_function__`` call; None for others."""
    if isinstance(v, RemoteTensor):
        return v._shape, v._dtype
    if isinstance(v, torch.Tensor):
        return tuple(v.shape), v.dtype
    return None


def _any_requires_grad(v: Any) -> bool:
    return any(t._rg if isinstance(t, RemoteTensor) else t.requires_grad for t in tensors_of(v, [], local=True))


def _to_grad_meta(v: Any) -> Any:
    """Fresh meta stand-ins that require grad where the argument does (not the kept ones of
    ``_to_meta``: autograd would record on them), for ``_infer.mark_non_differentiable``."""
    if isinstance(v, (RemoteTensor, torch.Tensor)):
        meta = _to_meta(v).detach().clone()
        wants = v._rg if isinstance(v, RemoteTensor) else v.requires_grad
        return meta.requires_grad_() if wants else meta
    if isinstance(v, dict):
        return {k: _to_grad_meta(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_to_grad_meta(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_to_grad_meta(x) for x in v)
    return v


def _to_meta(v: Any) -> Any:
    if isinstance(v, RemoteTensor):
        return v._meta()
    if isinstance(v, torch.Tensor):
        return v.detach().to("meta")
    if isinstance(v, list):
        return [_to_meta(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_to_meta(x) for x in v)
    return v

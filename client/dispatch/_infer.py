"""Result metadata on the client: shape and dtype of an op's outputs without asking the server.

Elementwise ops use broadcasting and torch's promotion rules (microseconds);
everything else runs the torch function itself on the meta device. When even
meta cannot say (value-dependent shapes), ``infer`` returns None and the caller
asks the server.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

_PROXIES: dict[tuple[torch.dtype, bool], torch.Tensor] = {}


def _proxy(dtype: torch.dtype, zero_dim: bool) -> torch.Tensor:
    """A tiny real tensor with a dtype and 0-d-ness: all ``torch.result_type`` looks at."""
    key = (dtype, zero_dim)
    t = _PROXIES.get(key)
    if t is None:
        t = _PROXIES[key] = torch.empty(() if zero_dim else (1,), dtype=dtype)
    return t


Meta = tuple[tuple[int, ...], torch.dtype]


def elementwise(operands: list[Any], *, to_float: bool = False) -> list[Meta] | None:
    """Broadcast shape and promoted dtype of tensors (``(shape, dtype)`` pairs) and numbers.

    ``to_float``: integer and bool results become the default float dtype (torch's rule for sqrt, exp, ...).
    """
    shapes, typed = [], []
    for v in operands:
        if isinstance(v, tuple):
            shapes.append(v[0])
            typed.append(_proxy(v[1], len(v[0]) == 0))
        elif isinstance(v, (bool, int, float, complex)):
            typed.append(v)
        else:
            return None
    if not shapes:
        return None
    if len(typed) == 1:
        dtype = typed[0].dtype
    elif len(typed) == 2:
        dtype = torch.result_type(typed[0], typed[1])
    else:
        return None
    if to_float and not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.get_default_dtype()
    if not (dtype.is_floating_point or dtype.is_complex):
        return None  # integer results differ per op (true division, float-only ops): ask meta
    shape = broadcast(shapes)
    if shape is None:
        return None  # let the server report torch's own error
    return [(shape, dtype)]


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """torch's broadcasting of shapes, in plain Python (``torch.broadcast_shapes`` costs ~30 us)."""
    first = tuple(shapes[0])
    if all(tuple(s) == first for s in shapes[1:]):
        return first
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, d in enumerate(s, ndim - len(s)):
            if d != 1:
                if out[i] not in (1, d):
                    return None
                out[i] = d
    return tuple(out)


def linear(x: Meta, w: Meta, b: Meta | None) -> list[Meta] | None:
    """``F.linear`` for the common case: 2-d weight, last dim matching, same floating dtypes (``b``: None, no bias)."""
    (x_shape, x_dtype), (w_shape, w_dtype) = x, w
    if len(w_shape) != 2 or not x_shape or x_dtype != w_dtype or not x_dtype.is_floating_point:
        return None
    if x_shape[-1] != w_shape[1] or (b is not None and (b[1] != x_dtype or tuple(b[0]) not in ((w_shape[0],), (), (1,)))):
        return None
    return [(tuple(x_shape[:-1]) + (w_shape[0],), x_dtype)]


def on_meta(func: Callable, args: tuple, kwargs: dict, raw: list | None = None
            ) -> tuple[list[Meta] | None, type | None]:
    """Run ``func`` on meta tensors (args already converted): the outputs' metadata and, for
    several outputs, the sequence type to rebuild (a tuple, or torch's named ``return_types``).
    ``(None, None)`` when meta cannot tell (value-dependent shapes, an error torch will report).
    ``raw``, when given, receives the meta outputs themselves (their strides, whether they are views)."""
    try:
        with torch.no_grad():
            out = func(*args, **kwargs)
    except Exception:
        return None, None
    if isinstance(out, torch.Tensor):
        if raw is not None:
            raw.append(out)
        return [(tuple(out.shape), out.dtype)], None
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        if raw is not None:
            raw.extend(out)
        return [(tuple(o.shape), o.dtype) for o in out], type(out)
    if isinstance(out, tuple) and all(o is None or isinstance(o, torch.Tensor) for o in out):
        # optional outputs left out (``(attn_output, None)``): the server sends only the tensors
        return [(tuple(o.shape), o.dtype) for o in out if o is not None], _with_nones_at(tuple(o is None for o in out))
    return None, None


def mark_non_differentiable(metas: list[Meta], func: Callable, args: tuple, kwargs: dict) -> list[Meta]:
    """``metas`` with a third item, ``False``, on each floating output torch's autograd leaves
    without a graph although an input requires grad (``native_layer_norm``'s mean and rstd,
    ``linalg.lu``'s permutation): found by running ``func`` once more on meta, with grad on and
    stand-ins that require grad where the arguments do. Without it the handle would claim
    ``requires_grad=True`` where torch says False. Anything meta cannot run keeps the plain rule."""
    try:
        with torch.enable_grad():
            out = func(*args, **kwargs)
    except Exception:
        return metas
    outs = [out] if isinstance(out, torch.Tensor) else [o for o in out if o is not None] \
        if isinstance(out, (tuple, list)) else []
    if len(outs) != len(metas) or not all(isinstance(o, torch.Tensor) for o in outs):
        return metas
    return [meta + (False,) if (meta[1].is_floating_point or meta[1].is_complex) and not o.requires_grad else meta
            for meta, o in zip(metas, outs)]


@functools.cache  # one rebuild per pattern: answers that equal each other compare equal (the meta memo's check)
def _with_nones_at(nones: tuple[bool, ...]) -> Callable[[list], tuple]:
    """Rebuild a tuple with a None where ``nones`` says and the given tensors, in order, elsewhere."""
    def rebuild(tensors: list) -> tuple:
        it = iter(tensors)
        return tuple(None if none else next(it) for none in nones)
    return rebuild

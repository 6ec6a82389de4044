"""Reductions: the gradient of a reduction is the output grad broadcast back over the reduced dims."""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T


def _dims(dim, ndim: int) -> tuple[int, ...]:
    """The reduced dims, normalised and sorted; ``None`` (or ``[]``) means all of them."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted(d % ndim if ndim else 0 for d in dim))


def _expand_back(g: torch.Tensor, shape: torch.Size, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Undo a reduction's shape change: unsqueeze the dropped dims, then expand."""
    if not keepdim and len(shape):
        for d in dims:
            g = g.unsqueeze(d)
    return g.expand(shape)


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        ctx.shape, ctx.dims, ctx.keepdim, ctx.in_dtype = x.shape, _dims(dim, x.dim()), keepdim, x.dtype
        if dim is None:
            return torch.sum(x, dtype=dtype)
        return torch.sum(x, dim, keepdim=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        return _expand_back(g, ctx.shape, ctx.dims, ctx.keepdim).to(ctx.in_dtype), None, None, None


_REDUCE_SAMPLES = (
    S(T((2, 3))),
    S(T((2, 3, 4)), 1),
    S(T((2, 3, 4)), (0, 2), keepdim=True),
    S(T((2, 3)), -1, True),
    S(T(())),
    S(T((3, 2), noncontiguous=True), 0),
    S(T((0, 3)), 1),
)


@op("sum", torch_names=("torch.sum", "torch.Tensor.sum"), samples=_REDUCE_SAMPLES, reference=torch.sum)
def sum(input, dim=None, keepdim=False, *, dtype=None):
    """sum over all elements or over ``dim``"""
    return Sum.apply(input, dim, keepdim, dtype)


class Mean(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        dims = _dims(dim, x.dim())
        ctx.shape, ctx.dims, ctx.keepdim, ctx.in_dtype = x.shape, dims, keepdim, x.dtype
        ctx.count = 1
        for d in dims:
            ctx.count *= x.shape[d] if x.dim() else 1
        if dim is None:
            return torch.mean(x, dtype=dtype)
        return torch.mean(x, dim, keepdim=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        g = _expand_back(g, ctx.shape, ctx.dims, ctx.keepdim) / ctx.count
        return g.to(ctx.in_dtype), None, None, None


@op("mean", torch_names=("torch.mean", "torch.Tensor.mean"), samples=_REDUCE_SAMPLES[:-1], reference=torch.mean)
def mean(input, dim=None, keepdim=False, *, dtype=None):
    """mean over all elements or over ``dim``"""
    return Mean.apply(input, dim, keepdim, dtype)

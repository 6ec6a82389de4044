"""Shape ops: the gradient is the output grad put back into the input's shape."""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T


def _shape_arg(shape) -> tuple[int, ...]:
    """Accept both ``x.reshape(2, 3)`` and ``x.reshape((2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    return tuple(shape)


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.in_shape), None


@op("reshape", torch_names=("torch.reshape", "torch.Tensor.reshape", "torch.Tensor.view"),
    samples=(S(T((2, 3)), (3, 2)), S(T((2, 3)), (-1,)), S(T((2, 3, 4)), 6, -1), S(T((3, 2), noncontiguous=True), (6,)),
             S(T(()), (1, 1))),
    reference=lambda x, *shape: x.reshape(_shape_arg(shape)))
def reshape(input, *shape):
    """the same values in a new shape (``-1`` infers one dim)"""
    return Reshape.apply(input, _shape_arg(shape))


class Transpose(Function):
    @staticmethod
    def forward(ctx, x, dim0, dim1):
        ctx.dims = (dim0, dim1)
        return x.transpose(dim0, dim1)

    @staticmethod
    def backward(ctx, g):
        return g.transpose(*ctx.dims), None, None


@op("transpose", torch_names=("torch.transpose", "torch.swapaxes", "torch.swapdims", "torch.Tensor.transpose",
                              "torch.Tensor.swapaxes", "torch.Tensor.swapdims"),
    samples=(S(T((2, 3)), 0, 1), S(T((2, 3, 4)), -1, 0), S(T((3, 2), noncontiguous=True), 1, 0)),
    reference=torch.transpose)
def transpose(input, dim0, dim1):
    """swap two dims"""
    return Transpose.apply(input, dim0, dim1)

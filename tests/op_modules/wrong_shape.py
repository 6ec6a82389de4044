"""A broken custom op: its gradient has the wrong shape."""

import torch

from remote_autograd.service.ops import S, T, op


class SumRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.sum(0)

    @staticmethod
    def backward(ctx, g):
        return g  # should be expanded back to the input's shape


@op("test_bad_shape", samples=(S(T((2, 3))),), reference=None, exact=False)
def test_bad_shape(x):
    """sum over rows with a gradient of the wrong shape"""
    return SumRows.apply(x)

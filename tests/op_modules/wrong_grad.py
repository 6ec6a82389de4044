"""A broken custom op: declares an exact gradient but its backward is off by a factor 2."""

import torch

from remote_autograd.service.ops import S, T, op


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 6 * x ** 2


@op("test_bad_cube", samples=(S(T((2, 3))),), reference=None)
def test_bad_cube(x):
    """x ** 3 with a wrong gradient"""
    return Cube.apply(x)

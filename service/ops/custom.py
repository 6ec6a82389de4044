"""Custom-gradient ops: the use case this project started from. Both are not exact by design.

Register your own the same way: write the Function, then an ``@op`` function
with samples (see README, "Custom ops").
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T


class StraightThroughRound(Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g  # straight-through: pretend round was the identity


@op("straight_through_round", samples=(S(T((2, 3))), S(T(()))), reference=None, exact=False, shape_rule="elementwise")
def straight_through_round(x):
    """round(x) forward, identity gradient (straight-through estimator)"""
    return StraightThroughRound.apply(x)


class ClipGrad(Function):
    @staticmethod
    def forward(ctx, x, max_norm):
        ctx.max_norm = float(max_norm)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        norm = torch.linalg.vector_norm(g)
        scale = torch.clamp(ctx.max_norm / (norm + 1e-6), max=1.0)
        return g * scale, None


@op("clip_grad", samples=(S(T((2, 3)), 0.5), S(T((4,)), 10.0)), reference=None, exact=False, shape_rule="elementwise")
def clip_grad(x, max_norm):
    """identity forward; in backward the gradient's norm is clipped to ``max_norm``"""
    return ClipGrad.apply(x, max_norm)

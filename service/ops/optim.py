"""Fused arithmetic the optimizers use: ``addcmul`` and ``addcdiv`` (and their in-place forms)."""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import TensorLike, needs, sum_to
from ._registry import op
from ._samples import S, T

_SAMPLES = (
    S(T((2, 3)), T((2, 3)), T((2, 3), low=0.5, high=2.0)),
    S(T((2, 3)), T((3,)), T((2, 1), low=0.5, high=2.0), value=-0.3),
    S(T(()), T((2,)), T((2,), low=0.5, high=2.0), value=2.0),
)


class AddCMul(Function):
    @staticmethod
    def forward(ctx, x, t1, t2, value):
        ctx.save_for_backward(t1, t2)
        ctx.x, ctx.value = (x.shape, x.dtype), value
        return torch.addcmul(x, t1, t2, value=value)

    @staticmethod
    def backward(ctx, g):
        t1, t2 = ctx.saved_tensors
        gx = sum_to(g, TensorLike(*ctx.x)) if needs(ctx, 0) else None
        g1 = sum_to(g * t2 * ctx.value, t1) if needs(ctx, 1) else None
        g2 = sum_to(g * t1 * ctx.value, t2) if needs(ctx, 2) else None
        return gx, g1, g2, None


@op("addcmul", torch_names=("torch.addcmul", "torch.Tensor.addcmul", "torch.Tensor.addcmul_"), samples=_SAMPLES,
    reference=torch.addcmul, native=torch.addcmul, native_inplace=torch.Tensor.addcmul_)
def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2"""
    return AddCMul.apply(input, tensor1, tensor2, value)


class AddCDiv(Function):
    @staticmethod
    def forward(ctx, x, t1, t2, value):
        ctx.save_for_backward(t1, t2)
        ctx.x, ctx.value = (x.shape, x.dtype), value
        return torch.addcdiv(x, t1, t2, value=value)

    @staticmethod
    def backward(ctx, g):
        t1, t2 = ctx.saved_tensors
        gx = sum_to(g, TensorLike(*ctx.x)) if needs(ctx, 0) else None
        g1 = sum_to(g * ctx.value / t2, t1) if needs(ctx, 1) else None
        g2 = sum_to(-g * ctx.value * t1 / (t2 * t2), t2) if needs(ctx, 2) else None
        return gx, g1, g2, None


@op("addcdiv", torch_names=("torch.addcdiv", "torch.Tensor.addcdiv", "torch.Tensor.addcdiv_"), samples=_SAMPLES,
    reference=torch.addcdiv, native=torch.addcdiv, native_inplace=torch.Tensor.addcdiv_)
def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2"""
    return AddCDiv.apply(input, tensor1, tensor2, value)

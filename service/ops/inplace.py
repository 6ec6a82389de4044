"""Ops that only exist in place: ``zero_``, ``fill_``, ``copy_``.

Each returns the tensor's new value; the runner writes it into the target (see
``runner._run_inplace``), so version counters and leaf checks behave as in torch.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import TensorLike, needs, sum_to
from ._registry import op
from ._samples import S, T


class Fill(Function):
    @staticmethod
    def forward(ctx, target, value):
        ctx.value_is_tensor = isinstance(value, torch.Tensor)
        ctx.value_dtype = value.dtype if ctx.value_is_tensor else None
        return torch.full_like(target, 0).copy_(value if ctx.value_is_tensor else torch.tensor(value))

    @staticmethod
    def backward(ctx, g):
        # the old values are overwritten: no gradient to them; a tensor fill value gets the sum
        gv = g.sum().to(ctx.value_dtype) if ctx.value_is_tensor and needs(ctx, 1) else None
        return (g * 0 if needs(ctx, 0) else None), gv


@op("fill_", native_inplace=torch.Tensor.fill_, torch_names=("torch.Tensor.fill_",), inplace=True,
    samples=(S(T((2, 3)), 1.5), S(T((2, 3)), T(())), S(T((0,)), 2.0)),
    reference=lambda target, value: target.clone().fill_(value), shape_rule="none")
def fill_(input, value):
    """every element set to ``value`` (a number or a 0-d tensor)"""
    return Fill.apply(input, value)


@op("zero_", native_inplace=torch.Tensor.zero_, torch_names=("torch.Tensor.zero_",), inplace=True, samples=(S(T((2, 3))), S(T(()))),
    reference=lambda target: target.clone().zero_(), shape_rule="none")
def zero_(input):
    """every element set to zero"""
    return Fill.apply(input, 0)


class Copy(Function):
    @staticmethod
    def forward(ctx, target, src):
        ctx.src = (src.shape, src.dtype)
        return src.to(target.dtype).expand(target.shape).clone()

    @staticmethod
    def backward(ctx, g):
        shape, dtype = ctx.src
        gs = sum_to(g, TensorLike(shape, dtype)) if needs(ctx, 1) else None
        return (g * 0 if needs(ctx, 0) else None), gs


@op("copy_", native_inplace=torch.Tensor.copy_, torch_names=("torch.Tensor.copy_",), inplace=True,
    samples=(S(T((2, 3)), T((2, 3))), S(T((2, 3)), T((3,))), S(T((2, 3)), T((2, 3), noncontiguous=True))),
    reference=lambda target, src: target.clone().copy_(src), shape_rule="none")
def copy_(input, src, non_blocking=False):
    """the values of ``src`` (broadcast, cast to the target's dtype) written into the target"""
    return Copy.apply(input, src)

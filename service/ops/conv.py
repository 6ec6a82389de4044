"""Convolutions and 2-d pooling.

Each Function calls aten's forward kernel and, in backward, aten's own derivative
kernel (``convolution_backward``, ``max_pool2d_with_indices_backward``, ...): those
kernels are differentiable themselves, so double backward works.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import needs
from ._registry import op
from ._samples import S, T
from .nn import pad as _pad

aten = torch.ops.aten


def _ntuple(value, n: int) -> list[int]:
    """An int or a sequence (one value or ``n``) as a list of ``n`` ints, as torch's ``_pair`` does."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value] * n if len(value) == 1 else [int(v) for v in value]
    return [int(value)] * n


class Conv(Function):
    """aten.convolution, direct or transposed; an unbatched input gets a batch dim of 1 meanwhile."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
        ctx.unbatched = x.dim() == w.dim() - 1
        ctx.args = (stride, padding, dilation, transposed, output_padding, groups)
        ctx.bias_sizes = list(b.shape) if b is not None else None
        ctx.save_for_backward(x, w)
        out = aten.convolution(x.unsqueeze(0) if ctx.unbatched else x, w, b, *ctx.args)
        return out.squeeze(0) if ctx.unbatched else out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if ctx.unbatched:
            x, g = x.unsqueeze(0), g.unsqueeze(0)
        mask = [needs(ctx, 0), needs(ctx, 1), ctx.bias_sizes is not None and needs(ctx, 2)]
        gx, gw, gb = aten.convolution_backward(g, x, w, ctx.bias_sizes, *ctx.args, mask)
        if ctx.unbatched and gx is not None:
            gx = gx.squeeze(0)
        return gx, gw, gb, None, None, None, None, None, None


def _same_padding(input, weight, stride, dilation):
    """padding='same' as torch does it: symmetric padding, plus one extra on the right where odd."""
    if any(s != 1 for s in stride):
        raise ValueError("padding='same' is not supported for strided convolutions")
    total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    extra = [t % 2 for t in total]
    if any(extra):  # F.pad lists the last dim first
        input = _pad(input, [p for e in reversed(extra) for p in (0, e)])
    return input, [t // 2 for t in total]


def _conv(input, weight, bias, stride, padding, dilation, groups, n):
    stride, dilation = _ntuple(stride, n), _ntuple(dilation, n)
    if padding == "valid":
        padding = 0
    elif padding == "same":
        input, padding = _same_padding(input, weight, stride, dilation)
    elif isinstance(padding, str):
        raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
    return Conv.apply(input, weight, bias, stride, _ntuple(padding, n), dilation, False, [0] * n, groups)


@op("conv1d", torch_names=("torch.nn.functional.conv1d",),
    samples=(S(T((2, 2, 5)), T((3, 2, 3)), T((3,))), S(T((2, 5)), T((3, 2, 3))),
             S(T((1, 4, 7)), T((4, 2, 2)), T((4,)), stride=2, padding=1, dilation=2, groups=2),
             S(T((1, 2, 5)), T((2, 2, 4)), None, padding="same", dilation=1),
             S(T((1, 2, 6)), T((3, 2, 3)), T((3,)), padding="valid")),
    reference=torch.nn.functional.conv1d)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-d convolution (cross-correlation); padding may be 'same' or 'valid'"""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 1)


@op("conv2d", torch_names=("torch.nn.functional.conv2d",),
    samples=(S(T((2, 2, 4, 4)), T((2, 2, 3, 3)), T((2,))), S(T((2, 4, 4)), T((2, 2, 2, 3))),
             S(T((1, 4, 5, 4)), T((2, 2, 3, 2)), None, (2, 1), (1, 2), 1, 2),
             S(T((1, 2, 4, 4)), T((2, 2, 2, 2)), T((2,)), padding="same", dilation=(1, 2)),
             S(T((1, 2, 3, 4)), T((2, 1, 2, 3)), padding="same", groups=2),
             S(T((1, 2, 5, 5), noncontiguous=True), T((1, 2, 2, 2)), dilation=2, padding="valid")),
    reference=torch.nn.functional.conv2d)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-d convolution (cross-correlation); padding may be 'same' or 'valid'"""
    return _conv(input, weight, bias, stride, padding, dilation, groups, 2)


@op("conv_transpose2d", torch_names=("torch.nn.functional.conv_transpose2d",),
    samples=(S(T((2, 2, 3, 3)), T((2, 2, 2, 2)), T((2,))), S(T((2, 3, 3)), T((2, 2, 2, 2))),
             S(T((1, 4, 3, 4)), T((4, 1, 3, 2)), T((2,)), 2, 1, 1, 2),
             S(T((1, 2, 3, 3)), T((2, 2, 3, 3)), stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
               dilation=(1, 2))),
    reference=torch.nn.functional.conv_transpose2d)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """2-d transposed convolution"""
    return Conv.apply(input, weight, bias, _ntuple(stride, 2), _ntuple(padding, 2), _ntuple(dilation, 2), True,
                      _ntuple(output_padding, 2), groups)


def _pool_args(kernel_size, stride, padding):
    kernel_size = _ntuple(kernel_size, 2)
    stride = _ntuple(stride, 2) if stride is not None and stride != [] and stride != () else kernel_size
    return kernel_size, stride, _ntuple(padding, 2)


class MaxPool2d(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, dilation, ceil_mode):
        ctx.args = (kernel_size, stride, padding, dilation, ceil_mode)
        out, idx = aten.max_pool2d_with_indices(x, *ctx.args)
        ctx.save_for_backward(x, idx)
        ctx.mark_non_differentiable(idx)
        return out, idx

    @staticmethod
    def backward(ctx, g, _g_idx):
        x, idx = ctx.saved_tensors
        return aten.max_pool2d_with_indices_backward(g, x, *ctx.args, idx), None, None, None, None, None


def _max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode):
    kernel_size, stride, padding = _pool_args(kernel_size, stride, padding)
    return MaxPool2d.apply(input, kernel_size, stride, padding, _ntuple(dilation, 2), ceil_mode)


_MAX_POOL_SAMPLES = (
    S(T((2, 2, 4, 4)), 2), S(T((2, 5, 5)), 3, 2, 1),
    S(T((1, 2, 5, 6), noncontiguous=True), (2, 3), (1, 2), (1, 0), 1, True),
    S(T((1, 1, 7, 7)), 2, dilation=2, ceil_mode=True, return_indices=True),
)


@op("max_pool2d", torch_names=("torch.nn.functional.max_pool2d", "torch.max_pool2d"),
    samples=_MAX_POOL_SAMPLES, reference=torch.nn.functional.max_pool2d)
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """2-d max pooling; with return_indices, (output, int64 flat indices into each H*W plane)"""
    out, idx = _max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)
    return (out, idx) if return_indices else out


@op("max_pool2d_with_indices", torch_names=("torch.nn.functional.max_pool2d_with_indices",),
    samples=_MAX_POOL_SAMPLES, reference=torch.nn.functional.max_pool2d_with_indices)
def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """2-d max pooling, always (output, indices): what F.max_pool2d(return_indices=True) calls"""
    return _max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)


class AvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        ctx.args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        ctx.save_for_backward(x)
        return aten.avg_pool2d(x, *ctx.args)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (aten.avg_pool2d_backward(g, x, *ctx.args),) + (None,) * 6


@op("avg_pool2d", torch_names=("torch.nn.functional.avg_pool2d",),
    samples=(S(T((2, 2, 4, 4)), 2), S(T((2, 5, 5)), 3, 2, 1),
             S(T((1, 2, 5, 6), noncontiguous=True), (2, 3), (1, 2), (1, 0), True, False),
             S(T((1, 1, 5, 5)), 2, ceil_mode=True, divisor_override=3)),
    reference=torch.nn.functional.avg_pool2d)
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """2-d average pooling"""
    kernel_size, stride, padding = _pool_args(kernel_size, stride, padding)
    return AvgPool2d.apply(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


class AdaptiveAvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, output_size):
        ctx.save_for_backward(x)
        return aten._adaptive_avg_pool2d(x, output_size)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return aten._adaptive_avg_pool2d_backward(g, x), None


@op("adaptive_avg_pool2d", torch_names=("torch.nn.functional.adaptive_avg_pool2d",),
    samples=(S(T((2, 2, 4, 4)), 1), S(T((2, 5, 5)), (2, 3)), S(T((1, 2, 5, 7), noncontiguous=True), (None, 3)),
             S(T((1, 1, 3, 3)), 5)),
    reference=torch.nn.functional.adaptive_avg_pool2d)
def adaptive_avg_pool2d(input, output_size):
    """2-d adaptive average pooling to ``output_size`` (None keeps that input size)"""
    size = _ntuple(output_size, 2) if not isinstance(output_size, (list, tuple)) else list(output_size)
    size = [input.shape[-2 + i] if s is None else int(s) for i, s in enumerate(size)]
    return AdaptiveAvgPool2d.apply(input, size)

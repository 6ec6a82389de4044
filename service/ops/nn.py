"""nn layers: linear maps, embedding, normalisation, padding, resampling.

Normalisation and resampling backwards are aten's derivative kernels
(``native_layer_norm_backward``, ``upsample_bilinear2d_backward``, ...), which are
differentiable themselves; the rest are plain formulas. Convolutions and pooling
live in ``conv.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ._grad import like_of, needs, sum_to
from ._registry import op
from ._samples import S, T

aten = torch.ops.aten



class Linear(Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.w, ctx.b = like_of(w), like_of(b)
        out = F.linear(x, w, b)
        ctx.out_shape = out.shape
        return out

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if w.dim() == 1:  # a 1-d weight is one output feature, squeezed away
            w, g = w.unsqueeze(0), g.unsqueeze(-1)
        gx = g @ w if needs(ctx, 0) else None
        gw = _linear_weight_grad(g, x, w, ctx.w.shape) if needs(ctx, 1) else None
        gb = sum_to(_viewed(g, ctx.out_shape), ctx.b) if needs(ctx, 2) else None
        return gx, gw, gb


def _linear_weight_grad(g, x, w, shape):
    """g^T x summed over every leading dim, shaped like the weight."""
    if g.dim() != 2 or x.dim() != 2:  # a batch of vectors needs no reshape: the very same operands
        g, x = g.reshape(-1, w.shape[0]), x.reshape(-1, x.shape[-1])
    return _viewed(g.mT @ x, shape)


def _viewed(t, shape):
    """``t.view(shape)``, or ``t`` itself when it has that shape already (one op less, the same values)."""
    return t if t.shape == shape else t.view(shape)


@op("linear", torch_names=("torch.nn.functional.linear",), shape_rule="linear",
    samples=(S(T((2, 3)), T((4, 3)), T((4,))), S(T((3,)), T((4, 3))), S(T((2, 5, 3)), T((4, 3)), T(())),
             S(T((3, 2), noncontiguous=True), T((4, 2)), T((4,))), S(T((2, 3)), T((3,))), S(T((3,)), T((3,)), T(())),
             S(T((0, 3)), T((2, 3)), T((2,)))),
    reference=F.linear)
def linear(input, weight, bias=None):
    """input @ weight.T + bias"""
    return Linear.apply(input, weight, bias)


class Bilinear(Function):
    @staticmethod
    def forward(ctx, x1, x2, w, b):
        ctx.save_for_backward(x1, x2, w)
        ctx.b = like_of(b)
        return F.bilinear(x1, x2, w, b)

    @staticmethod
    def backward(ctx, g):
        x1, x2, w = ctx.saved_tensors
        g1 = torch.einsum("...o,oij,...j->...i", g, w, x2) if needs(ctx, 0) else None
        g2 = torch.einsum("...o,oij,...i->...j", g, w, x1) if needs(ctx, 1) else None
        gw = torch.einsum("...o,...i,...j->oij", g, x1, x2) if needs(ctx, 2) else None
        gb = sum_to(g, ctx.b) if needs(ctx, 3) else None
        return g1, g2, gw, gb


@op("bilinear", torch_names=("torch.nn.functional.bilinear",),
    samples=(S(T((2, 3)), T((2, 4)), T((5, 3, 4)), T((5,))), S(T((2, 2, 3)), T((2, 2, 2)), T((4, 3, 2))),
             S(T((3, 2), noncontiguous=True), T((3, 3)), T((2, 2, 3)), T((2,)))),
    reference=F.bilinear)
def bilinear(input1, input2, weight, bias=None):
    """x1^T A x2 + b for each output feature"""
    return Bilinear.apply(input1, input2, weight, bias)


class Embedding(Function):
    @staticmethod
    def forward(ctx, weight, indices, padding_idx, scale_grad_by_freq):
        ctx.save_for_backward(indices)
        ctx.args = (weight.shape[0], padding_idx, scale_grad_by_freq)
        return torch.embedding(weight, indices, padding_idx, scale_grad_by_freq)

    @staticmethod
    def backward(ctx, g):
        (indices,) = ctx.saved_tensors
        return aten.embedding_backward(g, indices, *ctx.args, False), None, None, None


_IDX = T((2, 3), dtype="int64", low=0, high=4, requires_grad=False)  # never row 4: see below


# padding_idx and scale_grad_by_freq make the gradient differ from the true derivative (torch's design), which
# gradcheck would reject: samples leave the padding row unused and scale_grad_by_freq out.
@op("embedding", torch_names=("torch.nn.functional.embedding",),
    samples=(S(_IDX, T((5, 3))), S(T((4,), dtype="int64", low=0, high=4, requires_grad=False), T((5, 2)), 4),
             S(_IDX, T((5, 3)), padding_idx=-1),
             S(T((), dtype="int64", low=0, high=3, requires_grad=False), T((3, 5), noncontiguous=True))),
    reference=F.embedding)
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """rows of ``weight`` picked by ``input``; no gradient reaches row ``padding_idx``"""
    if sparse:
        raise ValueError("embedding: sparse gradients are not supported")
    n = weight.shape[0]
    if padding_idx is None:
        padding_idx = -1
    elif not -n <= padding_idx < n:
        raise ValueError("Padding_idx must be within num_embeddings")
    elif padding_idx < 0:
        padding_idx += n
    if max_norm is not None:  # as torch: renormalise the looked-up rows of weight in place
        with torch.no_grad():
            torch.embedding_renorm_(weight, input.contiguous(), max_norm, norm_type)
    return Embedding.apply(weight, input, padding_idx, scale_grad_by_freq)


@op("embedding_weight_first", torch_names=("torch.embedding",),
    samples=(S(T((5, 3)), _IDX), S(T((5, 3)), _IDX, 4)), reference=torch.embedding)
def embedding_weight_first(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """torch.embedding: the aten spelling, weight first"""
    if sparse:
        raise ValueError("embedding: sparse gradients are not supported")
    return Embedding.apply(weight, indices, padding_idx, scale_grad_by_freq)


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, w, b, eps):
        out, mean, rstd = torch.native_layer_norm(x, normalized_shape, w, b, eps)
        ctx.save_for_backward(x, w, b, mean, rstd)
        ctx.normalized_shape = normalized_shape
        return out

    @staticmethod
    def backward(ctx, g):
        x, w, b, mean, rstd = ctx.saved_tensors
        # the bias grad is ours: aten's double backward of it is wrong when weight is None
        mask = [needs(ctx, 0), w is not None and needs(ctx, 2), False]
        gx, gw, _ = aten.native_layer_norm_backward(g, x, ctx.normalized_shape, mean, rstd, w, b, mask)
        return gx, None, gw, sum_to(g, b) if needs(ctx, 3) else None, None


@op("layer_norm", shape_rule="like_input", torch_names=("torch.nn.functional.layer_norm",),
    samples=(S(T((2, 4)), (4,), T((4,)), T((4,))), S(T((2, 3, 4)), (3, 4)), S(T((3,)), [3], T((3,)), None, 1e-3),
             S(T((2, 4, 3), noncontiguous=True), (3,), None, T((3,)))),
    reference=F.layer_norm)
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05):
    """normalise over the last len(normalized_shape) dims, then scale and shift"""
    shape = [int(normalized_shape)] if isinstance(normalized_shape, int) else [int(s) for s in normalized_shape]
    return LayerNorm.apply(input, shape, weight, bias, eps)


def _channel_sum(t):
    """``t`` summed over every dim but the channel dim 1."""
    return t.sum([d for d in range(t.dim()) if d != 1])


class GroupNorm(Function):
    @staticmethod
    def forward(ctx, x, groups, w, b, eps):
        ctx.save_for_backward(x, w)
        ctx.groups, ctx.eps = groups, eps
        return F.group_norm(x, groups, w, b, eps)

    @staticmethod
    def backward(ctx, g):
        # aten's native_group_norm_backward has no derivative: the layer-norm rule per group, from x again
        x, w = ctx.saved_tensors
        x3 = x.reshape(x.shape[0], ctx.groups, -1)
        rstd = torch.rsqrt(x3.var(-1, correction=0, keepdim=True) + ctx.eps)
        xhat = (x3 - x3.mean(-1, keepdim=True)) * rstd
        gx = gw = None
        if needs(ctx, 0):
            gxhat = (g if w is None else g * w.view(-1, *[1] * (x.dim() - 2))).reshape(xhat.shape)
            gxhat_mean, dot_mean = gxhat.mean(-1, keepdim=True), (gxhat * xhat).mean(-1, keepdim=True)
            gx = (rstd * (gxhat - gxhat_mean - xhat * dot_mean)).reshape(x.shape)
        if needs(ctx, 2):
            gw = _channel_sum(g * xhat.reshape(x.shape))
        return gx, None, gw, _channel_sum(g) if needs(ctx, 3) else None, None


@op("group_norm", shape_rule="like_input", torch_names=("torch.nn.functional.group_norm",),
    samples=(S(T((2, 4, 3)), 2, T((4,)), T((4,))), S(T((2, 6)), 2), S(T((1, 4, 2, 3)), 4, T((4,)), None, 1e-3),
             # torch's own backward fails for weight=None with a bias that requires grad; ours does not
             S(T((2, 4, 3), noncontiguous=True), 1, None, T((4,), requires_grad=False))),
    reference=F.group_norm)
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-05):
    """normalise over channel groups (and all spatial dims), then scale and shift per channel"""
    if input.dim() < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.dim()}")
    return GroupNorm.apply(input, num_groups, weight, bias, eps)


class BatchNorm(Function):
    @staticmethod
    def forward(ctx, x, running_mean, running_var, w, b, training, momentum, eps):
        # training: normalise by the batch statistics and update running_* in place (unbiased var)
        out, save_mean, save_invstd = torch.native_batch_norm(x, w, b, running_mean, running_var, training,
                                                              momentum, eps)
        stats = (None, None) if training else (running_mean, running_var)  # training never reads them back
        ctx.save_for_backward(x, w, *stats, save_mean, save_invstd)
        ctx.training, ctx.eps = training, eps
        return out

    @staticmethod
    def backward(ctx, g):
        x, w, running_mean, running_var, save_mean, save_invstd = ctx.saved_tensors
        # the bias grad is ours: aten's double backward of it is wrong when weight is None
        mask = [needs(ctx, 0), w is not None and needs(ctx, 3), False]
        gx, gw, _ = aten.native_batch_norm_backward(g, x, w, running_mean, running_var, save_mean, save_invstd,
                                                    ctx.training, ctx.eps, mask)
        return gx, None, None, gw, _channel_sum(g) if needs(ctx, 4) else None, None, None, None


_STATS = (T((3,), requires_grad=False), T((3,), low=0.5, requires_grad=False))


@op("batch_norm", shape_rule="like_input", torch_names=("torch.nn.functional.batch_norm",),
    samples=(S(T((4, 3)), *_STATS, T((3,)), T((3,)), True), S(T((2, 3, 4)), *_STATS, training=True, momentum=0.3),
             S(T((2, 3, 2, 2)), *_STATS, T((3,)), T((3,))), S(T((2, 3, 2, 2)), None, None, T((3,)), None, True),
             S(T((2, 3, 4), noncontiguous=True), *_STATS, None, T((3,)), False, eps=1e-3)),
    reference=F.batch_norm)
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-05):
    """per-channel (dim 1) normalisation by batch statistics (training) or the running ones (eval)"""
    if training:
        count = input.numel() // input.shape[1] if input.dim() > 1 else input.numel()
        if count == 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
    return BatchNorm.apply(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _source_index(mode, j, n):
    """The index (in 0..n-1) each padded position j copies, along one dim of length n."""
    if mode == "replicate":
        return j.clamp(0, n - 1)
    if mode == "circular":
        return j.remainder(n)
    j = j.abs()  # reflect
    return torch.where(j >= n, 2 * (n - 1) - j, j)


class Pad(Function):
    @staticmethod
    def forward(ctx, x, pad, mode, value):
        ctx.pad, ctx.mode, ctx.shape = pad, mode, x.shape
        return F.pad(x, pad, mode, value)

    @staticmethod
    def backward(ctx, g):
        if ctx.mode == "constant":  # padding by -pad crops what was added and zero-fills what was cropped
            return F.pad(g, [-p for p in ctx.pad]), None, None, None
        for i in range(len(ctx.pad) // 2):  # F.pad lists the last dim first; dims are separable
            dim, left, right = -1 - i, ctx.pad[2 * i], ctx.pad[2 * i + 1]
            lo, hi = max(-left, 0), ctx.shape[dim] - max(-right, 0)  # negative pads crop first
            j = torch.arange(-max(left, 0), hi - lo + max(right, 0), device=g.device)
            src = lo + _source_index(ctx.mode, j, hi - lo)
            shape = list(g.shape)
            shape[dim] = ctx.shape[dim]
            g = g.new_zeros(shape).index_add(g.dim() + dim, src, g)
        return g, None, None, None


@op("pad", torch_names=("torch.nn.functional.pad",),
    samples=(S(T((2, 3)), (1, 2)), S(T((2, 3, 4)), [1, 0, -1, 2], value=1.5), S(T((1, 2, 4)), (2, 1), "reflect"),
             S(T((1, 2, 3, 4)), (1, 2, 2, 1), mode="reflect"), S(T((1, 2, 3, 3)), (2, 1, 0, 3), "replicate"),
             S(T((2, 3, 4)), (3, 1), "replicate"), S(T((1, 2, 3, 4), noncontiguous=True), (1, 2, 3, 1), "circular"),
             S(T((1, 2, 4)), (-1, 2), "circular")),
    reference=F.pad)
def pad(input, pad, mode="constant", value=None):
    """pad the last len(pad)//2 dims: constant (negative pads crop), reflect, replicate or circular"""
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise NotImplementedError(f"pad: mode {mode!r} is not supported")
    return Pad.apply(input, [int(p) for p in pad], mode, value)


_UPSAMPLE_BACKWARD = {  # (mode, spatial dims) -> aten derivative kernel
    ("nearest", 1): lambda g, out, inp, corners, s: aten.upsample_nearest1d_backward(g, out, inp, *s),
    ("nearest", 2): lambda g, out, inp, corners, s: aten.upsample_nearest2d_backward(g, out, inp, *s),
    ("nearest", 3): lambda g, out, inp, corners, s: aten.upsample_nearest3d_backward(g, out, inp, *s),
    ("linear", 1): lambda g, out, inp, corners, s: aten.upsample_linear1d_backward(g, out, inp, corners, *s),
    ("bilinear", 2): lambda g, out, inp, corners, s: aten.upsample_bilinear2d_backward(g, out, inp, corners, *s),
}


class Interpolate(Function):
    @staticmethod
    def forward(ctx, x, size, scale_factor, mode, align_corners, recompute_scale_factor, scales):
        out = F.interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor)
        ctx.args = (list(out.shape[2:]), list(x.shape), bool(align_corners), scales)
        ctx.mode = mode
        return out

    @staticmethod
    def backward(ctx, g):
        grad = _UPSAMPLE_BACKWARD[(ctx.mode, g.dim() - 2)](g, *ctx.args)
        return grad, None, None, None, None, None, None


@op("interpolate", torch_names=("torch.nn.functional.interpolate",),
    samples=(S(T((1, 2, 3, 3)), scale_factor=2), S(T((2, 1, 2, 3)), size=(3, 5)), S(T((1, 2, 4)), 7),
             S(T((1, 1, 3, 4)), scale_factor=(1.5, 0.75), mode="bilinear"),
             S(T((1, 2, 3, 3), noncontiguous=True), size=5, mode="bilinear", align_corners=True),
             S(T((1, 1, 3, 2)), scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
             S(T((1, 2, 5)), scale_factor=0.6, mode="linear")),
    reference=F.interpolate)
def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """resample the spatial dims: nearest (1-3 d), linear (1 d), bilinear (2 d)"""
    dims = input.dim() - 2
    if (mode, dims) not in _UPSAMPLE_BACKWARD or antialias:
        raise NotImplementedError(f"interpolate: mode {mode!r} (antialias={antialias}) on a {input.dim()}-d "
                                  "input is not supported")
    if size is not None or scale_factor is None or recompute_scale_factor:
        scales = [None] * dims  # the kernel derives the scale from the sizes
    elif isinstance(scale_factor, (list, tuple)):
        scales = [float(s) for s in scale_factor]
    else:
        scales = [float(scale_factor)] * dims
    return Interpolate.apply(input, size, scale_factor, mode, align_corners, recompute_scale_factor, scales)


@op("one_hot", torch_names=("torch.nn.functional.one_hot",),
    samples=(S(T((2, 3), dtype="int64", low=0, high=4, requires_grad=False)),
             S(T((3,), dtype="int64", low=0, high=3, requires_grad=False), 5),
             S(T((), dtype="int64", low=0, high=3, requires_grad=False), num_classes=3)),
    reference=F.one_hot, differentiable=False, shape_rule="none")
def one_hot(tensor, num_classes=-1):
    """int64 one-hot encoding along a new last dim (no gradient); num_classes=-1 means max + 1"""
    return F.one_hot(tensor, num_classes)

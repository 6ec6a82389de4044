"""nn layers: linear maps, embedding, normalisation, padding, resampling.

Normalisation backwards are aten's derivative kernels (``native_layer_norm_backward``,
...), which are differentiable themselves; padding and resampling are torch's own ops
(native entries); the rest are plain formulas. Convolutions and pooling live in
``conv.py`` and ``pooling.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ._grad import like_of, needs, sum_to
from ._registry import op
from ._native import native_op
from ._samples import S, T

aten = torch.ops.aten


# linear is torch's own (kind native): its autograd node in C++ costs less per forward and backward than
# our Python Function did, with the same values and derivative
native_op("linear", F.linear, torch_names=("torch.nn.functional.linear",), shape_rule="linear",
          samples=(S(T((2, 3)), T((4, 3)), T((4,))), S(T((3,)), T((4, 3))), S(T((2, 5, 3)), T((4, 3)), T(())),
                   S(T((3, 2), noncontiguous=True), T((4, 2)), T((4,))), S(T((2, 3)), T((3,))),
                   S(T((3,)), T((3,)), T(())), S(T((0, 3)), T((2, 3)), T((2,)))))


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


_BAG = T((6,), dtype="int64", low=0, high=5, requires_grad=False)
_OFFSETS = torch.tensor([0, 2, 2])  # sorted bag starts (the second bag is empty): a literal, not a recipe

# max_norm renormalises weight in place and scale_grad_by_freq is not the true derivative: samples leave
# them out, as for embedding
native_op("embedding_bag", F.embedding_bag, torch_names=("torch.nn.functional.embedding_bag",),
          double_grad=False,  # torch's _embedding_bag_backward has no derivative
          samples=(S(_BAG, T((5, 3)), _OFFSETS), S(_BAG, T((5, 3)), _OFFSETS, mode="sum"),
                   S(T((2, 3), dtype="int64", low=0, high=5, requires_grad=False), T((5, 2)), mode="max"),
                   S(_BAG, T((5, 3)), _OFFSETS, mode="sum", per_sample_weights=T((6,))),
                   # include_last_offset: the last offset ends the last bag; here it is the end, because with
                   # per_sample_weights and indices past it torch's own CPU backward returns uninitialised memory
                   S(_BAG, T((5, 3)), torch.tensor([0, 2, 6]), include_last_offset=True),
                   S(_BAG, T((5, 3)), _OFFSETS, padding_idx=1)))


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


# pad and interpolate are torch's own (kind native): its derivative kernels (replication_pad*_backward,
# upsample_*_backward, ...) are differentiable themselves, cover every mode and negative pads (our
# hand-written pad backward did not), and the table has two entries fewer to maintain.
pad = native_op(
    "pad", F.pad, torch_names=("torch.nn.functional.pad",),
    samples=(S(T((2, 3)), (1, 2)), S(T((2, 3, 4)), [1, 0, -1, 2], value=1.5), S(T((1, 2, 4)), (2, 1), "reflect"),
             S(T((1, 2, 3, 4)), (1, 2, 2, 1), mode="reflect"), S(T((1, 2, 3, 3)), (2, 1, 0, 3), "replicate"),
             S(T((2, 3, 4)), (3, 1), "replicate"), S(T((1, 2, 3, 4), noncontiguous=True), (1, 2, 3, 1), "circular"),
             S(T((1, 2, 4)), (-1, 2), "circular"), S(T((1, 2, 5)), (-1, 2), "replicate"),
             S(T((1, 2, 4, 5)), (1, -2, -1, 2), "replicate"), S(T((1, 1, 3, 4, 5)), (1, 2, 0, -1, 2, 1), "replicate"),
             S(T((1, 1, 2, 3, 2)), (1, 1, 1, 0, 1, 0), "reflect"), S(T((1, 1, 2, 3, 4)), (1, 0, 1, 2, 0, 1), "circular"),
             S(T((1, 2, 5)), (-1, 2), "reflect")))

interpolate = native_op(
    "interpolate", F.interpolate, torch_names=("torch.nn.functional.interpolate",),
    samples=(S(T((1, 2, 3, 3)), scale_factor=2), S(T((2, 1, 2, 3)), size=(3, 5)), S(T((1, 2, 4)), 7),
             S(T((1, 1, 3, 4)), scale_factor=(1.5, 0.75), mode="bilinear"),
             S(T((1, 2, 3, 3), noncontiguous=True), size=5, mode="bilinear", align_corners=True),
             S(T((1, 1, 3, 2)), scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
             S(T((1, 2, 5)), scale_factor=0.6, mode="linear"), S(T((1, 2, 4)), size=6, mode="linear", align_corners=True),
             S(T((1, 1, 3, 4)), size=(5, 6), mode="bicubic"), S(T((1, 1, 4, 4)), scale_factor=1.5, mode="bicubic",
                                                                align_corners=True),
             S(T((1, 1, 2, 3, 2)), scale_factor=2, mode="trilinear"), S(T((1, 1, 2, 2, 3)), size=(3, 3, 4)),
             S(T((1, 2, 5, 6)), size=(3, 4), mode="area"), S(T((1, 2, 7)), size=3, mode="area"),
             S(T((1, 1, 3, 5)), size=(4, 7), mode="nearest-exact"),
             S(T((1, 1, 6, 6)), size=(4, 3), mode="bilinear", antialias=True),
             S(T((1, 1, 6, 6)), size=(4, 3), mode="bicubic", antialias=True)))


@op("one_hot", torch_names=("torch.nn.functional.one_hot",),
    samples=(S(T((2, 3), dtype="int64", low=0, high=4, requires_grad=False)),
             S(T((3,), dtype="int64", low=0, high=3, requires_grad=False), 5),
             S(T((), dtype="int64", low=0, high=3, requires_grad=False), num_classes=3)),
    reference=F.one_hot, differentiable=False, shape_rule="none", data_dependent=True,
    output_bound=lambda tensor, num_classes=-1: tensor.numel() * (
        num_classes if num_classes > 0 else (int(tensor.max()) + 1 if tensor.numel() else 0)))
def one_hot(tensor, num_classes=-1):
    """int64 one-hot encoding along a new last dim (no gradient); num_classes=-1 means max + 1"""
    return F.one_hot(tensor, num_classes)

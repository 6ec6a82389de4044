"""Class losses: log_softmax followed by a negative log-likelihood, as in torch (cross_entropy's
common case runs both in one node, ``CrossEntropy``, and nll_loss's in ``NLL``). The reductions and the legacy
size_average/reduce flags are the pointwise losses' own (``losses.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ._grad import needs
from ._registry import op
from ._samples import S, T
from .losses import _CLASS_WEIGHT, _reduce, _reduction, _spread

aten = torch.ops.aten
_REDUCTION_ENUM = {"none": 0, "mean": 1, "sum": 2}  # aten's ``int reduction``


class LogSoftmax(Function):
    """log_softmax along ``dim``, private to the class losses (activations.py holds the public op)."""

    @staticmethod
    def forward(ctx, x, dim):
        out = torch.log_softmax(x, dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g - torch.exp(out) * g.sum(ctx.dim, keepdim=True), None


def _class_dim(input) -> int:
    return 0 if input.dim() == 1 else 1


def _picked(target, weight, ignore_index, dtype):
    """Per target: its class (0 where ignored), whether it is kept, and its weight (0 where ignored)."""
    kept = target != ignore_index
    index = torch.where(kept, target, 0)
    if weight is None:  # every class weighs 1: the same values as below, in one op instead of three
        return index, kept, kept.to(dtype)
    return index, kept, torch.where(kept, weight[index], 0)


def _picks_again(target, weight, ignore_index, dtype, reduction):
    """What forward kept in ``ctx.picked``, computed again (from ``weight``, for double backward)."""
    index, kept, wt = _picked(target, weight, ignore_index, dtype)
    return index.unsqueeze(-1), kept, wt, wt.sum() if reduction == "mean" else None


def _class_weights(weight, n_classes, like):
    return weight if weight is not None else like.new_ones(n_classes)


def _classes_last(t, cdim):
    return t if cdim == t.dim() - 1 else t.movedim(cdim, -1)


class ClassNLL(Function):
    """-w[t] logp[t] per target class t (0 where t == ignore_index). With label smoothing s: (1 - s) of that
    plus s / C of -sum_c w[c] logp[c]. The mean divides by the kept targets' total weight, as torch."""

    @staticmethod
    def forward(ctx, logp, target, weight, reduction, ignore_index, smoothing):
        cdim = _class_dim(logp)
        lp = _classes_last(logp, cdim)  # (..., C), target (...)
        if lp.shape[:-1] != target.shape:
            raise ValueError(f"Expected target of shape {tuple(lp.shape[:-1])}, got {tuple(target.shape)}")
        index, kept, wt = _picked(target, weight, ignore_index, logp.dtype)
        index = index.unsqueeze(-1)
        loss = -lp.gather(-1, index).squeeze(-1) * wt
        if smoothing:
            w = _class_weights(weight, lp.shape[-1], logp)
            loss = (1 - smoothing) * loss - (smoothing / lp.shape[-1]) * (lp * w).sum(-1) * kept
        ctx.save_for_backward(target, weight)
        ctx.args, ctx.cdim, ctx.shape = (reduction, ignore_index, smoothing), cdim, lp.shape
        count = wt.sum() if reduction == "mean" else None
        # Without class weights the picks depend on the target alone (never differentiated): backward
        # reuses them. With weights it recomputes them, so that double backward sees ``weight``.
        ctx.picked = (index, kept, wt, count) if weight is None else None
        return _reduce(loss, reduction, count)

    @staticmethod
    def backward(ctx, g):
        if not needs(ctx, 0):
            return None, None, None, None, None, None
        target, weight = ctx.saved_tensors  # also torch's check that target was not changed in place
        (reduction, ignore_index, smoothing), n_classes = ctx.args, ctx.shape[-1]
        index, kept, wt, count = ctx.picked or _picks_again(target, weight, ignore_index, g.dtype, reduction)
        gl = _spread(g, target.shape, reduction, count)  # the gradient of each target's loss
        picked = (-(1 - smoothing) * gl * wt).unsqueeze(-1)
        glp = g.new_zeros(ctx.shape).scatter(-1, index, picked)
        if smoothing:
            glp = glp - (smoothing / n_classes) * (gl * kept).unsqueeze(-1) * _class_weights(weight, n_classes, g)
        return glp if ctx.cdim == glp.dim() - 1 else glp.movedim(-1, ctx.cdim), None, None, None, None, None


class SoftTargetCE(Function):
    """-sum_c w[c] q[c] logp[c] per sample, q = (1 - s) target + s / C; the mean is over samples."""

    @staticmethod
    def forward(ctx, logp, target, weight, reduction, smoothing):
        cdim = _class_dim(logp)
        lp, q = logp.movedim(cdim, -1), target.movedim(cdim, -1) * (1 - smoothing) + smoothing / logp.shape[cdim]
        loss = -(lp * q * (weight if weight is not None else 1)).sum(-1)
        ctx.save_for_backward(logp, target, weight)
        ctx.args = (reduction, smoothing, cdim)
        return _reduce(loss, reduction)

    @staticmethod
    def backward(ctx, g):
        logp, target, weight = ctx.saved_tensors
        reduction, smoothing, cdim = ctx.args
        lp, q = logp.movedim(cdim, -1), target.movedim(cdim, -1) * (1 - smoothing) + smoothing / logp.shape[cdim]
        w = weight if weight is not None else 1
        gl = _spread(g, lp.shape[:-1], reduction).unsqueeze(-1)
        glp = (-gl * q * w).movedim(-1, cdim) if needs(ctx, 0) else None
        gt = (-(1 - smoothing) * gl * lp * w).movedim(-1, cdim) if needs(ctx, 1) else None
        gw = (-gl * lp * q).sum_to_size(lp.shape[-1]) if needs(ctx, 2) else None
        return glp, gt, gw, None, None


class CrossEntropy(Function):
    """cross_entropy of class indices on (C,) or (N, C) input, without label smoothing, in one node.

    The hot path of every classifier's training step: half the cost of LogSoftmax + ClassNLL. Forward
    and backward call the kernels torch's autograd runs for F.cross_entropy, so values and gradients
    are torch's bit for bit. logp is a second output, saved as torch's log_softmax saves its result:
    under create_graph, backward's result reaches the input through it (double backward).
    """

    @staticmethod
    def forward(ctx, x, target, weight, reduction, ignore_index):
        dim = _class_dim(x)
        logp = torch.log_softmax(x, dim)
        loss, total_weight = aten.nll_loss_forward(logp, target, weight, reduction, ignore_index)
        ctx.save_for_backward(logp, target, weight, total_weight)
        ctx.args = dim, reduction, ignore_index
        ctx.set_materialize_grads(False)  # a plain backward gets None, not zeros, for the unused logp
        return loss, logp

    @staticmethod
    def backward(ctx, g, g_logp):
        logp, target, weight, total_weight = ctx.saved_tensors
        dim, reduction, ignore_index = ctx.args
        if g is not None:
            g_nll = aten.nll_loss_backward(g, logp, target, weight, reduction, ignore_index, total_weight)
            g_logp = g_nll if g_logp is None else g_logp + g_nll
        if g_logp is None or not needs(ctx, 0):
            return None, None, None, None, None
        # no gradient for the class weights: torch's nll_loss is not differentiable in them
        return aten._log_softmax_backward_data(g_logp, logp, dim, logp.dtype), None, None, None, None


class NLL(Function):
    """nll_loss of class indices on (C,) or (N, C) input in one node, on the kernels torch's autograd runs
    for F.nll_loss (values and gradients bit for bit; nll_loss_backward is differentiable in ``g``)."""

    @staticmethod
    def forward(ctx, logp, target, weight, reduction, ignore_index):
        loss, total_weight = aten.nll_loss_forward(logp, target, weight, reduction, ignore_index)
        ctx.save_for_backward(logp, target, weight, total_weight)  # logp as torch saves it: version checks
        ctx.args = reduction, ignore_index
        return loss

    @staticmethod
    def backward(ctx, g):
        if not needs(ctx, 0):
            return None, None, None, None, None
        logp, target, weight, total_weight = ctx.saved_tensors
        reduction, ignore_index = ctx.args
        return aten.nll_loss_backward(g, logp, target, weight, reduction, ignore_index, total_weight), None, None, None, None


_NLL_TARGETS = (torch.int64, torch.uint8)  # the target dtypes aten's nll_loss takes


def _one_node(input, target, label_smoothing: float = 0.0) -> bool:
    """Whether the class losses run as one node on torch's kernels: class indices of a dtype aten takes,
    (C,) or (N, C) input, no label smoothing."""
    return target.shape != input.shape and target.dtype in _NLL_TARGETS and input.dim() <= 2 and not label_smoothing


def _check_classes(input):
    if input.dim() == 0:
        raise ValueError("Expected input with at least 1 dimension (the classes), got a 0-d tensor")


_LOGITS = T((4, 3))
_CLS = T((4,), dtype="int64", low=0, high=3, requires_grad=False)
_CLS_2D = T((2, 3, 2), dtype="int64", low=0, high=4, requires_grad=False)
_CLS_0D = T((), dtype="int64", low=0, high=3, requires_grad=False)
_CLS_OF_4 = T((3,), dtype="int64", low=0, high=4, requires_grad=False)


@op("cross_entropy", torch_names=("torch.nn.functional.cross_entropy",), shape_rule="loss",
    samples=(S(_LOGITS, _CLS), S(_LOGITS, _CLS, reduction="sum"), S(_LOGITS, _CLS, ignore_index=1, reduction="none"),
             S(_LOGITS, _CLS, _CLASS_WEIGHT, ignore_index=0),
             S(_LOGITS, _CLS, _CLASS_WEIGHT, label_smoothing=0.2, ignore_index=2),
             S(T((2, 4, 3, 2)), _CLS_2D, label_smoothing=0.1), S(T((3,)), _CLS_0D),
             S(T((3, 4), noncontiguous=True), T((3, 4), low=0.0, high=1.0)),
             S(T((2, 3, 2)), T((2, 3, 2), low=0.0, high=1.0), T((3,), low=0.2), reduction="sum", label_smoothing=0.3),
             S(_LOGITS, T((4, 3), low=0.0, high=1.0, requires_grad=False), reduction="none"),
             S(T((3, 4), noncontiguous=True), _CLS_OF_4, T((4,), low=0.2, requires_grad=False), reduction="sum",
               ignore_index=1),
             S(T((3,)), _CLS_0D, _CLASS_WEIGHT, reduction="none")),
    reference=F.cross_entropy)
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """log_softmax over the class dim (1, or 0 for 1-d input), then nll of class indices or of class probabilities"""
    reduction = _reduction(size_average, reduce, reduction)
    _check_classes(input)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if _one_node(input, target, label_smoothing):
        return CrossEntropy.apply(input, target, weight, _REDUCTION_ENUM[reduction], ignore_index)[0]
    logp = LogSoftmax.apply(input, _class_dim(input))
    if target.shape == input.shape:  # class probabilities
        if not target.dtype.is_floating_point:
            raise ValueError(f"Expected floating point type for target with class probabilities, got {target.dtype}")
        return SoftTargetCE.apply(logp, target, weight, reduction, label_smoothing)
    return ClassNLL.apply(logp, target, weight, reduction, ignore_index, label_smoothing)


@op("nll_loss", torch_names=("torch.nn.functional.nll_loss",), shape_rule="loss",
    samples=(S(_LOGITS, _CLS), S(_LOGITS, _CLS, reduction="sum"), S(_LOGITS, _CLS, ignore_index=1, reduction="none"),
             S(_LOGITS, _CLS, _CLASS_WEIGHT, ignore_index=0),
             S(T((2, 4, 3, 2)), _CLS_2D, T((4,), low=0.2, requires_grad=False)),
             S(T((3, 4), noncontiguous=True), _CLS_OF_4, None, None, -100, None, "none"),
             S(T((3,)), _CLS_0D)),
    reference=F.nll_loss)
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """-input[target] along the class dim (1, or 0 for 1-d input), weighted; targets == ignore_index count nothing"""
    _check_classes(input)
    reduction = _reduction(size_average, reduce, reduction)
    if _one_node(input, target):
        return NLL.apply(input, target, weight, _REDUCTION_ENUM[reduction], ignore_index)
    return ClassNLL.apply(input, target, weight, reduction, ignore_index, 0.0)

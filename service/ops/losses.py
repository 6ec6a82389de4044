"""Losses. Pointwise losses share one Function shape (loss per element, then the
reduction); class losses are log_softmax followed by a negative log-likelihood, as in
torch (cross_entropy's common case runs both in one node, ``CrossEntropy``). Optional
per-element ``weight``s compose with the ``mul``/``sum``/``div`` entries, as torch
composes them (so ``weight`` gets a gradient where torch gives one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ._grad import needs, sum_to
from ._registry import op
from ._samples import S, T
from .elementwise import div, mul
from .reductions import mean as _mean, sum as _sum

aten = torch.ops.aten
_REDUCTIONS = ("none", "mean", "sum")
_REDUCTION_ENUM = {"none": 0, "mean": 1, "sum": 2}  # aten's ``int reduction``


def _reduction(size_average, reduce, reduction, allowed=_REDUCTIONS):
    """``reduction``, or what torch's legacy size_average/reduce flags mean; checked."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "none" if not reduce else "mean" if size_average else "sum"
    if reduction not in allowed:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    return reduction


def _reduce(loss, reduction, count=None):
    """``loss`` itself, its sum, or its mean over ``count`` (default: its element count)."""
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / (loss.numel() if count is None else count)


def _spread(g, shape, reduction, count=None):
    """The gradient of ``_reduce`` at a loss of ``shape``, from the gradient ``g`` of its result."""
    if reduction == "none":
        return g
    if reduction == "mean":
        g = g / (shape.numel() if count is None else count)
    return g.expand(shape)


def _pointwise_loss(name, value, grads):
    """A Function ``reduce(value(x, y, p))``; ``grads(x, y, p)`` gives (dl/dx, dl/dy).

    ``p`` is the loss's own parameter (a number, a flag, or a tensor such as pos_weight that gets no gradient).
    """

    class Loss(Function):
        @staticmethod
        def forward(ctx, x, y, reduction, p):
            loss = value(x, y, p)
            ctx.save_for_backward(x, y, p if isinstance(p, torch.Tensor) else None)
            ctx.reduction, ctx.p, ctx.shape = reduction, None if isinstance(p, torch.Tensor) else p, loss.shape
            return _reduce(loss, reduction)

        @staticmethod
        def backward(ctx, g):
            x, y, p_tensor = ctx.saved_tensors
            gl = _spread(g, ctx.shape, ctx.reduction)
            dx, dy = grads(x, y, p_tensor if ctx.p is None else ctx.p)
            return (sum_to(gl * dx, x) if needs(ctx, 0) else None,
                    sum_to(gl * dy, y) if needs(ctx, 1) else None, None, None)

    Loss.__name__ = Loss.__qualname__ = name
    return Loss


def _weighted(loss_fn, x, y, p, weight, reduction, mean_by_weight):
    """``loss_fn`` reduced, or torch's weighted form: (loss * weight) summed, or averaged over
    sum(weight) (mse, l1) or over the element count (the others)."""
    if weight is None:
        return loss_fn.apply(x, y, reduction, p)
    loss = mul(loss_fn.apply(x, y, "none", p), weight)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _sum(loss)
    return div(_sum(loss), _sum(weight)) if mean_by_weight else _mean(loss)


def _same_size(input, target):
    if target.shape != input.shape:
        raise ValueError(f"Using a target size ({target.shape}) that is different to the input size ({input.shape}) "
                         "is not supported here. Please ensure they have the same size.")


def _weight_size(input, weight):
    if weight is not None and weight.shape != input.shape:
        raise ValueError("Weights and input must have the same size.")


MSE = _pointwise_loss("MSE", lambda x, y, p: F.mse_loss(x, y, reduction="none"),
                      lambda x, y, p: (2 * (x - y), -2 * (x - y)))
L1 = _pointwise_loss("L1", lambda x, y, p: F.l1_loss(x, y, reduction="none"),
                     lambda x, y, p: ((x - y).sgn(), -(x - y).sgn()))
SmoothL1 = _pointwise_loss("SmoothL1", lambda x, y, beta: F.smooth_l1_loss(x, y, reduction="none", beta=beta),
                           lambda x, y, beta: ((x - y).clamp(-beta, beta) / beta, (y - x).clamp(-beta, beta) / beta))
Huber = _pointwise_loss("Huber", lambda x, y, delta: F.huber_loss(x, y, reduction="none", delta=delta),
                        lambda x, y, delta: ((x - y).clamp(-delta, delta), (y - x).clamp(-delta, delta)))
# -(y log x + (1 - y) log(1 - x)), logs clamped at -100 (forward) and the denominator at 1e-12, as torch
BCE = _pointwise_loss("BCE", lambda x, y, p: F.binary_cross_entropy(x, y, reduction="none"),
                      lambda x, y, p: ((x - y) / ((1 - x) * x).clamp_min(1e-12), torch.log1p(-x) - torch.log(x)))


def _bce_logits_grads(x, y, pos_weight):
    if pos_weight is None:
        return torch.sigmoid(x) - y, -x
    py = pos_weight * y
    return (py + 1 - y) * torch.sigmoid(x) - py, F.logsigmoid(-x) - pos_weight * F.logsigmoid(x)


BCEWithLogits = _pointwise_loss(
    "BCEWithLogits", lambda x, y, pw: F.binary_cross_entropy_with_logits(x, y, reduction="none", pos_weight=pw),
    _bce_logits_grads)
# log_target: exp(y) (y - x); else y (log y - x)
KLDiv = _pointwise_loss("KLDiv", lambda x, y, log_target: F.kl_div(x, y, reduction="none", log_target=log_target),
                        lambda x, y, log_target: (-torch.exp(y), torch.exp(y) * (y - x + 1)) if log_target
                        else (-y, torch.log(y) + 1 - x))

_PAIR = (T((2, 3)), T((2, 3)))
_PAIR_SAMPLES = (S(*_PAIR), S(*_PAIR, reduction="sum"), S(*_PAIR, reduction="none"), S(T(()), T(())),
                 S(T((3, 2), noncontiguous=True), T((3, 2))), S(*_PAIR, None, False))


@op("mse_loss", torch_names=("torch.nn.functional.mse_loss",), shape_rule="loss",
    samples=_PAIR_SAMPLES + (S(*_PAIR, weight=T((2, 3), low=0.1)), S(*_PAIR, reduction="sum", weight=T((2, 3)))),
    reference=F.mse_loss)
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """squared error (input - target)**2, reduced"""
    _weight_size(input, weight)
    return _weighted(MSE, input, target, None, weight, _reduction(size_average, reduce, reduction), True)


# no weight sample: torch's F.l1_loss drops ``weight`` when it hands the call to __torch_function__
@op("l1_loss", torch_names=("torch.nn.functional.l1_loss",), shape_rule="loss", samples=_PAIR_SAMPLES, reference=F.l1_loss)
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """absolute error |input - target|, reduced"""
    _weight_size(input, weight)
    return _weighted(L1, input, target, None, weight, _reduction(size_average, reduce, reduction), True)


@op("smooth_l1_loss", torch_names=("torch.nn.functional.smooth_l1_loss",), shape_rule="loss",
    samples=_PAIR_SAMPLES + (S(*_PAIR, beta=0.5), S(*_PAIR, reduction="sum", beta=2.0), S(*_PAIR, beta=0.0)),
    reference=F.smooth_l1_loss)
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d**2 / beta where |d| < beta, else |d| - 0.5 beta (d = input - target); beta=0 is l1"""
    reduction = _reduction(size_average, reduce, reduction)
    if beta == 0:
        return L1.apply(input, target, reduction, None)
    return SmoothL1.apply(input, target, reduction, beta)


@op("huber_loss", torch_names=("torch.nn.functional.huber_loss",), shape_rule="loss",
    samples=(S(*_PAIR), S(*_PAIR, "sum", 0.5), S(*_PAIR, reduction="none", delta=2.0),
             S(T((3, 2), noncontiguous=True), T((3, 2)), delta=0.3), S(*_PAIR, weight=T((2, 3), low=0.1))),
    reference=F.huber_loss)
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """0.5 d**2 where |d| <= delta, else delta (|d| - 0.5 delta) (d = input - target)"""
    _weight_size(input, weight)
    return _weighted(Huber, input, target, delta, weight, _reduction(None, None, reduction), False)


_PROB = T((2, 3), low=0.05, high=0.95)
_CLASS_WEIGHT = T((3,), low=0.2, requires_grad=False)  # per class, or per element of a last dim of 3


@op("binary_cross_entropy", torch_names=("torch.nn.functional.binary_cross_entropy",), shape_rule="loss",
    samples=(S(_PROB, T((2, 3), low=0.0, high=1.0)), S(_PROB, _PROB, reduction="sum"),
             S(_PROB, T((2, 3), low=0, high=2, integers=True, requires_grad=False), _CLASS_WEIGHT),
             S(T((4,), low=0.05, high=0.95), T((4,), low=0.0, high=1.0), None, reduction="none")),
    reference=F.binary_cross_entropy)
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(target log input + (1 - target) log(1 - input)), input a probability"""
    _same_size(input, target)
    return _weighted(BCE, input, target, None, weight, _reduction(size_average, reduce, reduction), False)


@op("binary_cross_entropy_with_logits", torch_names=("torch.nn.functional.binary_cross_entropy_with_logits",), shape_rule="loss",
    samples=(S(T((2, 3)), T((2, 3), low=0.0, high=1.0)), S(T((2, 3)), _PROB, reduction="sum"),
             S(T((2, 3)), _PROB, _CLASS_WEIGHT, pos_weight=T((3,), low=0.5, requires_grad=False)),
             S(T((3, 2), noncontiguous=True), T((3, 2), low=0.0, high=1.0), reduction="none",
               pos_weight=T((2,), low=0.5, requires_grad=False))),
    reference=F.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """binary cross-entropy of sigmoid(input), positives weighted by pos_weight (pos_weight gets no gradient)"""
    _same_size(input, target)
    return _weighted(BCEWithLogits, input, target, pos_weight, weight,
                     _reduction(size_average, reduce, reduction), False)


@op("kl_div", torch_names=("torch.nn.functional.kl_div",), shape_rule="loss",
    samples=(S(T((2, 3)), _PROB), S(T((2, 3)), _PROB, reduction="batchmean"), S(T((2, 3)), T((2, 3)), reduction="sum",
             log_target=True), S(T((3, 2), noncontiguous=True), T((3, 2), low=0.1), reduction="none"),
             S(T((4,)), T((4,), low=0.1), reduction="batchmean")),
    reference=F.kl_div)
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL divergence with ``input`` given as log-probabilities; 'batchmean' divides the sum by input.size(0)"""
    reduction = _reduction(size_average, reduce, reduction, _REDUCTIONS + ("batchmean",))
    if reduction != "batchmean":
        return KLDiv.apply(input, target, reduction, log_target)
    total = KLDiv.apply(input, target, "sum", log_target)
    return div(total, input.shape[0]) if input.dim() else total


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


_NLL_TARGETS = (torch.int64, torch.uint8)  # the target dtypes aten's nll_loss takes


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
    if target.shape != input.shape and target.dtype in _NLL_TARGETS and input.dim() <= 2 and not label_smoothing:
        return CrossEntropy.apply(input, target, weight, _REDUCTION_ENUM[reduction], ignore_index)[0]  # one node
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
    return ClassNLL.apply(input, target, weight, _reduction(size_average, reduce, reduction), ignore_index, 0.0)


class CosineSimilarity(Function):
    @staticmethod
    def forward(ctx, a, b, dim, eps):
        ctx.save_for_backward(a, b)
        ctx.dim, ctx.eps = dim, eps
        return torch.cosine_similarity(a, b, dim, eps)

    @staticmethod
    def backward(ctx, g):
        a0, b0 = ctx.saved_tensors
        a, b = torch.broadcast_tensors(a0, b0)
        na = torch.linalg.vector_norm(a, dim=ctx.dim, keepdim=True).clamp_min(ctx.eps)
        nb = torch.linalg.vector_norm(b, dim=ctx.dim, keepdim=True).clamp_min(ctx.eps)
        u, v = a / na, b / nb
        cos, g = (u * v).sum(ctx.dim, keepdim=True), g.unsqueeze(ctx.dim)
        ga = sum_to(g * (v - cos * u) / na, a0) if needs(ctx, 0) else None
        gb = sum_to(g * (u - cos * v) / nb, b0) if needs(ctx, 1) else None
        return ga, gb, None, None


@op("cosine_similarity", torch_names=("torch.nn.functional.cosine_similarity",),
    samples=(S(T((2, 3)), T((2, 3))), S(T((3,)), T((3,)), 0), S(T((2, 3, 4)), T((3, 4)), dim=-1),
             S(T((2, 1, 3)), T((4, 3)), -1, 1e-6), S(T((3, 2), noncontiguous=True), T((3, 2)), 0)),
    reference=F.cosine_similarity)
def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 * x2) / (max(|x1|, eps) max(|x2|, eps)) along ``dim``, broadcasting x1 and x2"""
    return CosineSimilarity.apply(x1, x2, dim, eps)

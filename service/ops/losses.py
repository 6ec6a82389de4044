"""Losses. Pointwise losses share one Function shape (loss per element, then the
reduction); the class losses (cross_entropy, nll_loss) are in ``class_losses.py``. Optional
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

_REDUCTIONS = ("none", "mean", "sum")


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

"""Spread and size: var, std and vector norms, reductions whose gradient depends on the input itself."""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T
from .reductions import _remember, _unreduce


def _count(shape, dims) -> int:
    """How many elements each output element reduces over."""
    return math.prod(shape[d] for d in dims) if len(shape) else 1


def _safe_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a / b``, zero where ``b == 0``; never divides by zero, so double backward stays finite."""
    zero = b == 0
    return torch.where(zero, 0.0, a / torch.where(zero, 1.0, b))


def _moment_args(dim, unbiased, correction):
    """torch's three var/std spellings -> (dim, correction): ``var(x, True)`` passes unbiased as dim."""
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if correction is not None and unbiased is not None:
        raise TypeError("var/std: pass either unbiased or correction, not both")
    return dim, (correction if correction is not None else int(unbiased is not False))


def _var_grad(g, x, ctx):
    """d var / dx = 2 (x - mean) / (N - correction), with the output grad put back over the reduced dims."""
    denom = _count(ctx.shape, ctx.dims) - ctx.correction
    scale = 2.0 / denom if denom != 0 else math.inf
    return (scale * _unreduce(g, ctx) * (x - x.mean(ctx.dims, keepdim=True))).to(ctx.in_dtype)


class Var(Function):
    @staticmethod
    def forward(ctx, x, dim, correction, keepdim):
        _remember(ctx, x, dim, keepdim)
        ctx.correction = correction
        ctx.save_for_backward(x)
        return torch.var(x, dim, correction=correction, keepdim=keepdim)

    @staticmethod
    def backward(ctx, g):
        return _var_grad(g, ctx.saved_tensors[0], ctx), None, None, None


class Std(Function):
    @staticmethod
    def forward(ctx, x, dim, correction, keepdim):
        _remember(ctx, x, dim, keepdim)
        ctx.correction = correction
        out = torch.std(x, dim, correction=correction, keepdim=keepdim)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors  # std = sqrt(var): d std = d var / (2 std), zero where std == 0 (as torch)
        return _var_grad(_safe_div(g, 2 * out), x, ctx), None, None, None


_MOMENT_SAMPLES = (S(T((2, 3))), S(T((2, 3)), 1), S(T((2, 3, 4)), (0, 2), True), S(T((2, 3)), -1, False, True),
                   S(T((2, 3)), True), S(T((2, 3)), unbiased=False), S(T((2, 3)), 1, correction=0, keepdim=True),
                   S(T((3, 4), noncontiguous=True), dim=0, correction=2), S(T((3, 1)), 1, correction=0),
                   S(T(()), correction=0))


@op("var", torch_names=("torch.var", "torch.Tensor.var"), samples=_MOMENT_SAMPLES, reference=torch.var)
def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """variance over ``dim`` with ``correction`` (or ``unbiased``) degrees of freedom removed"""
    dim, correction = _moment_args(dim, unbiased, correction)
    return Var.apply(input, dim, correction, keepdim)


@op("std", torch_names=("torch.std", "torch.Tensor.std"), samples=_MOMENT_SAMPLES, reference=torch.std)
def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """standard deviation: the square root of ``var`` (same arguments)"""
    dim, correction = _moment_args(dim, unbiased, correction)
    return Std.apply(input, dim, correction, keepdim)


def _norm_grad(g, x, norm, p: float, dims) -> torch.Tensor:
    """torch's norm_backward for a p-norm, case by case; ``g`` and ``norm`` already broadcast to ``x``."""
    if p == 0:
        return torch.zeros_like(x)
    if p == 1:
        return x.sgn() * g
    if p == 2:
        return x * _safe_div(g, norm)
    if math.isinf(p):  # amax / amin of |x|: ties (and NaNs) share the gradient
        mask = (x.abs() == norm) | x.isnan()
        return x.sgn() * (g / mask.sum(dims, keepdim=True) * mask)
    if p < 1:
        zero = x == 0
        scaled = torch.where(zero, 0.0, torch.where(zero, 1.0, x.abs()).pow(p - 1))
        return x.sgn() * scaled * g * norm.pow(1 - p)
    scaled = x.sgn() * x.abs().pow(p - 1) if p < 2 else x * x.abs().pow(p - 2)
    return scaled * _safe_div(g, norm.pow(p - 1))


class VectorNorm(Function):
    @staticmethod
    def forward(ctx, x, ord, dim, keepdim, dtype):
        _remember(ctx, x, dim, keepdim)
        out = torch.linalg.vector_norm(x, ord, dim, keepdim, dtype=dtype)
        ctx.ord = float(ord)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        if ctx.ord == 0:  # counting nonzeros: torch gives no gradient at all (None, not zeros)
            return None, None, None, None, None
        grad = _norm_grad(_unreduce(g, ctx), x, _unreduce(out, ctx), ctx.ord, ctx.dims)
        return grad.to(ctx.in_dtype), None, None, None, None


_INF = float("inf")
_NORM_SAMPLES = (S(T((2, 3))), S(T((2, 3)), 1, 1), S(T((2, 3, 4)), _INF, (0, 2), True), S(T((2, 3)), -_INF, -1),
                 S(T((3, 2), noncontiguous=True), 3, 0), S(T((2, 3)), 0.5), S(T((2, 3)), 1.5, dim=1, keepdim=True),
                 S(T((2, 3)), 0, 1), S(T(())), S(T((0, 3)), 2, 1), S(T((2, 3)), dtype=torch.float64))


@op("vector_norm", torch_names=("torch.linalg.vector_norm",), samples=_NORM_SAMPLES,
    reference=torch.linalg.vector_norm)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """the ``ord``-norm of ``x`` flattened, or over ``dim`` (inf / -inf: largest / smallest |x|)"""
    return VectorNorm.apply(x, ord, dim, keepdim, dtype)


@op("norm", torch_names=("torch.functional.norm", "torch.Tensor.norm"), reference=torch.norm,
    samples=(S(T((2, 3))), S(T((2, 3)), dim=1), S(T((2, 3, 4)), "fro", (1, 2), True), S(T((2, 3)), 1, -1),
             S(T((2, 3)), _INF), S(T((3, 2), noncontiguous=True), p=3, dim=0), S(T(())), S(T((2, 3)), None, 1)))
def norm(input, p="fro", dim=None, keepdim=False, out=None, dtype=None):
    """``torch.norm``: vector norms (``'fro'`` is the 2-norm of the elements); matrix norms are not here"""
    if isinstance(out, torch.dtype):  # Tensor.norm(p, dim, keepdim, dtype): dtype is the fifth argument
        out, dtype = None, out
    if out is not None:
        raise TypeError("norm: out= is not supported")
    if isinstance(p, str):
        if p != "fro" or not (dim is None or isinstance(dim, int) or len(dim) <= 2):
            raise NotImplementedError(f"norm: p={p!r} is a matrix norm; it is not in the op table")
        p = 2
    return VectorNorm.apply(input, 2 if p is None else p, dim, keepdim, dtype)

"""Reductions: the gradient of a reduction is the output grad broadcast back over the reduced dims."""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._registry import OP_TABLE, op
from ._samples import S, T


def _dims(dim, ndim: int) -> tuple[int, ...]:
    """The reduced dims, normalised and sorted; ``None`` (or ``[]``) means all of them."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    if len(dim) == 0:
        return tuple(range(ndim))
    return tuple(sorted(d % ndim if ndim else 0 for d in dim))


def _expand_back(g: torch.Tensor, shape: torch.Size, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """Undo a reduction's shape change: unsqueeze the dropped dims, then expand."""
    if not keepdim and len(shape):
        for d in dims:
            g = g.unsqueeze(d)
    return g.expand(shape)


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        ctx.shape, ctx.dims, ctx.keepdim, ctx.in_dtype = x.shape, _dims(dim, x.dim()), keepdim, x.dtype
        if dim is None:
            return torch.sum(x, dtype=dtype)
        return torch.sum(x, dim, keepdim=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        return _expand_back(g, ctx.shape, ctx.dims, ctx.keepdim).to(ctx.in_dtype), None, None, None


_REDUCE_SAMPLES = (
    S(T((2, 3))),
    S(T((2, 3, 4)), 1),
    S(T((2, 3, 4)), (0, 2), keepdim=True),
    S(T((2, 3)), -1, True),
    S(T(())),
    S(T((3, 2), noncontiguous=True), 0),
    S(T((0, 3)), 1),
)


@op("sum", torch_names=("torch.sum", "torch.Tensor.sum"), samples=_REDUCE_SAMPLES, reference=torch.sum)
def sum(input, dim=None, keepdim=False, *, dtype=None):
    """sum over all elements or over ``dim``"""
    return Sum.apply(input, dim, keepdim, dtype)


class Mean(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        dims = _dims(dim, x.dim())
        ctx.shape, ctx.dims, ctx.keepdim, ctx.in_dtype = x.shape, dims, keepdim, x.dtype
        ctx.count = 1
        for d in dims:
            ctx.count *= x.shape[d] if x.dim() else 1
        if dim is None:
            return torch.mean(x, dtype=dtype)
        return torch.mean(x, dim, keepdim=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        g = _expand_back(g, ctx.shape, ctx.dims, ctx.keepdim) / ctx.count
        return g.to(ctx.in_dtype), None, None, None


@op("mean", torch_names=("torch.mean", "torch.Tensor.mean"), samples=_REDUCE_SAMPLES[:-1], reference=torch.mean)
def mean(input, dim=None, keepdim=False, *, dtype=None):
    """mean over all elements or over ``dim``"""
    return Mean.apply(input, dim, keepdim, dtype)


# -- helpers shared by the reductions below ------------------------------------------------


def _remember(ctx, x: torch.Tensor, dim, keepdim: bool) -> None:
    """What backward needs to undo a reduction of ``x`` over ``dim``."""
    ctx.shape, ctx.dims, ctx.keepdim, ctx.in_dtype = x.shape, _dims(dim, x.dim()), keepdim, x.dtype


def _unreduce(t: torch.Tensor, ctx) -> torch.Tensor:
    """A reduced tensor (grad or output) broadcast back to the input's shape."""
    return _expand_back(t, ctx.shape, ctx.dims, ctx.keepdim)


def prod_others(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Each element replaced by the product of the others along ``dim`` (no division: zeros are safe)."""
    n = x.shape[dim] if x.dim() else 1
    if x.dim() == 0 or n == 0:
        return torch.ones_like(x)
    one = torch.ones_like(x.narrow(dim, 0, 1))
    before = torch.cat([one, x.narrow(dim, 0, n - 1)], dim).cumprod(dim)
    after = torch.cat([x.narrow(dim, 1, n - 1), one], dim).flip(dim).cumprod(dim).flip(dim)
    return before * after


# -- prod, amax / amin, max / min ------------------------------------------------------------


class Prod(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        _remember(ctx, x, dim, keepdim)
        ctx.save_for_backward(x)
        return torch.prod(x, dtype=dtype) if dim is None else torch.prod(x, dim, keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):
        x = ctx.saved_tensors[0].to(g.dtype)  # as torch: the product rule in the result's dtype
        others = prod_others(x.reshape(-1), 0).reshape(x.shape) if len(ctx.dims) != 1 else prod_others(x, ctx.dims[0])
        return (_unreduce(g, ctx) * others).to(ctx.in_dtype), None, None, None


_ALONG_SAMPLES = (S(T((2, 3)), 1), S(T((2, 3, 4)), -1, True), S(T((3, 2), noncontiguous=True), 0),
                  S(T((2, 3)), dim=0, keepdim=True), S(T(()), 0), S(T((0, 3)), 1))


@op("prod", torch_names=("torch.prod", "torch.Tensor.prod"), reference=torch.prod,
    samples=(S(T((2, 3))), S(T(())), S(T((2, 3)), dtype=torch.float64)) + _ALONG_SAMPLES)
def prod(input, dim=None, keepdim=False, *, dtype=None):
    """product of all elements or along ``dim`` (zeros in the input are handled exactly)"""
    return Prod.apply(input, dim, keepdim, dtype)


class Extremum(Function):
    """amax / amin, and max / min over everything: the gradient is split evenly among ties."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, reduce, nan_ties):
        _remember(ctx, x, dim, keepdim)
        out = reduce(x, dim, keepdim)
        ctx.nan_ties = nan_ties  # max() / min() count NaNs as ties of a NaN result; amax / amin do not
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        out = _unreduce(out, ctx)
        mask = (x == out) | (x.isnan() & out.isnan()) if ctx.nan_ties else x == out
        return _unreduce(g, ctx) / mask.sum(ctx.dims, keepdim=True) * mask, None, None, None, None


class SelectAlong(Function):
    """max / min along one dim: (values, indices); the gradient goes to the selected positions."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, reduce):
        values, indices = reduce(x, dim, keepdim)
        ctx.mark_non_differentiable(indices)
        ctx.save_for_backward(indices)
        ctx.shape, ctx.dim, ctx.keepdim = x.shape, dim, keepdim
        return values, indices

    @staticmethod
    def backward(ctx, g, _):
        (indices,) = ctx.saved_tensors
        if len(ctx.shape) == 0:
            return g, None, None, None
        if not ctx.keepdim:
            g, indices = g.unsqueeze(ctx.dim), indices.unsqueeze(ctx.dim)
        return g.new_zeros(ctx.shape).scatter(ctx.dim, indices, g), None, None, None


_EXTREME_SAMPLES = (S(T((2, 3))), S(T((2, 3, 4)), (0, 2)), S(T((2, 3)), -1, True), S(T(())),
                    S(T((3, 2), noncontiguous=True), 0), S(T((2, 3)), dim=(), keepdim=True), S(T((0, 3)), 1))


@op("amax", torch_names=("torch.amax", "torch.Tensor.amax"), samples=_EXTREME_SAMPLES, reference=torch.amax)
def amax(input, dim=(), keepdim=False):
    """largest value over ``dim`` (all dims by default); ties share the gradient evenly"""
    return Extremum.apply(input, dim, keepdim, torch.amax, False)


@op("amin", torch_names=("torch.amin", "torch.Tensor.amin"), samples=_EXTREME_SAMPLES, reference=torch.amin)
def amin(input, dim=(), keepdim=False):
    """smallest value over ``dim`` (all dims by default); ties share the gradient evenly"""
    return Extremum.apply(input, dim, keepdim, torch.amin, False)


def _select(input, dim, keepdim, other, reduce, along, pairwise: str, result_type):
    """max / min: everything (a tensor), along ``dim`` ((values, indices)), or against a tensor."""
    if other is not None or isinstance(dim, torch.Tensor):
        entry = OP_TABLE.get(pairwise)
        if entry is None:
            raise NotImplementedError(f"the two-tensor form needs op {pairwise!r}, which is not in the op table")
        return entry.fn(input, dim if other is None else other)
    if dim is None:
        return Extremum.apply(input, (), False, reduce, True)
    return result_type(SelectAlong.apply(input, dim, keepdim, along))


_SELECT_SAMPLES = (S(T((2, 3))), S(T(())), S(T((2, 3, 4)), 1), S(T((2, 3)), -1, True), S(T(()), 0),
                   S(T((3, 2), noncontiguous=True), 0), S(T((2, 3)), dim=1, keepdim=True), S(T((0, 3)), 1))


@op("max", torch_names=("torch.max", "torch.Tensor.max"), samples=_SELECT_SAMPLES, reference=torch.max)
def max(input, dim=None, keepdim=False, *, other=None):
    """largest element; with ``dim``: (values, indices) along it; with a tensor: ``maximum``"""
    return _select(input, dim, keepdim, other, torch.amax, torch.max, "maximum", torch.return_types.max)


@op("min", torch_names=("torch.min", "torch.Tensor.min"), samples=_SELECT_SAMPLES, reference=torch.min)
def min(input, dim=None, keepdim=False, *, other=None):
    """smallest element; with ``dim``: (values, indices) along it; with a tensor: ``minimum``"""
    return _select(input, dim, keepdim, other, torch.amin, torch.min, "minimum", torch.return_types.min)


_ARG_SAMPLES = (S(T((2, 3))), S(T((2, 3)), 1), S(T((2, 3, 4)), -1, True), S(T((2, 3)), dim=0),
                S(T((3, 2), noncontiguous=True), None, True), S(T(())), S(T((2, 3), dtype="int64", low=-5, high=5), 1))


@op("argmax", torch_names=("torch.argmax", "torch.Tensor.argmax"), samples=_ARG_SAMPLES, reference=torch.argmax,
    differentiable=False)
def argmax(input, dim=None, keepdim=False):
    """index of the largest value (flattened, or along ``dim``); int64, no gradient"""
    return torch.argmax(input, dim, keepdim)


@op("argmin", torch_names=("torch.argmin", "torch.Tensor.argmin"), samples=_ARG_SAMPLES, reference=torch.argmin,
    differentiable=False)
def argmin(input, dim=None, keepdim=False):
    """index of the smallest value (flattened, or along ``dim``); int64, no gradient"""
    return torch.argmin(input, dim, keepdim)


# -- logsumexp -------------------------------------------------------------------------------


class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim):
        _remember(ctx, x, dim, keepdim)
        out = torch.logsumexp(x, dim, keepdim)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        return _unreduce(g, ctx) * (x - _unreduce(out, ctx)).exp(), None, None


@op("logsumexp", torch_names=("torch.logsumexp", "torch.Tensor.logsumexp", "torch.special.logsumexp"),
    samples=(S(T((2, 3)), 1), S(T((2, 3, 4)), (0, 2), True), S(T((2, 3)), -1, keepdim=True), S(T(()), 0),
             S(T((3, 2), noncontiguous=True), 0), S(T((0, 3)), 1), S(T((2, 3), low=50, high=60), (0, 1))),
    reference=torch.logsumexp)
def logsumexp(input, dim, keepdim=False):
    """log(sum(exp(input))) over ``dim``, computed stably"""
    return LogSumExp.apply(input, dim, keepdim)


# -- scans -----------------------------------------------------------------------------------


class CumSum(Function):
    @staticmethod
    def forward(ctx, x, dim, dtype):
        ctx.dim, ctx.in_dtype = dim, x.dtype
        return torch.cumsum(x, dim, dtype=dtype)

    @staticmethod
    def backward(ctx, g):  # each input feeds every later output: a reversed cumsum
        return g.flip(ctx.dim).cumsum(ctx.dim).flip(ctx.dim).to(ctx.in_dtype), None, None


class CumProd(Function):
    @staticmethod
    def forward(ctx, x, dim, dtype):
        ctx.dim, ctx.in_dtype = dim, x.dtype
        out = torch.cumprod(x, dim, dtype=dtype)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):  # torch's own formula: exact with zeros in the input, and itself differentiable
        x, out = ctx.saved_tensors
        return torch.ops.aten.cumprod_backward(g.to(ctx.in_dtype), x, ctx.dim, out.to(ctx.in_dtype)), None, None


_SCAN_SAMPLES = (S(T((2, 3)), 1), S(T((2, 3, 4)), -1), S(T((3, 2), noncontiguous=True), 0), S(T(()), 0),
                 S(T((0, 3)), 1), S(T((2, 3)), dim=0, dtype=torch.float64))


@op("cumsum", torch_names=("torch.cumsum", "torch.Tensor.cumsum", "torch.Tensor.cumsum_"), samples=_SCAN_SAMPLES,
    reference=torch.cumsum)
def cumsum(input, dim, *, dtype=None):
    """running sum along ``dim``"""
    return CumSum.apply(input, dim, dtype)


@op("cumprod", torch_names=("torch.cumprod", "torch.Tensor.cumprod", "torch.Tensor.cumprod_"),
    samples=_SCAN_SAMPLES + (S(T((2, 5), low=-1, high=2, integers=True), 1),), reference=torch.cumprod)
def cumprod(input, dim, *, dtype=None):
    """running product along ``dim`` (gradients exact with zeros in the input)"""
    return CumProd.apply(input, dim, dtype)


# -- all / any: boolean, no gradient ---------------------------------------------------------

_LOGIC_SAMPLES = (S(T((2, 3), low=0, high=2, dtype="bool")), S(T((2, 3), low=0, high=2, integers=True), 1),
                  S(T((2, 3, 4), low=0, high=2, dtype="bool"), (0, 2), True), S(T((2, 3)), -1, keepdim=True),
                  S(T((0, 3), dtype="bool")), S(T((), low=0, high=2, dtype="int64")))


@op("all", torch_names=("torch.all", "torch.Tensor.all"), samples=_LOGIC_SAMPLES, reference=torch.all,
    differentiable=False)
def all(input, dim=None, keepdim=False):
    """whether every element (over ``dim``) is nonzero"""
    return torch.all(input) if dim is None else torch.all(input, dim, keepdim)


@op("any", torch_names=("torch.any", "torch.Tensor.any"), samples=_LOGIC_SAMPLES, reference=torch.any,
    differentiable=False)
def any(input, dim=None, keepdim=False):
    """whether some element (over ``dim``) is nonzero"""
    return torch.any(input) if dim is None else torch.any(input, dim, keepdim)

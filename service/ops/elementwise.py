"""Elementwise ops: arithmetic, selection and clamping, forward and backward side by side.

Binary Functions accept a Python number on either side (``1 - x`` arrives as
``sub(1, x)``); numbers get no gradient. Backward reduces broadcast dims with
``sum_to`` and keeps every formula differentiable for double backward.
Unary math (exp, sqrt, abs, floor, ...) is in ``pointwise``, relu in ``activations``.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import like_of, needs, sum_to
from ._registry import op
from ._samples import S, T

_BROADCAST = (T((2, 3)), T((3,)))
_BINARY_SAMPLES = (
    S(T((2, 3)), T((2, 3))),
    S(*_BROADCAST),
    S(T((4, 1)), T((1, 5), noncontiguous=True)),
    S(T(()), T((2, 2))),
    S(T((2, 3)), 1.5),
    S(T((0, 3)), T((3,))),
)


class Add(Function):
    @staticmethod
    def forward(ctx, a, b, alpha=1):
        ctx.a, ctx.b, ctx.alpha = like_of(a), like_of(b), alpha
        if not isinstance(a, torch.Tensor):
            if alpha != 1:
                raise TypeError("add(): alpha is only supported when input is a tensor")
            return torch.add(b, a)
        return torch.add(a, b, alpha=alpha)

    @staticmethod
    def backward(ctx, g):
        ga = sum_to(g, ctx.a) if needs(ctx, 0) else None
        gb = sum_to(g * ctx.alpha if ctx.alpha != 1 else g, ctx.b) if needs(ctx, 1) else None
        return ga, gb, None


@op("add", torch_names=("torch.add", "torch.Tensor.add", "torch.Tensor.__add__", "torch.Tensor.__radd__",
                        "torch.Tensor.add_", "torch.Tensor.__iadd__"),
    samples=_BINARY_SAMPLES + (S(T((2, 3)), T((3,)), alpha=2.5),), reference=torch.add, shape_rule="elementwise",
    native=torch.add, native_inplace=torch.Tensor.add_)
def add(input, other, *, alpha=1):
    """input + alpha * other"""
    return Add.apply(input, other, alpha)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b, alpha=1):
        ctx.a, ctx.b, ctx.alpha = like_of(a), like_of(b), alpha
        if not isinstance(a, torch.Tensor):
            return torch.rsub(b, a, alpha=alpha)
        return torch.sub(a, b, alpha=alpha)

    @staticmethod
    def backward(ctx, g):
        ga = sum_to(g, ctx.a) if needs(ctx, 0) else None
        gb = sum_to(g * -ctx.alpha, ctx.b) if needs(ctx, 1) else None
        return ga, gb, None


@op("sub", torch_names=("torch.sub", "torch.subtract", "torch.Tensor.sub", "torch.Tensor.__sub__",
                        "torch.Tensor.__rsub__", "torch.Tensor.sub_", "torch.Tensor.__isub__"),
    samples=_BINARY_SAMPLES + (S(1.5, T((2, 3))), S(T((2, 3)), T((3,)), alpha=-0.5)),
    reference=lambda a, b, alpha=1: torch.rsub(b, a, alpha=alpha) if not isinstance(a, torch.Tensor)
    else torch.sub(a, b, alpha=alpha),
    shape_rule="elementwise", native=torch.sub, native_inplace=torch.Tensor.sub_)
def sub(input, other, *, alpha=1):
    """input - alpha * other"""
    return Sub.apply(input, other, alpha)


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = like_of(a), like_of(b)
        # Save only what a needed gradient uses (as torch does): a saved tensor whose
        # base is later changed in place would make backward fail for nothing.
        need_a, need_b = ctx.needs_input_grad[:2]
        _save(ctx, a if need_b else None, b if need_a else None)
        return torch.mul(b, a) if not isinstance(a, torch.Tensor) else torch.mul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = _saved(ctx)
        ga = sum_to(g * b, ctx.a) if needs(ctx, 0) else None
        gb = sum_to(g * a, ctx.b) if needs(ctx, 1) else None
        return ga, gb


@op("mul", torch_names=("torch.mul", "torch.multiply", "torch.Tensor.mul", "torch.Tensor.__mul__",
                        "torch.Tensor.__rmul__", "torch.Tensor.mul_", "torch.Tensor.__imul__"),
    samples=_BINARY_SAMPLES + (S(2.0, T((3,))),), reference=lambda a, b: torch.mul(b, a)
    if not isinstance(a, torch.Tensor) else torch.mul(a, b), shape_rule="elementwise",
    native=torch.mul, native_inplace=torch.Tensor.mul_)
def mul(input, other):
    """input * other"""
    return Mul.apply(input, other)


class Div(Function):
    @staticmethod
    def forward(ctx, a, b, rounding_mode=None):
        ctx.a, ctx.b, ctx.rounding = like_of(a), like_of(b), rounding_mode
        _save(ctx, a if ctx.needs_input_grad[1] else None, b)
        if not isinstance(a, torch.Tensor):
            if rounding_mode is not None:
                return torch.div(torch.full_like(b, a), b, rounding_mode=rounding_mode)
            return torch.reciprocal(b) * a  # what torch's Tensor.__rtruediv__ computes
        return torch.div(a, b, rounding_mode=rounding_mode)

    @staticmethod
    def backward(ctx, g):
        a, b = _saved(ctx)
        if ctx.rounding is not None:  # a step function: zero gradient, as in torch
            return (sum_to(g * 0, ctx.a) if needs(ctx, 0) else None,
                    sum_to(g * 0, ctx.b) if needs(ctx, 1) else None, None)
        ga = sum_to(g / b, ctx.a) if needs(ctx, 0) else None
        gb = None
        if needs(ctx, 1):
            if ctx.a is not None:
                gb = sum_to(-g * ((a / b) / b), ctx.b)
            else:  # number / b ran as reciprocal(b) * number: torch's gradient of that, op for op
                r = torch.reciprocal(b)
                gb = sum_to(-(g * a) * (r * r), ctx.b)
        return ga, gb, None


def _div_reference(a, b, rounding_mode=None):
    if not isinstance(a, torch.Tensor):
        return torch.reciprocal(b) * a if rounding_mode is None else torch.div(torch.full_like(b, a), b, rounding_mode=rounding_mode)
    return torch.div(a, b, rounding_mode=rounding_mode)


@op("div", torch_names=("torch.div", "torch.divide", "torch.true_divide", "torch.Tensor.div", "torch.Tensor.divide",
                        "torch.Tensor.true_divide", "torch.Tensor.__truediv__", "torch.Tensor.__rtruediv__",
                        "torch.Tensor.__div__", "torch.Tensor.__rdiv__", "torch.Tensor.div_", "torch.Tensor.__itruediv__"),
    samples=(S(T((2, 3)), T((2, 3), low=0.5, high=2.0)), S(T((2, 3)), T((3,), low=0.5, high=2.0)),
             S(T((2, 3)), 1.5), S(2.0, T((3,), low=0.5, high=2.0)),
             S(T((2, 3)), T((3,), low=0.5, high=2.0), rounding_mode="floor")),
    reference=_div_reference, shape_rule="elementwise", native=torch.div, native_inplace=torch.Tensor.div_)
def div(input, other, *, rounding_mode=None):
    """input / other, optionally rounded ('trunc' or 'floor', zero gradient)"""
    return Div.apply(input, other, rounding_mode)


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return torch.neg(a)

    @staticmethod
    def backward(ctx, g):
        return -g


@op("neg", torch_names=("torch.neg", "torch.negative", "torch.Tensor.neg", "torch.Tensor.__neg__", "torch.Tensor.neg_",
                        "torch.neg_", "torch.negative_", "torch.Tensor.negative", "torch.Tensor.negative_"),
    samples=(S(T((2, 3))), S(T(())), S(T((0,)))), reference=torch.neg, shape_rule="elementwise")
def neg(input):
    """-input"""
    return Neg.apply(input)


class Pow(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = like_of(a), like_of(b)
        out = torch.pow(a, b)
        _save(ctx, a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out = _saved(ctx)
        ga = gb = None
        if needs(ctx, 0):
            # d/da a**b = b * a**(b-1); zero where b == 0 (torch's convention)
            ga = g * torch.where(torch.as_tensor(b == 0), 0.0, b * torch.pow(a, b - 1))
            ga = sum_to(ga, ctx.a)
        if needs(ctx, 1):
            # d/db a**b = a**b * log(a); zero where a == 0 and b >= 0 (torch's convention)
            log_a = torch.log(a) if isinstance(a, torch.Tensor) else torch.log(torch.as_tensor(a, dtype=out.dtype))
            gb = g * torch.where(torch.as_tensor((a == 0) & (b >= 0)), 0.0, out * log_a)
            gb = sum_to(gb, ctx.b)
        return ga, gb


@op("pow", torch_names=("torch.pow", "torch.Tensor.pow", "torch.Tensor.__pow__", "torch.Tensor.__rpow__",
                        "torch.Tensor.pow_", "torch.Tensor.__ipow__"),
    samples=(S(T((2, 3), low=0.5, high=2.0), 2), S(T((2, 3), low=0.5), 0.5), S(T((2, 3)), 3.0),
             S(T((2, 3), low=0.5, high=2.0), T((3,))), S(2.0, T((3,))), S(T(()), 2)),
    reference=torch.pow, shape_rule="elementwise")
def pow(input, exponent):
    """input ** exponent (tensor or number on either side)"""
    return Pow.apply(input, exponent)


class Widen(Function):
    """x in double precision (complex128 if complex); the gradient is cast back to x's dtype."""

    @staticmethod
    def forward(ctx, x):
        ctx.dtype = x.dtype
        return x.to(torch.complex128 if x.is_complex() else torch.float64)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype)


@op("float_power", torch_names=("torch.float_power", "torch.Tensor.float_power"),
    samples=(S(T((2, 3), low=0.5, high=2.0), 2), S(T((2, 3), low=0.5, high=2.0), T((3,))), S(2.0, T((3,))),
             S(T((3,), low=1, high=4, dtype="int64", requires_grad=False), 0.5)),
    reference=torch.float_power)
def float_power(input, exponent):
    """input ** exponent in double precision: both sides are cast first, as torch does"""
    return Pow.apply(*(Widen.apply(x) if isinstance(x, torch.Tensor) else x for x in (input, exponent)))


# -- maximum / minimum ---------------------------------------------------------------------------

def _extremum(name, torch_fn, beats):
    """maximum/minimum: the winner gets the gradient, a tie splits it half/half (torch's rule)."""

    class Extremum(Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return torch_fn(a, b)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            shared = torch.where(a == b, g / 2, g)
            ga = sum_to(shared.masked_fill(beats(b, a), 0), a) if needs(ctx, 0) else None
            gb = sum_to(shared.masked_fill(beats(a, b), 0), b) if needs(ctx, 1) else None
            return ga, gb

    Extremum.__name__ = Extremum.__qualname__ = name.capitalize()
    return Extremum


Maximum = _extremum("maximum", torch.maximum, torch.gt)
Minimum = _extremum("minimum", torch.minimum, torch.lt)
_EXTREMUM_SAMPLES = tuple(s for s in _BINARY_SAMPLES if all(isinstance(a, T) for a in s.args)) + (
    S(T((2, 3)), T((3,), dtype="int64", requires_grad=False)),)


@op("maximum", torch_names=("torch.maximum", "torch.Tensor.maximum"), samples=_EXTREMUM_SAMPLES,
    reference=torch.maximum, shape_rule="elementwise")
def maximum(input, other):
    """elementwise max of two tensors (NaN propagates; a tie gives each half the gradient)"""
    return Maximum.apply(input, other)


@op("minimum", torch_names=("torch.minimum", "torch.Tensor.minimum"), samples=_EXTREMUM_SAMPLES,
    reference=torch.minimum, shape_rule="elementwise")
def minimum(input, other):
    """elementwise min of two tensors (NaN propagates; a tie gives each half the gradient)"""
    return Minimum.apply(input, other)


# -- where / lerp --------------------------------------------------------------------------------

class Where(Function):
    @staticmethod
    def forward(ctx, condition, a, b):
        ctx.a, ctx.b = like_of(a), like_of(b)
        ctx.save_for_backward(condition)
        return torch.where(condition, a, b)

    @staticmethod
    def backward(ctx, g):
        (condition,) = ctx.saved_tensors
        ga = sum_to(torch.where(condition, g, 0), ctx.a) if needs(ctx, 1) else None
        gb = sum_to(torch.where(condition, 0, g), ctx.b) if needs(ctx, 2) else None
        return None, ga, gb


def _mask(shape, **kw):
    return T(shape, low=0.0, high=2.0, dtype="bool", **kw)


@op("where", torch_names=("torch.where",),
    samples=(S(_mask((2, 3)), T((2, 3)), T((2, 3))), S(_mask((2, 3)), T((3,)), T((2, 1))),
             S(_mask((3,)), T((2, 3)), 0.0), S(_mask((2, 3)), 1.5, T((2, 3))), S(_mask(()), T((2, 2)), T(())),
             S(_mask((3, 2), noncontiguous=True), T((3, 2), noncontiguous=True), T((3, 2))),
             S(_mask((0, 3)), T((0, 3)), T((3,))), S(_mask((2, 3)))),
    reference=torch.where, data_dependent=True)  # where(condition) is nonzero
def where(condition, input=None, other=None):
    """input where condition else other (numbers allowed); ``where(condition)`` gives nonzero indices"""
    if input is None and other is None:
        return torch.where(condition)  # index tensors: no gradient
    return Where.apply(condition, input, other)


@op("tensor_where", torch_names=("torch.Tensor.where",),
    samples=(S(T((2, 3)), _mask((2, 3)), T((3,))), S(T((2, 3)), _mask((3,)), 0.0)),
    reference=lambda self, condition, other: self.where(condition, other))
def tensor_where(self, condition, other):
    """``self.where(condition, other)``: torch.where(condition, self, other), the method's argument order"""
    return Where.apply(condition, self, other)


class Lerp(Function):
    @staticmethod
    def forward(ctx, start, end, weight):
        _save(ctx, start, end, weight)
        return torch.lerp(start, end, weight)

    @staticmethod
    def backward(ctx, g):
        start, end, weight = _saved(ctx)
        w = weight.conj() if isinstance(weight, torch.Tensor) else weight.conjugate()
        gs = sum_to(g * (1 - w), start) if needs(ctx, 0) else None
        ge = sum_to(g * w, end) if needs(ctx, 1) else None
        gw = sum_to(g * (end - start).conj(), weight) if needs(ctx, 2) else None
        return gs, ge, gw


@op("lerp", torch_names=("torch.lerp", "torch.Tensor.lerp", "torch.Tensor.lerp_"),
    samples=(S(T((2, 3)), T((2, 3)), 0.3), S(T((2, 3)), T((3,)), T((2, 3), low=0.0, high=1.0)),
             S(T((2, 1)), T((1, 3)), T(())), S(T((3, 2), noncontiguous=True), T((3, 2)), 0.7),
             S(T((0, 3)), T((3,)), 0.5)),
    reference=torch.lerp, shape_rule="elementwise", native_inplace=torch.Tensor.lerp_)
def lerp(input, end, weight):
    """input + weight * (end - input) (weight a number or tensor)"""
    return Lerp.apply(input, end, weight)


# -- clamp ---------------------------------------------------------------------------------------

class Clamp(Function):
    """min(max(x, lo), hi); torch's subgradient: x gets it on [lo, hi] inclusive, a bound where it binds."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        _save(ctx, x, lo, hi)
        return torch.clamp(x, lo, hi)

    @staticmethod
    def backward(ctx, g):
        x, lo, hi = _saved(ctx)
        has_lo, has_hi = lo is not None, hi is not None
        gx = glo = ghi = None
        if needs(ctx, 0):
            inside = (x >= lo) & (x <= hi) if has_lo and has_hi else (x >= lo if has_lo else x <= hi)
            gx = sum_to(torch.where(inside, g, 0), x)
        if needs(ctx, 1):  # a tensor bound; when lo > hi, hi wins and lo gets nothing
            glo = sum_to(torch.where((x < lo) & (lo < hi) if has_hi else x < lo, g, 0), lo)
        if needs(ctx, 2):
            ghi = sum_to(torch.where((x > hi) | (hi < lo) if has_lo else x > hi, g, 0), hi)
        return gx, glo, ghi


def _bounds(lo, hi, **kw):
    return T((3,), low=lo, high=hi, **kw)


@op("clamp", torch_names=("torch.clamp", "torch.clamp_", "torch.clip", "torch.clip_", "torch.Tensor.clamp",
                          "torch.Tensor.clamp_", "torch.Tensor.clip", "torch.Tensor.clip_"),
    samples=(S(T((2, 3)), -0.5, 0.5), S(T((2, 3)), min=-0.5), S(T((2, 3)), max=0.3),
             S(T((2, 3)), _bounds(-1.0, 0.0), _bounds(0.1, 1.0)), S(T((2, 3)), T((2, 3), low=-1.0, high=0.0)),
             S(T((2, 3)), None, _bounds(-1.0, 1.0)), S(T((2, 3)), _bounds(0.5, 1.0), _bounds(-1.0, 0.0)),
             S(T((3, 2), noncontiguous=True), -1.0, 1.0), S(T(()), -0.5, 0.5), S(T((0, 3)), 0.0, 1.0),
             S(T((2, 3), dtype="int64", requires_grad=False), 0.5), S(T((2, 3)), _bounds(-1.0, 0.0, dtype="float64"))),
    reference=torch.clamp, shape_rule="elementwise", native_inplace=torch.Tensor.clamp_)
def clamp(input, min=None, max=None):
    """input limited to [min, max] (numbers or tensors; one may be None)"""
    return Clamp.apply(input, min, max)


@op("clamp_min", torch_names=("torch.clamp_min", "torch.clamp_min_", "torch.Tensor.clamp_min",
                              "torch.Tensor.clamp_min_"),
    samples=(S(T((2, 3)), 0.2), S(T((2, 3)), _bounds(-1.0, 1.0)), S(T(()), 0.0)),
    reference=torch.clamp_min, shape_rule="elementwise")
def clamp_min(input, min):
    """clamp(input, min=min)"""
    return Clamp.apply(input, min, None)


@op("clamp_max", torch_names=("torch.clamp_max", "torch.clamp_max_", "torch.Tensor.clamp_max",
                              "torch.Tensor.clamp_max_"),
    samples=(S(T((2, 3)), 0.2), S(T((2, 3)), _bounds(-1.0, 1.0)), S(T(()), 0.0)),
    reference=torch.clamp_max, shape_rule="elementwise")
def clamp_max(input, max):
    """clamp(input, max=max)"""
    return Clamp.apply(input, None, max)


def _save(ctx, *values):
    """Save the tensors among ``values`` for backward; numbers (and Nones) are kept in their places."""
    ctx.save_for_backward(*(v if isinstance(v, torch.Tensor) else None for v in values))
    ctx.numbers = tuple(None if isinstance(v, torch.Tensor) else v for v in values)


def _saved(ctx):
    """The values given to ``_save``, tensors restored from the saved ones."""
    return tuple(t if n is None else n for t, n in zip(ctx.saved_tensors, ctx.numbers))

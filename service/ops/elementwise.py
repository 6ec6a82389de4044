"""Elementwise ops: arithmetic and pointwise functions, forward and backward side by side.

Binary Functions accept a Python number on either side (``1 - x`` arrives as
``sub(1, x)``); numbers get no gradient. Backward reduces broadcast dims with
``sum_to`` and keeps every formula differentiable for double backward.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import TensorLike, needs, sum_to
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
        ctx.a, ctx.b, ctx.alpha = _like(a), _like(b), alpha
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
    samples=_BINARY_SAMPLES + (S(T((2, 3)), T((3,)), alpha=2.5),), reference=torch.add, shape_rule="elementwise")
def add(input, other, *, alpha=1):
    """input + alpha * other"""
    return Add.apply(input, other, alpha)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b, alpha=1):
        ctx.a, ctx.b, ctx.alpha = _like(a), _like(b), alpha
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
    shape_rule="elementwise")
def sub(input, other, *, alpha=1):
    """input - alpha * other"""
    return Sub.apply(input, other, alpha)


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = _like(a), _like(b)
        ctx.save_for_backward(*(x if isinstance(x, torch.Tensor) else None for x in (a, b)))
        ctx.numbers = tuple(x if not isinstance(x, torch.Tensor) else None for x in (a, b))
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
    if not isinstance(a, torch.Tensor) else torch.mul(a, b), shape_rule="elementwise")
def mul(input, other):
    """input * other"""
    return Mul.apply(input, other)


class Div(Function):
    @staticmethod
    def forward(ctx, a, b, rounding_mode=None):
        ctx.a, ctx.b, ctx.rounding = _like(a), _like(b), rounding_mode
        ctx.save_for_backward(*(x if isinstance(x, torch.Tensor) else None for x in (a, b)))
        ctx.numbers = tuple(x if not isinstance(x, torch.Tensor) else None for x in (a, b))
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
        gb = sum_to(-g * ((a / b) / b), ctx.b) if needs(ctx, 1) else None
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
    reference=_div_reference, shape_rule="elementwise")
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


@op("neg", torch_names=("torch.neg", "torch.negative", "torch.Tensor.neg", "torch.Tensor.__neg__", "torch.Tensor.neg_"),
    samples=(S(T((2, 3))), S(T(())), S(T((0,)))), reference=torch.neg, shape_rule="elementwise")
def neg(input):
    """-input"""
    return Neg.apply(input)


class Pow(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = _like(a), _like(b)
        out = torch.pow(a, b)
        ctx.save_for_backward(*(x if isinstance(x, torch.Tensor) else None for x in (a, b)), out)
        ctx.numbers = tuple(x if not isinstance(x, torch.Tensor) else None for x in (a, b))
        return out

    @staticmethod
    def backward(ctx, g):
        a, b = _saved(ctx)
        out = ctx.saved_tensors[2]
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
                        "torch.Tensor.pow_", "torch.Tensor.__ipow__", "torch.float_power"),
    samples=(S(T((2, 3), low=0.5, high=2.0), 2), S(T((2, 3), low=0.5), 0.5), S(T((2, 3)), 3.0),
             S(T((2, 3), low=0.5, high=2.0), T((3,))), S(2.0, T((3,))), S(T(()), 2)),
    reference=torch.pow, shape_rule="elementwise")
def pow(input, exponent):
    """input ** exponent (tensor or number on either side)"""
    return Pow.apply(input, exponent)


def _unary(name, forward, backward_from, *, torch_names, samples, save="input", doc=""):
    """Build and register a one-input Function: ``backward_from(g, x, out)`` gives the input's grad."""

    class Unary(Function):
        @staticmethod
        def forward(ctx, x):
            out = forward(x)
            ctx.save_for_backward(x if save == "input" else out)
            return out

        @staticmethod
        def backward(ctx, g):
            (saved,) = ctx.saved_tensors
            return backward_from(g, saved)

    Unary.__name__ = Unary.__qualname__ = name.capitalize()

    def fn(input):
        return Unary.apply(input)

    fn.__name__, fn.__doc__ = name, doc or name
    op(name, torch_names=torch_names, samples=samples, reference=forward, shape_rule="elementwise")(fn)
    return Unary


_ANY = (S(T((2, 3))), S(T(())), S(T((3, 2), noncontiguous=True)), S(T((0, 2))))
_POS = (S(T((2, 3), low=0.2, high=3.0)), S(T((), low=0.2, high=3.0)), S(T((3, 2), low=0.2, noncontiguous=True)))

Exp = _unary("exp", torch.exp, lambda g, out: g * out, save="output", samples=_ANY,
             torch_names=("torch.exp", "torch.Tensor.exp", "torch.Tensor.exp_"), doc="e ** input")
Log = _unary("log", torch.log, lambda g, x: g / x, samples=_POS,
             torch_names=("torch.log", "torch.Tensor.log", "torch.Tensor.log_"), doc="natural logarithm")
Tanh = _unary("tanh", torch.tanh, lambda g, out: g * (1 - out * out), save="output", samples=_ANY,
              torch_names=("torch.tanh", "torch.Tensor.tanh", "torch.Tensor.tanh_", "torch.nn.functional.tanh"),
              doc="hyperbolic tangent")
Sigmoid = _unary("sigmoid", torch.sigmoid, lambda g, out: g * out * (1 - out), save="output", samples=_ANY,
                 torch_names=("torch.sigmoid", "torch.Tensor.sigmoid", "torch.Tensor.sigmoid_",
                              "torch.nn.functional.sigmoid", "torch.special.expit"), doc="logistic sigmoid")


class Relu(Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.relu(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(g, out, 0)


@op("relu", torch_names=("torch.relu", "torch.Tensor.relu", "torch.relu_", "torch.Tensor.relu_",
                         "torch.nn.functional.relu", "torch.nn.functional.relu_"),
    samples=_ANY, reference=torch.relu, shape_rule="elementwise")
def relu(input, inplace=False):
    """max(input, 0)"""
    return Relu.apply(input)


def _like(x):
    """What backward needs to know about an input: the tensor's (shape, dtype), or None for a number."""
    return TensorLike(x.shape, x.dtype) if isinstance(x, torch.Tensor) else None


def _saved(ctx):
    """(a, b) with saved tensors restored and numbers put back where they were."""
    saved = ctx.saved_tensors
    return tuple(saved[i] if ctx.numbers[i] is None else ctx.numbers[i] for i in range(2))

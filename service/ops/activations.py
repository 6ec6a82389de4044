"""Activations (``torch.nn.functional``): forward and backward side by side.

Backward calls torch's own derivative kernels where they are themselves
differentiable (``gelu_backward``, ``elu_backward``, ...); where they are not
(``silu_backward``, ``mish_backward``, ``hardsigmoid_backward``) it uses the formula
torch uses under ``create_graph``, so double backward works. ``inplace=True`` is
accepted and ignored: the server writes in place itself.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ._context import current
from ._grad import TensorLike, sum_to
from ._registry import op
from ._samples import S, T
from .elementwise import add, div, neg, sub
from .pointwise import ANY, Abs, Tanh, unary_function

A = torch.ops.aten
_F = "torch.nn.functional."
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _silu_backward(g, x):
    if not torch.is_grad_enabled():  # plain backward: torch's kernel (not itself differentiable)
        return A.silu_backward(g, x)
    s = torch.sigmoid(x)  # under create_graph: torch's infinitely_differentiable_silu_backward
    return g * s * (1.0 + x * (1.0 - s))


def _mish_backward(g, x):
    if not torch.is_grad_enabled():
        return A.mish_backward(g, x)
    s, tanh_sp = torch.sigmoid(x), torch.tanh(A.softplus(x, 1, 20))
    return g * (tanh_sp + x * s * (1.0 - tanh_sp * tanh_sp))


def _hardsigmoid_backward(g, x):
    if not torch.is_grad_enabled():
        return A.hardsigmoid_backward(g, x)
    return torch.where((x > -3) & (x < 3), g / 6, 0)  # torch has no double backward here; this is its formula


Relu = unary_function("Relu", torch.relu, lambda g, out: A.threshold_backward(g, out, 0), save="output")
Hardtanh = unary_function("Hardtanh", A.hardtanh, lambda g, x, lo, hi: A.hardtanh_backward(g, x, lo, hi))
LeakyRelu = unary_function("LeakyRelu", A.leaky_relu, lambda g, x, slope: A.leaky_relu_backward(g, x, slope, False))
Elu = unary_function("Elu", A.elu,
                     lambda g, x, alpha, scale, in_scale: A.elu_backward(g, alpha, scale, in_scale, False, x))
Gelu = unary_function("Gelu", lambda x, approximate: A.gelu(x, approximate=approximate),
                      lambda g, x, approximate: A.gelu_backward(g, x, approximate=approximate))
Silu = unary_function("Silu", A.silu, _silu_backward)
Mish = unary_function("Mish", A.mish, _mish_backward)
Softplus = unary_function("Softplus", A.softplus, lambda g, x, beta, th: A.softplus_backward(g, x, beta, th))
Hardsigmoid = unary_function("Hardsigmoid", A.hardsigmoid, _hardsigmoid_backward)
Hardswish = unary_function("Hardswish", A.hardswish, lambda g, x: A.hardswish_backward(g, x))
Threshold = unary_function("Threshold", A.threshold, lambda g, x, th, value: A.threshold_backward(g, x, th))
Hardshrink = unary_function("Hardshrink", A.hardshrink, lambda g, x, lambd: A.hardshrink_backward(g, x, lambd))
Softshrink = unary_function("Softshrink", A.softshrink, lambda g, x, lambd: A.softshrink_backward(g, x, lambd))
Glu = unary_function("Glu", A.glu, lambda g, x, dim: A.glu_backward(g, x, dim))


class LogSigmoid(Function):
    @staticmethod
    def forward(ctx, x):
        out, buffer = A.log_sigmoid_forward(x)
        ctx.save_for_backward(x, buffer)
        return out

    @staticmethod
    def backward(ctx, g):
        x, buffer = ctx.saved_tensors
        return A.log_sigmoid_backward(g, x, buffer)


@op("relu", torch_names=("torch.relu", "torch.Tensor.relu", "torch.Tensor.relu_", _F + "relu", _F + "relu_"),
    samples=ANY, reference=torch.relu, shape_rule="elementwise")
def relu(input, inplace=False):
    """max(input, 0)"""
    return Relu.apply(input)


_WIDE = (S(T((2, 3), low=-4.0, high=8.0)), S(T(())), S(T((3, 2), low=-4.0, high=4.0, noncontiguous=True)),
         S(T((0, 2))))


@op("relu6", torch_names=(_F + "relu6",), samples=_WIDE, reference=F.relu6, shape_rule="elementwise")
def relu6(input, inplace=False):
    """min(max(input, 0), 6) (gradient 0 at 0 and 6, as in torch)"""
    return Hardtanh.apply(input, 0.0, 6.0)


@op("hardtanh", torch_names=(_F + "hardtanh", _F + "hardtanh_"), reference=F.hardtanh, shape_rule="elementwise",
    samples=ANY + (S(T((2, 3)), -0.5, 1.5), S(T((2, 3)), min_val=0.0, max_val=0.5)))
def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """input clamped to [min_val, max_val] (gradient 0 at the bounds, as in torch)"""
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return Hardtanh.apply(input, min_val, max_val)


@op("leaky_relu", torch_names=(_F + "leaky_relu", _F + "leaky_relu_"), reference=F.leaky_relu,
    samples=ANY + (S(T((2, 3)), 0.2), S(T((2, 3)), negative_slope=-0.5)), shape_rule="elementwise")
def leaky_relu(input, negative_slope=0.01, inplace=False):
    """input if input > 0 else negative_slope * input"""
    return LeakyRelu.apply(input, negative_slope)


@op("elu", torch_names=(_F + "elu", _F + "elu_"), reference=F.elu, samples=ANY + (S(T((2, 3)), 0.5),),
    shape_rule="elementwise")
def elu(input, alpha=1.0, inplace=False):
    """input if input > 0 else alpha * (exp(input) - 1)"""
    return Elu.apply(input, alpha, 1.0, 1.0)


@op("selu", torch_names=("torch.selu", _F + "selu", _F + "selu_"), reference=F.selu, samples=ANY,
    shape_rule="elementwise")
def selu(input, inplace=False):
    """scale * elu(input, alpha) with SELU's fixed constants"""
    return Elu.apply(input, _SELU_ALPHA, _SELU_SCALE, 1.0)


@op("celu", torch_names=("torch.celu", _F + "celu", _F + "celu_"), reference=F.celu,
    samples=ANY + (S(T((2, 3)), 2.0), S(T((2, 3)), alpha=0.5)), shape_rule="elementwise")
def celu(input, alpha=1.0, inplace=False):
    """input if input > 0 else alpha * (exp(input / alpha) - 1)"""
    return Elu.apply(input, alpha, 1.0, 1.0 / alpha)


@op("gelu", torch_names=(_F + "gelu",), reference=F.gelu, shape_rule="elementwise",
    samples=ANY + (S(T((2, 3), low=-4.0, high=4.0), approximate="tanh"), S(T(()), approximate="tanh")))
def gelu(input, approximate="none"):
    """input * Phi(input) (``approximate="tanh"``: the tanh approximation)"""
    return Gelu.apply(input, approximate)


@op("silu", torch_names=(_F + "silu",), reference=F.silu, samples=ANY, shape_rule="elementwise")
def silu(input, inplace=False):
    """input * sigmoid(input)"""
    return Silu.apply(input)


@op("mish", torch_names=(_F + "mish",), reference=F.mish, samples=ANY, shape_rule="elementwise")
def mish(input, inplace=False):
    """input * tanh(softplus(input))"""
    return Mish.apply(input)


@op("softplus", torch_names=(_F + "softplus",), reference=F.softplus, shape_rule="elementwise",
    samples=ANY + (S(T((2, 3), low=-3.0, high=3.0), 2.0, 1.0), S(T((2, 3)), beta=0.5)))
def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta * input)) / beta; linear where beta * input > threshold"""
    return Softplus.apply(input, beta, threshold)


@op("hardsigmoid", torch_names=(_F + "hardsigmoid",), reference=F.hardsigmoid, samples=_WIDE, shape_rule="elementwise")
def hardsigmoid(input, inplace=False):
    """clamp(input / 6 + 1/2, 0, 1) (double backward works here, unlike in torch)"""
    return Hardsigmoid.apply(input)


@op("hardswish", torch_names=(_F + "hardswish",), reference=F.hardswish, samples=_WIDE, shape_rule="elementwise")
def hardswish(input, inplace=False):
    """input * hardsigmoid(input)"""
    return Hardswish.apply(input)


@op("logsigmoid", torch_names=(_F + "logsigmoid",), reference=F.logsigmoid, samples=ANY, shape_rule="elementwise")
def logsigmoid(input):
    """log(sigmoid(input))"""
    return LogSigmoid.apply(input)


@op("threshold", torch_names=("torch.threshold", _F + "threshold", _F + "threshold_"),
    reference=F.threshold, samples=(S(T((2, 3)), 0.1, 20.0), S(T(()), -0.5, 0.0), S(T((0, 2)), 0.0, 1.0)),
    shape_rule="elementwise")
def threshold(input, threshold, value, inplace=False):
    """input where input > threshold, else value"""
    return Threshold.apply(input, threshold, value)


@op("hardshrink", torch_names=("torch.Tensor.hardshrink", _F + "hardshrink"),
    reference=F.hardshrink, samples=ANY + (S(T((2, 3)), 1.0),), shape_rule="elementwise")
def hardshrink(input, lambd=0.5):
    """input where |input| > lambd, else 0"""
    return Hardshrink.apply(input, lambd)


@op("softshrink", torch_names=(_F + "softshrink",), reference=F.softshrink,
    samples=ANY + (S(T((2, 3)), 1.0),), shape_rule="elementwise")
def softshrink(input, lambd=0.5):
    """input - lambd * sign(input) where |input| > lambd, else 0"""
    return Softshrink.apply(input, lambd)


@op("tanhshrink", torch_names=(_F + "tanhshrink",), reference=F.tanhshrink, samples=ANY, shape_rule="elementwise")
def tanhshrink(input):
    """input - tanh(input) (composed, as in torch)"""
    return sub(input, Tanh.apply(input))


@op("softsign", torch_names=(_F + "softsign",), reference=F.softsign, samples=ANY, shape_rule="elementwise")
def softsign(input):
    """input / (|input| + 1) (composed, as in torch)"""
    return div(input, add(Abs.apply(input), 1))


@op("glu", torch_names=(_F + "glu",), reference=F.glu,
    samples=(S(T((2, 4))), S(T((4, 3)), 0), S(T((3, 2, 2), noncontiguous=True), dim=1), S(T((0, 2)))))
def glu(input, dim=-1):
    """a * sigmoid(b), input split in halves a, b along dim"""
    if input.dim() == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    return Glu.apply(input, dim)


# -- softmax family ------------------------------------------------------------------------------

def _softmax_function(name, forward, backward_data):
    """softmax/log_softmax over ``dim`` (computed in ``dtype`` if given); backward: torch's kernel."""

    class SoftmaxLike(Function):
        @staticmethod
        def forward(ctx, x, dim, dtype):
            out = forward(x, dim, dtype=dtype)
            ctx.dim, ctx.x = dim, TensorLike(x.shape, x.dtype)
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, g):
            (out,) = ctx.saved_tensors
            return sum_to(backward_data(g, out, ctx.dim, out.dtype), ctx.x), None, None  # cast back to x's dtype

    SoftmaxLike.__name__ = SoftmaxLike.__qualname__ = name
    return SoftmaxLike


Softmax = _softmax_function("Softmax", torch.softmax, A._softmax_backward_data)
LogSoftmax = _softmax_function("LogSoftmax", torch.log_softmax, A._log_softmax_backward_data)


def _softmax_args(name, input, dim, stacklevel, dtype):
    """(dim, dtype) from any of the spellings: F.X(input, dim, _stacklevel, dtype), torch.X / x.X(dim, dtype)."""
    if isinstance(stacklevel, torch.dtype):  # torch.softmax(x, 1, torch.float64): the third is the dtype
        dtype = stacklevel
    if dim is None:  # F.X's legacy implicit dim
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. "
                      "Change the call to include dim=X as an argument.", stacklevel=3)
        dim = 0 if input.dim() in (0, 1, 3) else 1
    return dim, dtype


_SOFTMAX = (S(T((2, 3)), 1), S(T((2, 3)), 0), S(T((2, 3, 4)), -1), S(T((3, 2), noncontiguous=True), dim=1),
            S(T(()), 0), S(T((0, 3)), 1), S(T((2, 3)), 1, dtype=torch.float64), S(T((2, 1, 2, 3)), dim=2))


@op("softmax", shape_rule="like_input",
    torch_names=("torch.softmax", "torch.Tensor.softmax", "torch.special.softmax", _F + "softmax"),
    samples=_SOFTMAX, reference=F.softmax)
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(input) / sum(exp(input)) along dim"""
    return Softmax.apply(input, *_softmax_args("softmax", input, dim, _stacklevel, dtype))


@op("log_softmax", shape_rule="like_input",
    torch_names=("torch.log_softmax", "torch.Tensor.log_softmax", "torch.special.log_softmax", _F + "log_softmax"),
    samples=_SOFTMAX, reference=F.log_softmax)
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """log(softmax(input, dim))"""
    return LogSoftmax.apply(input, *_softmax_args("log_softmax", input, dim, _stacklevel, dtype))


@op("softmin", torch_names=(_F + "softmin",), samples=_SOFTMAX, reference=F.softmin)
def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-input, dim) (composed, as in torch)"""
    return Softmax.apply(neg(input), *_softmax_args("softmin", input, dim, _stacklevel, dtype))


# -- dropout -------------------------------------------------------------------------------------

class Dropout(Function):
    @staticmethod
    def forward(ctx, x, noise):
        ctx.save_for_backward(noise)
        return x * noise

    @staticmethod
    def backward(ctx, g):
        (noise,) = ctx.saved_tensors
        return g * noise, None


@op("dropout", torch_names=(_F + "dropout", "torch.dropout", "torch.dropout_"), reference=F.dropout, exact=False,
    samples=(S(T((4, 5)), 0.5), S(T((3, 4)), p=0.2), S(T((3, 4)), 0.5, training=False), S(T((2, 3)), 1.0),
             S(T((2, 3)), 0.0), S(T((3, 4), noncontiguous=True), 0.3), S(T((0, 3)), 0.5), S(T(()), 0.5)),
    shape_rule="elementwise")
def dropout(input, p=0.5, training=True, inplace=False):
    """zero each element with probability p (session generator), scale the rest by 1 / (1 - p)"""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0 or input.numel() == 0:
        return input  # torch returns the input itself
    if p == 1:
        noise = torch.zeros((), dtype=input.dtype, device=input.device)
    else:  # torch's CPU path: noise = bernoulli_(1 - p), noise /= 1 - p, input * noise
        noise = torch.empty_like(input).bernoulli_(1 - p, generator=current().generator).div_(1 - p)
    return Dropout.apply(input, noise)

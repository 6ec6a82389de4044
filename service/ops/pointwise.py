"""Unary math: one input, one output, the gradient a formula of the input or the output.

Each op is one line of ``_unary``: torch's forward and torch's derivative formula
(from ``derivatives.yaml``) side by side. Backward formulas use only differentiable
torch ops, so double backward works. Float-only functions promote integer input to
float as torch does (``shape_rule="meta"``); dtype-keeping ones are "elementwise".
Piecewise-constant functions (sign, round, floor, ...) have zero gradient, as in torch.
Formulas keep torch's ``.conj()`` (a no-op on real tensors), so complex input gets torch's gradient.
"""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T


def unary_function(name, forward, backward, *, save="input"):
    """A Function class: ``forward(x, *params)`` and ``backward(g, saved, *params)`` side by side.

    ``save`` is "input" or "output": which tensor backward's formula reads (saving the
    output keeps double backward exact, the output being this Function's own result).
    Params are numbers/strings (no gradient).
    """

    class Unary(Function):
        @staticmethod
        def forward(ctx, x, *params):
            out = forward(x, *params)
            ctx.params = params
            ctx.save_for_backward(x if save == "input" else out)
            return out

        @staticmethod
        def backward(ctx, g):
            (saved,) = ctx.saved_tensors
            return (backward(g, saved, *ctx.params), *(None,) * len(ctx.params))

    Unary.__name__ = Unary.__qualname__ = name
    return Unary


def _unary(name, forward, backward, *, torch_names, samples, save="input", shape_rule="elementwise_float", doc="",
           native=False):
    """Build and register a one-input op: ``backward(g, x_or_out)`` gives the input's grad.

    ``native``: ``forward`` itself runs when no graph is recorded (see ``OpEntry.native``).
    """
    function = unary_function(name.capitalize(), forward, backward, save=save)

    def fn(input):
        return function.apply(input)

    fn.__name__, fn.__doc__ = name, doc or name
    op(name, torch_names=torch_names, samples=samples, reference=forward, shape_rule=shape_rule,
       native=forward if native else None)(fn)
    return function


def _names(*names, special=(), inplace=True):
    """torch spellings of a unary function: ``torch.X``, ``torch.Tensor.X`` (+ ``X_`` forms), aliases."""
    out = []
    for n in names:
        out += [f"torch.{n}", f"torch.Tensor.{n}"] + ([f"torch.{n}_", f"torch.Tensor.{n}_"] if inplace else [])
    return tuple(out) + tuple(f"torch.special.{n}" for n in special)


_INT = S(T((3,), dtype="int64", requires_grad=False))
ANY = (S(T((2, 3))), S(T(())), S(T((3, 2), noncontiguous=True)), S(T((0, 2))))
_POS = (S(T((2, 3), low=0.2, high=3.0)), S(T((), low=0.2, high=3.0)), S(T((3, 2), low=0.2, noncontiguous=True)),
        S(T((0, 2), low=0.2)), S(T((3,), low=1, high=4, dtype="int64", requires_grad=False)))
_UNIT = (S(T((2, 3), low=-0.9, high=0.9)), S(T((), low=-0.9, high=0.9)),
         S(T((3, 2), low=-0.9, high=0.9, noncontiguous=True)))
_MATH = ANY + (_INT,)
_SQRT_PI = math.sqrt(math.pi)
_LN10 = 2.3025850929940456  # the literal in torch's derivatives.yaml: one ulp off math.log(10)

# -- exponentials and logarithms ------------------------------------------------------------------

Exp = _unary("exp", torch.exp, lambda g, out: g * out.conj(), save="output", samples=_MATH,
             torch_names=_names("exp"), doc="e ** input")
Exp2 = _unary("exp2", torch.exp2, lambda g, out: g * out.conj() * math.log(2.0), save="output", samples=_MATH,
              torch_names=_names("exp2", special=("exp2",)), doc="2 ** input")
Expm1 = _unary("expm1", torch.expm1, lambda g, out: g * (out.conj() + 1), save="output", samples=_MATH,
               torch_names=_names("expm1", special=("expm1",)), doc="e ** input - 1")
Log = _unary("log", torch.log, lambda g, x: g / x.conj(), samples=_POS, torch_names=_names("log"),
             doc="natural logarithm")
Log2 = _unary("log2", torch.log2, lambda g, x: g / (x.conj() * math.log(2.0)), samples=_POS,
              torch_names=_names("log2"), doc="base-2 logarithm")
Log10 = _unary("log10", torch.log10, lambda g, x: g / (x.conj() * _LN10), samples=_POS,
               torch_names=_names("log10"), doc="base-10 logarithm")
Log1p = _unary("log1p", torch.log1p, lambda g, x: g / (x + 1).conj(),
               samples=_POS + (S(T((2, 3), low=-0.8, high=2.0)),),
               torch_names=_names("log1p", special=("log1p",)), doc="log(1 + input)")
Sqrt = _unary("sqrt", torch.sqrt, lambda g, out: g / (2 * out.conj()), save="output", samples=_POS,
              torch_names=_names("sqrt"), doc="square root", native=True)  # Adam's, RMSprop's denominators
Rsqrt = _unary("rsqrt", torch.rsqrt, lambda g, out: -0.5 * g * out.pow(3).conj(), save="output", samples=_POS,
               torch_names=_names("rsqrt"), doc="1 / sqrt(input)")

# -- trigonometric and hyperbolic ------------------------------------------------------------------

Sin = _unary("sin", torch.sin, lambda g, x: g * x.cos().conj(), samples=_MATH, torch_names=_names("sin"), doc="sine")
Cos = _unary("cos", torch.cos, lambda g, x: g * -x.sin().conj(), samples=_MATH, torch_names=_names("cos"), doc="cosine")
Tan = _unary("tan", torch.tan, lambda g, out: g * (1 + out.pow(2)).conj(), save="output",
             samples=_UNIT + (S(T((2, 3), low=-1.2, high=1.2)),), torch_names=_names("tan"), doc="tangent")
Asin = _unary("asin", torch.asin, lambda g, x: g * (-x * x + 1).rsqrt().conj(), samples=_UNIT,
              torch_names=_names("asin", "arcsin"), doc="inverse sine")
Acos = _unary("acos", torch.acos, lambda g, x: g * -(-x * x + 1).rsqrt().conj(), samples=_UNIT,
              torch_names=_names("acos", "arccos"), doc="inverse cosine")
Atan = _unary("atan", torch.atan, lambda g, x: g / (x * x + 1).conj(), samples=_MATH,
              torch_names=_names("atan", "arctan"), doc="inverse tangent")
Sinh = _unary("sinh", torch.sinh, lambda g, x: g * x.cosh().conj(), samples=_MATH, torch_names=_names("sinh"),
              doc="hyperbolic sine")
Cosh = _unary("cosh", torch.cosh, lambda g, x: g * x.sinh().conj(), samples=_MATH, torch_names=_names("cosh"),
              doc="hyperbolic cosine")
Tanh = _unary("tanh", torch.tanh, lambda g, out: torch.ops.aten.tanh_backward(g, out), save="output", samples=_MATH,
              torch_names=_names("tanh") + ("torch.nn.functional.tanh",), doc="hyperbolic tangent")
Asinh = _unary("asinh", torch.asinh, lambda g, x: g * (x.pow(2) + 1).rsqrt().conj(), samples=_MATH,
               torch_names=_names("asinh", "arcsinh"), doc="inverse hyperbolic sine")
Acosh = _unary("acosh", torch.acosh, lambda g, x: g * (x.pow(2) - 1).rsqrt().conj(),
               samples=(S(T((2, 3), low=1.2, high=3.0)), S(T((), low=1.2, high=3.0))),
               torch_names=_names("acosh", "arccosh"), doc="inverse hyperbolic cosine")
Atanh = _unary("atanh", torch.atanh, lambda g, x: g * 1 / (1 - x.pow(2)).conj(), samples=_UNIT,
               torch_names=_names("atanh", "arctanh"), doc="inverse hyperbolic tangent")

# -- special functions -----------------------------------------------------------------------------

Sigmoid = _unary("sigmoid", torch.sigmoid, lambda g, out: torch.ops.aten.sigmoid_backward(g, out), save="output",
                 samples=_MATH,
                 torch_names=_names("sigmoid", special=("expit",)) + ("torch.nn.functional.sigmoid",),
                 doc="logistic sigmoid")
Erf = _unary("erf", torch.erf, lambda g, x: 2.0 / _SQRT_PI * torch.exp(-x.pow(2)) * g, samples=_MATH,
             torch_names=_names("erf", special=("erf",)), doc="error function")
Erfc = _unary("erfc", torch.erfc, lambda g, x: -2.0 / _SQRT_PI * torch.exp(-x.pow(2)) * g, samples=_MATH,
              torch_names=_names("erfc", special=("erfc",)), doc="complementary error function")

# -- arithmetic on one input (dtype kept) ----------------------------------------------------------


def _sgn_backward(g, x):
    """torch's sgn_backward: zero for real input; for complex, (g - sgn^2 conj(g)) / 2|x|, 0 at x = 0."""
    if not x.is_complex():
        return torch.zeros_like(g)
    s, a = x.sgn(), x.abs()
    return ((g - (s * s) * g.conj()) / (2.0 * a)).masked_fill(a == 0.0, 0.0)


_NONZERO = (S(T((2, 3), low=0.2, high=2.0)), S(T((2, 3), low=-2.0, high=-0.2)), S(T(())),
            S(T((3, 2), low=0.2, noncontiguous=True)), S(T((0, 2))))

Abs = _unary("abs", torch.abs, lambda g, x: g * x.sgn(), samples=ANY + (_INT,), shape_rule="elementwise",
             torch_names=_names("abs") + ("torch.absolute", "torch.Tensor.absolute", "torch.Tensor.absolute_"),
             doc="|input| (gradient 0 at 0, as in torch)")
Square = _unary("square", torch.square, lambda g, x: g * (2 * x).conj(), samples=ANY + (_INT,),
                shape_rule="elementwise",
                torch_names=_names("square"), doc="input * input")
Reciprocal = _unary("reciprocal", torch.reciprocal, lambda g, out: -g * (out * out).conj(), save="output",
                    samples=_NONZERO + (S(T((3,), low=1, high=4, dtype="int64", requires_grad=False)),),
                    torch_names=_names("reciprocal"), doc="1 / input")
Sgn = _unary("sgn", torch.sgn, lambda g, x: _sgn_backward(g, x), samples=ANY + (_INT,), shape_rule="elementwise",
              torch_names=_names("sgn", inplace=False) + ("torch.Tensor.sgn_",), doc="sign; x / |x| for complex")
Frac = _unary("frac", torch.frac, lambda g, x: g, samples=ANY, shape_rule="elementwise",
              torch_names=_names("frac"), doc="input - trunc(input) (gradient 1)")


class Step(Function):
    """A piecewise-constant function: torch's forward, zero gradient (torch's ``zeros_like(grad)``)."""

    @staticmethod
    def forward(ctx, x, fn, kwargs):
        return fn(x, **kwargs)

    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g), None, None


_STEP = ANY + (_INT,)


def _step(name, torch_fn, torch_names, doc):
    def fn(input):
        return Step.apply(input, torch_fn, {})

    fn.__name__, fn.__doc__ = name, doc
    op(name, torch_names=torch_names, samples=_STEP, reference=torch_fn, shape_rule="elementwise")(fn)


_step("sign", torch.sign, _names("sign", inplace=False) + ("torch.Tensor.sign_",), "-1, 0 or 1 (zero gradient)")
_step("floor", torch.floor, _names("floor"), "round down (zero gradient)")
_step("ceil", torch.ceil, _names("ceil"), "round up (zero gradient)")
_step("trunc", torch.trunc, _names("trunc", "fix"), "round toward zero (zero gradient)")


@op("round", torch_names=_names("round", special=("round",)),
    samples=_STEP + (S(T((2, 3), low=-30.0, high=30.0), decimals=1), S(T((2, 3)), decimals=-1)),
    reference=torch.round, shape_rule="elementwise")
def round(input, *, decimals=0):
    """round half to even, optionally to ``decimals`` places (zero gradient)"""
    # decimals only when asked: torch.round(int tensor) works, its decimals kernel does not
    return Step.apply(input, torch.round, {"decimals": decimals} if decimals else {})

"""Comparisons, logical and bitwise ops, and value tests: no gradient, plain torch calls.

Results are bool (comparisons, logical ops, isnan, ...) or the promoted integer/bool
dtype (bitwise ops). Registered ``differentiable=False``: their outputs never require
grad, as in torch. ``x.eq_(y)`` and friends run out of place and are copied in by the
server, which writes 0/1 in ``x``'s dtype exactly as torch's in-place comparison does.
"""

from __future__ import annotations

import torch

from ._registry import op
from ._samples import S, T


def _names(*names, dunders=(), inplace=True):
    """``torch.X``, ``torch.Tensor.X`` (and ``torch.Tensor.X_``) for each alias, plus Tensor dunders."""
    out = []
    for n in names:
        out += [f"torch.{n}", f"torch.Tensor.{n}"] + ([f"torch.Tensor.{n}_"] if inplace else [])
    return tuple(out) + tuple(f"torch.Tensor.{d}" for d in dunders)


def _plain(name, torch_fn, torch_names, samples, doc, *, unary=False, shape_rule="meta"):
    """Register a thin wrapper over ``torch_fn`` with torch's signature, ``(input, other)`` or ``(input)``."""
    if unary:
        def fn(input):
            return torch_fn(input)
    else:
        def fn(input, other):
            return torch_fn(input, other)

    fn.__name__, fn.__doc__ = name, doc
    op(name, torch_names=torch_names, samples=samples, reference=torch_fn, differentiable=False,
       shape_rule=shape_rule)(fn)


def _mask(shape, **kw):
    return T(shape, low=0.0, high=2.0, dtype="bool", **kw)


_INTS = dict(low=-2, high=3, integers=True)  # small integers: ties happen, so eq/le/ge are really tested
_CMP = (
    S(T((2, 3), **_INTS), T((2, 3), **_INTS)),
    S(T((2, 3), **_INTS), T((3,), **_INTS)),
    S(T((4, 1), **_INTS), T((1, 5), noncontiguous=True, **_INTS)),
    S(T(()), T((2, 2))),
    S(T((2, 3), **_INTS), 1.0),
    S(T((2, 3), **_INTS), 0),
    S(T((2, 3), **_INTS), T((3,), dtype="int64", requires_grad=False)),
    S(T((0, 3)), T((3,))),
)


for _name, _fn, _aliases, _dunder, _doc in (
    ("eq", torch.eq, (), "__eq__", "input == other (bool)"),
    ("ne", torch.ne, ("not_equal",), "__ne__", "input != other (bool)"),
    ("lt", torch.lt, ("less",), "__lt__", "input < other (bool)"),
    ("le", torch.le, ("less_equal",), "__le__", "input <= other (bool)"),
    ("gt", torch.gt, ("greater",), "__gt__", "input > other (bool)"),
    ("ge", torch.ge, ("greater_equal",), "__ge__", "input >= other (bool)"),
):
    _plain(_name, _fn, _names(_name, *_aliases, dunders=(_dunder,)), _CMP, _doc)


# -- logical: any dtype in, bool out ---------------------------------------------------------------

_LOGICAL = (
    S(_mask((2, 3)), _mask((2, 3))),
    S(_mask((2, 3)), _mask((3,))),
    S(T((2, 3), **_INTS), _mask((2, 3))),
    S(_mask((3, 2), noncontiguous=True), T((3, 2))),
    S(_mask(()), _mask((0, 2))),
)


_plain("logical_and", torch.logical_and, _names("logical_and"), _LOGICAL, "input and other, elementwise (bool)")
_plain("logical_or", torch.logical_or, _names("logical_or"), _LOGICAL, "input or other, elementwise (bool)")
_plain("logical_xor", torch.logical_xor, _names("logical_xor"), _LOGICAL, "input xor other, elementwise (bool)")
_plain("logical_not", torch.logical_not, _names("logical_not"), unary=True, doc="not input, elementwise (bool)",
       samples=(S(_mask((2, 3))), S(T((2, 3), **_INTS)), S(_mask(())), S(_mask((3, 2), noncontiguous=True))))


# -- bitwise on bool/integer tensors: masks combined with &, |, ^, ~ --------------------------------

_BITS = (
    S(_mask((2, 3)), _mask((2, 3))),
    S(_mask((2, 3)), _mask((3,))),
    S(T((2, 3), low=0, high=8, dtype="int64"), T((3,), low=0, high=8, dtype="int64")),
    S(_mask((2, 3)), True),
    S(T((2, 3), low=0, high=8, dtype="int64"), 5),
    S(_mask((0, 3)), _mask((3,))),
)


for _name, _fn, _dunder, _doc in (
    ("bitwise_and", torch.bitwise_and, "and", "input & other (bool or integer)"),
    ("bitwise_or", torch.bitwise_or, "or", "input | other (bool or integer)"),
    ("bitwise_xor", torch.bitwise_xor, "xor", "input ^ other (bool or integer)"),
):
    _plain(_name, _fn, _names(_name, dunders=(f"__{_dunder}__", f"__r{_dunder}__", f"__i{_dunder}__")), _BITS, _doc,
           shape_rule="elementwise")
_plain("bitwise_not", torch.bitwise_not, _names("bitwise_not", dunders=("__invert__",)), unary=True,
       doc="~input (bool or integer)", shape_rule="elementwise",
       samples=(S(_mask((2, 3))), S(T((2, 3), low=-4, high=4, dtype="int64")), S(_mask(()))))


# -- value tests -----------------------------------------------------------------------------------

_VALUES = (S(T((2, 3))), S(T(())), S(T((3, 2), noncontiguous=True)), S(T((0, 2))),
           S(T((2, 3), dtype="int64", requires_grad=False)))


for _name, _fn, _doc in (
    ("isnan", torch.isnan, "input is NaN (bool)"),
    ("isfinite", torch.isfinite, "input is neither inf nor NaN (bool)"),
    ("isinf", torch.isinf, "input is +inf or -inf (bool)"),
    ("isposinf", torch.isposinf, "input is +inf (bool)"),
    ("isneginf", torch.isneginf, "input is -inf (bool)"),
    ("signbit", torch.signbit, "the sign bit is set (bool; true for -0.0)"),
):
    _plain(_name, _fn, _names(_name, inplace=False), _VALUES, _doc, unary=True)

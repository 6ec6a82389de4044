"""Conversions and copies: ``to(dtype)``, ``.float()`` and friends, ``type``, ``clone``, ``contiguous``.

A conversion's gradient is the output grad cast back to the input's dtype; integer and
bool results carry no gradient (their entries say ``differentiable=False``). Moving
between devices is the client's business: a device other than the tensor's own is
refused here.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T


class Cast(Function):
    @staticmethod
    def forward(ctx, x, dtype, copy, memory_format):
        ctx.in_dtype = x.dtype
        return x.to(dtype, copy=copy, memory_format=memory_format)

    @staticmethod
    def backward(ctx, g):
        if g.is_complex() and not ctx.in_dtype.is_complex:
            g = g.real
        return g.to(ctx.in_dtype), None, None, None


def _convert(input, dtype, copy=False, memory_format=torch.preserve_format):
    if dtype is None or (dtype == input.dtype and not copy and memory_format == torch.preserve_format):
        return input  # torch returns self: no copy, same tensor
    return Cast.apply(input, dtype, copy, memory_format)


def _check_device(input, device) -> None:
    if device is None or input.device.type == "meta":  # the meta check of the call: the real run checks
        return
    want = torch.device(device)
    if want.type != input.device.type or (want.index is not None and want.index != input.device.index):
        raise ValueError(f"to(): this server keeps the tensor on {input.device} and does not move it to {want}; "
                         "the client copies tensors to its own device when it fetches them")


def _to_args(args: tuple, kwargs: dict) -> tuple:
    """``(device, dtype, copy, memory_format)`` from torch's three ``to`` forms:
    ``to(dtype, non_blocking, copy)``, ``to(device, dtype, non_blocking, copy)``, ``to(other, non_blocking, copy)``."""
    kw = dict(kwargs)
    device, dtype = kw.pop("device", None), kw.pop("dtype", None)
    rest = list(args)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
        device, dtype = other.device, other.dtype
    elif rest and isinstance(rest[0], torch.dtype):
        dtype = rest.pop(0)
    elif rest and (isinstance(rest[0], (str, torch.device)) or rest[0] is None
                   or (isinstance(rest[0], int) and not isinstance(rest[0], bool))):
        device = rest.pop(0)
        if rest and (isinstance(rest[0], torch.dtype) or rest[0] is None):
            dtype = rest.pop(0)
    if len(rest) > 2 or not all(isinstance(r, bool) for r in rest):
        raise TypeError(f"to() received an invalid combination of arguments: {args!r}")
    flags = dict(zip(("non_blocking", "copy"), rest))
    kw.pop("non_blocking", flags.pop("non_blocking", None))  # no meaning here: every step is synchronous
    copy = kw.pop("copy", flags.get("copy", False))
    memory_format = kw.pop("memory_format", torch.preserve_format)
    if kw:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kw)}")
    return device, dtype, copy, memory_format


@op("to", torch_names=("torch.Tensor.to",),
    samples=(S(T((2, 3)), torch.float64), S(T((2, 3)), dtype=torch.float64),
             S(T((3, 2), noncontiguous=True), torch.float64), S(T((2, 3)), "cpu", torch.float64),
             S(T((2, 3)), torch.float64, False, True), S(T((2, 3)), T((1,), dtype="float64")),
             S(T(()), torch.float64, copy=True), S(T((2, 3), requires_grad=False), torch.float16),
             S(T((2, 3), low=0.1, high=3.9, requires_grad=False), torch.int64), S(T((2, 3)), device="cpu")),
    reference=torch.Tensor.to)
def to(input, *args, **kwargs):
    """a dtype conversion (``copy=True`` always copies); a device other than the tensor's own is refused"""
    device, dtype, copy, memory_format = _to_args(args, kwargs)
    _check_device(input, device)
    return _convert(input, dtype, copy, memory_format)


def _conversion(name: str, dtype: torch.dtype, reference, samples) -> None:
    """Register ``input.<name>()``, which is ``input.to(dtype)``."""

    def fn(input, memory_format=torch.preserve_format):
        return _convert(input, dtype, False, memory_format)

    fn.__name__, fn.__doc__ = name, f"``input.to({dtype})``"
    op(name, torch_names=(f"torch.Tensor.{name}",), samples=samples, reference=reference,
       differentiable=dtype.is_floating_point)(fn)


# Gradcheck perturbs in float64; a result in lower precision can't pass it, so those samples carry no grad.
_NO_GRAD = (S(T((2, 3), requires_grad=False)), S(T((2, 3), dtype="int64", requires_grad=False)),
            S(T((3, 2), noncontiguous=True, requires_grad=False)))
_UPCAST = (S(T((2, 3))), S(T(())), S(T((3, 2), noncontiguous=True)))  # float32 -> float64 in the f32 test
_INT = (S(T((2, 3), low=0.1, high=3.9)), S(T((2, 3), low=-3.9, high=-0.1)), S(T(())), S(T((2,), dtype="bool", high=2)))
for _name, _dtype, _ref, _samples in (
    ("float", torch.float32, torch.Tensor.float, _NO_GRAD + (S(T((2, 3), dtype="float16", requires_grad=False)),)),
    ("double", torch.float64, torch.Tensor.double, _NO_GRAD + _UPCAST),
    ("half", torch.float16, torch.Tensor.half, _NO_GRAD + (S(T((2, 3), dtype="float16", requires_grad=False)),)),
    ("bfloat16", torch.bfloat16, torch.Tensor.bfloat16, _NO_GRAD),
    ("long", torch.int64, torch.Tensor.long, _INT),
    ("int", torch.int32, torch.Tensor.int, _INT),
    ("bool", torch.bool, torch.Tensor.bool, _INT + (S(T((2, 3), integers=True)),)),
):
    _conversion(_name, _dtype, _ref, _samples)

_TYPE_NAMES = {
    "torch.FloatTensor": torch.float32, "torch.DoubleTensor": torch.float64, "torch.HalfTensor": torch.float16,
    "torch.BFloat16Tensor": torch.bfloat16, "torch.LongTensor": torch.int64, "torch.IntTensor": torch.int32,
    "torch.ShortTensor": torch.int16, "torch.CharTensor": torch.int8, "torch.ByteTensor": torch.uint8,
    "torch.BoolTensor": torch.bool,
}


@op("type", torch_names=("torch.Tensor.type",),
    samples=(S(T((2, 3)), torch.float64), S(T((2, 3)), "torch.DoubleTensor"), S(T((2, 3)), dtype=torch.float64),
             S(T((2, 3), requires_grad=False), torch.int32)),
    reference=torch.Tensor.type)
def convert_type(input, dtype=None, non_blocking=False):
    """``input.to(dtype)``; ``dtype`` may be a CPU type name such as ``"torch.DoubleTensor"``"""
    if dtype is None:
        raise TypeError("type() without a dtype returns the type's name, not a tensor: the client answers it")
    if isinstance(dtype, str):
        if dtype not in _TYPE_NAMES:
            raise ValueError(f"type(): unsupported type name {dtype!r}; "
                             f"expected a dtype or one of {', '.join(_TYPE_NAMES)}")
        dtype = _TYPE_NAMES[dtype]
    return _convert(input, dtype)


class Clone(Function):
    @staticmethod
    def forward(ctx, x, memory_format):
        return x.clone(memory_format=memory_format)

    @staticmethod
    def backward(ctx, g):
        return g, None


@op("clone", torch_names=("torch.clone", "torch.Tensor.clone"),
    samples=(S(T((2, 3))), S(T(())), S(T((3, 2), noncontiguous=True)), S(T((0, 2))),
             S(T((3, 2), noncontiguous=True), memory_format=torch.contiguous_format)),
    reference=torch.clone)
def clone(input, *, memory_format=torch.preserve_format):
    """a copy that owns its memory"""
    return Clone.apply(input, memory_format)


@op("contiguous", torch_names=("torch.Tensor.contiguous",),
    samples=(S(T((2, 3))), S(T((3, 2), noncontiguous=True)), S(T(()))), reference=torch.Tensor.contiguous)
def contiguous(input, memory_format=torch.contiguous_format):
    """``input`` itself when already contiguous, else a contiguous copy"""
    if input.is_contiguous(memory_format=memory_format):
        return input
    return Clone.apply(input, memory_format)

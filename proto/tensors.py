"""Tensor encoding: ``{dtype, shape, data}`` with ``data`` raw little-endian bytes.

msgpack carries ``data`` as ``bin``; JSON carries a flat list of numbers, or a
base64 string where a list cannot be exact (NaN/inf, int64 beyond 2^53,
bfloat16, complex). Decoding validates everything before allocating, then makes
exactly one copy out of the received buffer.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
import warnings
from typing import TYPE_CHECKING, Any

import torch

from .dtypes import DTYPE_NAMES, DTYPES, ITEMSIZES, dtype_from_name, dtype_name
from .errors import ErrorCode, ProtocolError, bad_request

if TYPE_CHECKING:
    from .messages import TensorData

if sys.byteorder != "little":  # pragma: no cover - no big-endian hosts in sight
    raise ImportError("proto assumes a little-endian host")

_JSON_EXACT_INT = 2**53
_MAX_BYTES = 2**62  # no dims whose byte size would overflow torch's int64 arithmetic
_LIST_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"}

# torch.frombuffer warns once per process about read-only buffers (msgpack hands
# out immutable bytes). We always copy out of the view, so the warning is noise:
# trigger it once here, silenced, instead of filtering warnings process-wide.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.frombuffer(b"\0\0\0\0", dtype=torch.float32)


def encode_tensor(t: torch.Tensor, *, as_json: bool = False, as_view: bool = False,
                  private: bool = False) -> dict[str, Any]:
    """The wire form of ``t``'s values (never its graph); C-contiguous, on the CPU.

    ``as_view``: ``data`` is a memoryview of the tensor's own bytes (no copy when ``t`` is
    already contiguous on the CPU), for framed bodies; the caller must not mutate ``t`` meanwhile.
    ``private`` (with ``as_view``): ``data`` is a C-contiguous copy of its own, made by numpy on
    the calling thread. Not torch's ``clone``: a copy over torch's grain size wakes its intra-op
    threads, which then spin, and beside a server on the same cores (the embedded default) that
    spinning takes the cores the server's step needs (``python -m bench same_machine``).
    """
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:  # dtype_name's error, only then called: no call per tensor
        dtype_name(t.dtype)
    t = t.detach()
    if not t.is_cpu:  # not ``t.device.type``: building a device object costs more than the whole small copy
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()  # a conj/neg view's storage holds the unflipped values
    if private and as_view and not as_json:
        return {"dtype": name, "shape": list(t.shape), "data": _private_copy(t)}
    t = t.contiguous()
    shape = list(t.shape)
    if as_json and name in _LIST_DTYPES and _list_is_exact(t, name):
        return {"dtype": name, "shape": shape, "data": t.reshape(-1).tolist()}
    if as_view and not as_json:
        return {"dtype": name, "shape": shape, "data": _raw_view(t)}
    raw = t.numpy().tobytes() if t.dtype in _NUMPY_DTYPES else _raw_view(t).tobytes()  # (numpy lacks some dtypes)
    if as_json:
        return {"dtype": name, "shape": shape, "data": base64.b64encode(raw).decode("ascii")}
    return {"dtype": name, "shape": shape, "data": raw}


def _list_is_exact(t: torch.Tensor, name: str) -> bool:
    if t.is_floating_point():
        return t.numel() == 0 or bool(torch.isfinite(t).all())
    if name == "int64":
        return t.numel() == 0 or bool(((t >= -_JSON_EXACT_INT) & (t <= _JSON_EXACT_INT)).all())  # abs(int64 min) overflows
    return True


# dtypes numpy has: their bytes come straight from ``numpy()``, without the uint8 view below
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.int8,
                           torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool})


# an integer dtype of each element size: a strided view of any dtype numpy lacks (bfloat16, float8, complex32)
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _private_copy(t: torch.Tensor) -> memoryview:
    """A C-contiguous copy of ``t``'s values (any strides) by numpy, never by torch's thread pool."""
    if t.numel() == 0:
        return memoryview(b"")
    if t.dtype not in _NUMPY_DTYPES:
        t = t.view(_SAME_SIZE_INT[t.element_size()])  # same element size: allowed on any strides
    return memoryview(t.numpy().copy(order="C")).cast("B")


def _raw_view(t: torch.Tensor) -> memoryview:
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def check_shape(shape: Any, field: str) -> tuple[int, ...]:
    """A shape is a list of non-negative ints; anything else is a 400 naming ``field``."""
    if not isinstance(shape, (list, tuple)):
        raise bad_request(f"{field}.shape: expected a list of non-negative integers, got {type(shape).__name__}")
    for i, d in enumerate(shape):
        if not isinstance(d, int) or isinstance(d, bool):
            raise bad_request(f"{field}.shape.{i}: expected an integer, got {d!r}")
        if d < 0:
            raise bad_request(f"{field}.shape.{i}: negative dimension {d}")
    return tuple(shape)


def decode_tensor(
    obj: Any,
    *,
    field: str = "value",
    max_elements: int | None = None,
    device: torch.device | str | None = None,
    copy: bool = True,
) -> torch.Tensor:
    """A new tensor from an unchecked wire object (an answer the SDK reads); every check happens
    before any allocation. A put step's tensors are validated with their program:
    ``decode_tensor_data`` builds them.

    ``copy=False`` with a writable buffer (a framed body the caller owns) keeps the bytes
    where they are: the tensor is a view of the buffer, and keeps it alive.
    """
    if not isinstance(obj, dict):
        raise bad_request(f"{field}: expected an object {{dtype, shape, data}}, got {type(obj).__name__}")
    extra = set(obj) - {"dtype", "shape", "data"}
    if extra:
        raise bad_request(f"{field}: unknown keys {sorted(extra)}")
    if "data" not in obj:
        raise bad_request(f"{field}.data: missing")
    shape = obj.get("shape")
    if type(shape) is not list:  # check_shape's checks, inline for a plain list of ints (every answer's)
        shape = check_shape(shape, field)
    else:
        for d in shape:
            if type(d) is not int or d < 0:
                check_shape(shape, field)  # raises for what is not an int subclass >= 0
        shape = tuple(shape)
    numel = math.prod(shape)
    if max_elements is not None and numel > max_elements:  # limits answer before anything else
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"{field}: shape {list(shape)} has {numel} elements, over the limit max_tensor_elements={max_elements}",
        )
    name = obj.get("dtype")
    if type(name) is not str or name not in DTYPES:  # dtype_from_name's error, only then called
        dtype_from_name(name, f"{field}.dtype")
    return _build(name, shape, obj["data"], field, device, copy)


def decode_tensor_data(value: TensorData, *, field: str = "value", device: torch.device | str | None = None,
                       copy: bool = True) -> torch.Tensor:
    """A new tensor from a validated ``TensorData`` (a put step's value or grad), as ``decode_tensor``
    builds it. Validation has checked its keys, its dtype's name and its shape's dims, and the
    element limit was checked on the body before that; what is left (the data against the shape
    and dtype) is checked here, before any allocation."""
    return _build(value.dtype, tuple(value.shape), value.data, field, device, copy)


def _build(name: str, shape: tuple[int, ...], data: Any, field: str, device, copy: bool) -> torch.Tensor:
    """The tensor of a known dtype ``name`` and a checked ``shape``: ``data``'s form and size checked first."""
    dtype, numel = DTYPES[name], math.prod(shape)
    if math.prod(d for d in shape if d) * ITEMSIZES[name] >= _MAX_BYTES:
        raise bad_request(f"{field}.shape: {list(shape)} is too large to describe a tensor")
    if isinstance(data, str):
        try:
            data, copy = base64.b64decode(data, validate=True), True
        except (binascii.Error, ValueError):
            raise bad_request(f"{field}.data: not valid base64") from None
    elif isinstance(data, list):
        return _from_list(data, dtype, name, shape, numel, field, device)
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise bad_request(f"{field}.data: expected bytes, a base64 string or a flat list, got {type(data).__name__}")
    # the bytes (as sent, or from base64)
    expected = numel * ITEMSIZES[name]
    if len(data) != expected:
        raise bad_request(
            f"{field}.data: {len(data)} bytes, but shape {list(shape)} of {name} needs {expected}"
        )
    if numel == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    view = torch.frombuffer(data, dtype=dtype).reshape(shape)
    if device is not None and torch.device(device).type != "cpu":
        return view.to(device)
    if not copy and isinstance(data, (bytearray, memoryview)) and not memoryview(data).readonly:
        return view
    return view.clone()


def _from_list(data, dtype, name, shape, numel, field, device) -> torch.Tensor:
    if len(data) != numel:
        raise bad_request(f"{field}.data: {len(data)} values, but shape {list(shape)} needs {numel}")
    if name not in _LIST_DTYPES:
        raise bad_request(f"{field}.data: {name} travels as base64 in JSON, not as a list")
    check = _value_check(dtype)
    for i, v in enumerate(data):
        if not isinstance(v, (int, float)):
            raise bad_request(f"{field}.data.{i}: expected a number, got {type(v).__name__}")
        if not check(v):
            raise bad_request(f"{field}.data.{i}: {v!r} is not a value of dtype {name}")
    try:
        return torch.tensor(data, dtype=dtype, device=device).reshape(shape)
    except (RuntimeError, OverflowError, TypeError, ValueError) as exc:
        raise bad_request(f"{field}.data: {exc}") from None


def _value_check(dtype: torch.dtype):
    """A predicate for list items: a value of ``dtype`` (no rounding to int, no wrap, no finite value made inf)."""
    if dtype == torch.bool:
        return lambda v: isinstance(v, bool) or (type(v) is int and v in (0, 1))
    if dtype.is_floating_point:  # NaN and ±inf are values of every float dtype; 1e300 is no float16
        top = torch.finfo(dtype).max
        return lambda v: isinstance(v, bool) or (type(v) in (int, float) and (abs(v) <= top or v != v or
                                                                               (type(v) is float and math.isinf(v))))
    info = torch.iinfo(dtype)
    return lambda v: (type(v) is int and info.min <= v <= info.max) or isinstance(v, bool)

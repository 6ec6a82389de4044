"""The wire's encodings: bodies as msgpack or JSON, chosen by Content-Type / Accept (negotiation); framed
bodies for big tensors; and a tensor's values as ``{dtype, shape, data}``. One module, as every request
and answer passes through all of them together: a body is negotiated, framed or not, and its tensors
encoded or decoded in one walk (a longer module, read in its four sections, for one file on that walk).

Decoding. A server decodes what any client sent, so it can bound the work: with ``max_values`` a
body's lists and maps hold at most that many values in all, refused (413) before more
are built. Decoding builds a Python object per value (a JSON list of 100M zeros is
100M list slots and seconds of decoding that nothing can interrupt); a body of ``n``
bytes holds at most ``n`` values, so only bodies longer than the limit are counted.

Negotiation: which encoding an answer takes, from the request's ``Accept`` and ``Content-Type``.
Part of the wire's contract (SPEC.md §1's table): both the HTTP layer (error bodies) and the backends
(program answers) must decide it the same way.

Framing: a msgpack header, then raw tensor bytes that are never re-copied. msgpack-python copies every
``bin`` field it packs or unpacks, which halves throughput and doubles memory for big tensors. A framed
body instead is::

    b"RAF1" | u32 LE header length H | H bytes msgpack header | zero padding to 64 | frame 0 | pad | frame 1 | ...

The header is the ordinary message (a program, or a program's result) where each
big tensor's ``data`` is ``{"frame": i}``, plus ``"frames": [n0, n1, ...]`` (byte
lengths). Each frame starts at a 64-byte boundary of the body, so the receiver can
view it in place (``torch.frombuffer``) without copying or misalignment.

Tensors: ``{dtype, shape, data}`` with ``data`` raw little-endian bytes.
msgpack carries ``data`` as ``bin``; JSON carries a flat list of numbers, or a
base64 string where a list cannot be exact (NaN/inf, int64 beyond 2^53,
bfloat16, complex). Decoding validates everything before allocating, then makes
exactly one copy out of the received buffer.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import sys
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import msgpack
import torch

from .dtypes import DTYPE_NAMES, DTYPES, ITEMSIZES, dtype_from_name, dtype_name
from .errors import ErrorCode, ProtocolError, bad_request

if TYPE_CHECKING:
    from .messages import TensorData

if sys.byteorder != "little":  # pragma: no cover - no big-endian hosts in sight
    raise ImportError("proto assumes a little-endian host")

MSGPACK = "application/msgpack"
JSON = "application/json"
FRAMES = "application/vnd.remote-autograd.frames"
MAGIC = b"RAF1"
ALIGN = 64
FRAME_MIN_BYTES = 64 << 10  # a tensor's data at least this big travels as a frame
_PAD = bytes(ALIGN)


def is_msgpack(content_type: str | None) -> bool:
    """Media types are matched without regard to case (RFC 9110): ``Application/MsgPack`` is msgpack."""
    return bool(content_type) and ("msgpack" in content_type.lower())


def decode_body(body: bytes, content_type: str | None, *, max_values: int | None = None) -> Any:
    """Parse a body in any of the three encodings (msgpack, framed, JSON); a malformed one is a 400 that says
    which format failed, one holding more than ``max_values`` values a 413 (``max_list_values``)."""
    # once per request and per answer: is_msgpack and unpack_msgpack's uncounted path, inline
    if content_type and "msgpack" in content_type.lower():
        try:
            if max_values is None or len(body) <= max_values:
                return msgpack.unpackb(body, raw=False, strict_map_key=True)
            return unpack_msgpack(body, max_values)
        except ProtocolError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types
            raise bad_request(f"malformed msgpack body: {exc}") from None
    if is_frames(content_type):
        return unpack_frames(body, max_values=max_values)
    if content_type and "json" not in content_type.lower():
        raise bad_request(f"unsupported Content-Type {content_type!r}; use {MSGPACK} or {JSON}")
    raw = bytes(body) if isinstance(body, memoryview) else body
    # every list item and map member but the first of each is after a ",": an upper bound, counted
    # at memchr speed before a single object is built (a body without big lists has few commas)
    if max_values is not None and len(raw) > max_values and raw.count(b",") >= max_values:
        raise too_many_values(max_values, "JSON body (counted by its separators)")
    try:
        return json.loads(raw) if len(raw) else None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"malformed JSON body: {exc}") from None


def unpack_msgpack(data: Any, max_values: int | None = None) -> Any:
    """``msgpack.unpackb`` as the protocol reads it (string keys only). With ``max_values``, no array
    or map is built longer than that and all of them together hold at most that many values (413)."""
    if max_values is None or len(data) <= max_values:  # each value takes a byte at least: nothing to count
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    count = _ValueCount(max_values)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_array_len=max_values,
                               max_map_len=max_values, list_hook=count, object_hook=count)
    except ValueError as exc:
        if "exceeds max_" in str(exc):  # one array or map longer than the limit, refused before it was built
            raise too_many_values(max_values, "msgpack body") from None
        raise


class _ValueCount:
    """A hook msgpack calls with each array and map it has built: counts their values, 413 past the limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.seen = limit, 0

    def __call__(self, container: Any) -> Any:
        self.seen += len(container)
        if self.seen > self.limit:
            raise too_many_values(self.limit, "msgpack body")
        return container


def too_many_values(limit: int, what: str) -> ProtocolError:
    return ProtocolError(ErrorCode.TOO_LARGE, f"{what} holds more than {limit} values: limit max_list_values={limit}; "
                         "send a big tensor's data as bytes (msgpack bin, a framed body, or base64 in JSON)")


def encode_body(obj: Any, as_msgpack: bool) -> bytes:
    if as_msgpack:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()


# -- negotiation -------------------------------------------------------------------------------------

def wants_msgpack(accept: str | None, content_type: str | None) -> bool:
    """Answer in msgpack when asked to, or when the request came in msgpack and did not say.

    The framed type counts as msgpack both ways (its header is msgpack): a client that
    accepts only frames gets frames or plain msgpack, never JSON (SPEC.md §1's table).
    Matching ignores case; an ``Accept`` of wildcards alone (``*/*``, ``*/*;q=0.8``) says nothing.
    """
    if accept:
        accept = accept.lower()
        if "msgpack" in accept or FRAMES in accept:  # asked for by name (then never wildcards alone)
            return True
        if not accepts_anything(accept):
            return False
    return is_msgpack(content_type) or is_frames(content_type)


def accepts_anything(accept: str) -> bool:
    """Whether every media range of a (lowercased) ``Accept`` is ``*/*``, parameters (q-values) aside."""
    return all(part.split(";", 1)[0].strip() == "*/*" for part in accept.split(","))


def accepts_frames(accept: str | None) -> bool:
    """Whether the client takes the framed encoding (big tensors out of their own memory, SPEC.md §1)."""
    return FRAMES in (accept or "").lower()


# -- framed bodies ----------------------------------------------------------------------------------

def _pad(n: int) -> int:
    return (-n) % ALIGN


def pack_frames(message: Any, frames: list[memoryview]) -> tuple[list[bytes | memoryview], int]:
    """The parts of a framed body and its total length; ``message`` refers to frames as ``{"frame": i}``."""
    header = msgpack.packb({**message, "frames": [f.nbytes for f in frames]}, use_bin_type=True)
    head = MAGIC + struct.pack("<I", len(header)) + header
    parts: list[bytes | memoryview] = [head, _PAD[: _pad(len(head))]]
    total = len(head) + _pad(len(head))
    for f in frames:
        parts.append(f)
        parts.append(_PAD[: _pad(f.nbytes)])
        total += f.nbytes + _pad(f.nbytes)
    return [p for p in parts if len(p)], total


def unpack_frames(body: bytearray | memoryview | bytes, *, max_values: int | None = None) -> Any:
    """The message of a framed body with each ``{"frame": i}`` replaced by a memoryview into ``body``;
    its header holds at most ``max_values`` values (``codec.unpack_msgpack``)."""
    view = memoryview(body)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise bad_request("framed body: missing RAF1 magic")
    (hlen,) = struct.unpack("<I", view[4:8])
    if 8 + hlen > len(view):
        raise bad_request("framed body: header length past the end of the body")
    try:
        message = unpack_msgpack(view[8:8 + hlen], max_values)
    except ProtocolError:
        raise
    except Exception as exc:
        raise bad_request(f"framed body: malformed msgpack header: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("frames"), list):
        raise bad_request("framed body: header must be an object with a 'frames' list")
    sizes = message.pop("frames")
    offset = 8 + hlen + _pad(8 + hlen)
    slices = []
    for i, n in enumerate(sizes):
        if type(n) is not int or n < 0 or offset + n > len(view):
            raise bad_request(f"framed body: frame {i} of {n!r} bytes does not fit in the body")
        slices.append(view[offset:offset + n])
        offset += n + _pad(n)
    return _resolve(message, slices)


def header_length(body: bytearray | memoryview | bytes) -> int:
    """The bytes of a framed body a decoder reads (magic, length, msgpack header): its frames are
    only viewed. A body too short to say counts whole."""
    if len(body) < 8:
        return len(body)
    (hlen,) = struct.unpack_from("<I", body, 4)
    return min(8 + hlen, len(body))


def header_of(body: bytearray | memoryview | bytes) -> bytes:
    """The magic, length and msgpack header of a framed body (what idempotency keys hash)."""
    view = memoryview(body)
    if len(view) < 8:
        return bytes(view)
    (hlen,) = struct.unpack("<I", view[4:8])
    return bytes(view[:8 + hlen]) + struct.pack("<Q", len(view))


def is_frames(content_type: str | None) -> bool:
    return bool(content_type) and content_type.split(";")[0].strip().lower() == FRAMES


def _resolve(value: Any, slices: list[memoryview]) -> Any:
    # In place: the message is the one just unpacked from this body, nobody else's. Only containers are
    # walked into (most values of a program are names and numbers: a call for each would cost the most).
    if type(value) is dict:
        if len(value) == 1 and "frame" in value:
            i = value["frame"]
            if type(i) is not int or not 0 <= i < len(slices):
                raise bad_request(f"framed body: no frame {i!r}")
            return slices[i]
        for k, v in value.items():
            if type(v) is dict or type(v) is list:
                value[k] = _resolve(v, slices)  # (a key's value replaced: the dict keeps its size)
    elif type(value) is list:
        for i, v in enumerate(value):
            if type(v) is dict or type(v) is list:
                value[i] = _resolve(v, slices)
    return value


def extract_frames(message: Any, min_bytes: int) -> tuple[Any, list[memoryview]]:
    """``message`` with every bytes-like ``data`` of at least ``min_bytes`` moved out into frames."""
    frames: list[memoryview] = []
    return _extract(message, min_bytes, frames), frames


def _extract(value: Any, min_bytes: int, frames: list[memoryview]) -> Any:
    # A module-level function, not a recursive closure: a closure referring to itself is a
    # reference cycle, and it would keep the frames (whole tensors) alive until a GC pass.
    if isinstance(value, dict):
        data = value.get("data")
        if "dtype" in value and isinstance(data, (bytes, bytearray, memoryview)) and len(data) >= min_bytes:
            frames.append(memoryview(data).cast("B"))
            return {**value, "data": {"frame": len(frames) - 1}}
        return {k: _extract(v, min_bytes, frames) if isinstance(v, (dict, list)) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_extract(v, min_bytes, frames) if isinstance(v, (dict, list)) else v for v in value]
    return value


def iter_parts(parts: list[bytes | memoryview], chunk: int = 1 << 20) -> list | Iterator[memoryview]:
    """The parts as memoryviews cut into pieces of at most ``chunk`` bytes (httpcore re-slices big buffers
    quadratically), empty ones left out: a list when no part needs cutting (most answers: no generator to
    resume per piece), else a generator."""
    for p in parts:  # a loop, not any(genexpr): no generator frame per answer
        if len(p) > chunk:
            return _pieces(parts, chunk)
    return [memoryview(p) for p in parts if len(p)]


def _pieces(parts: list[bytes | memoryview], chunk: int) -> Iterator[memoryview]:
    for p in parts:
        view = memoryview(p)
        for start in range(0, len(view), chunk):
            yield view[start:start + chunk]


# -- tensors -----------------------------------------------------------------------------------------

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
    before any allocation (the data against the shape and dtype last). A put step's tensors are
    validated with their program: ``decode_tensor_data`` hands them here.

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
    data, dtype = obj["data"], DTYPES[name]
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
    expected = numel * ITEMSIZES[name]  # the bytes (as sent, or from base64)
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


def decode_tensor_data(value: TensorData, *, field: str = "value", device: torch.device | str | None = None,
                       copy: bool = True) -> torch.Tensor:
    """A new tensor from a validated ``TensorData`` (a put step's value or grad), as ``decode_tensor``
    builds it. Validation has checked its keys, its dtype's name and its shape's dims, and the
    element limit was checked on the body before that: ``decode_tensor``'s checks of those pass, and
    what is left (the data against the shape and dtype) is checked there, before any allocation."""
    return decode_tensor({"dtype": value.dtype, "shape": value.shape, "data": value.data}, field=field,
                         device=device, copy=copy)


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

"""Bodies on the wire: msgpack or JSON, chosen by Content-Type / Accept (negotiation), and framed bodies
for big tensors. One module, as every request and answer body is read through all three.

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
"""
from __future__ import annotations

import json
import struct
from typing import Any, Iterator

import msgpack

from .errors import ErrorCode, ProtocolError, bad_request

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
    if isinstance(value, dict):
        if len(value) == 1 and "frame" in value:
            i = value["frame"]
            if type(i) is not int or not 0 <= i < len(slices):
                raise bad_request(f"framed body: no frame {i!r}")
            return slices[i]
        return {k: _resolve(v, slices) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, slices) for v in value]
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
        return {k: _extract(v, min_bytes, frames) for k, v in value.items()}
    if isinstance(value, list):
        return [_extract(v, min_bytes, frames) for v in value]
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

"""Framing for big bodies: a msgpack header, then raw tensor bytes that are never re-copied.

msgpack-python copies every ``bin`` field it packs or unpacks, which halves
throughput and doubles memory for big tensors. A framed body instead is::

    b"RAF1" | u32 LE header length H | H bytes msgpack header | zero padding to 64 | frame 0 | pad | frame 1 | ...

The header is the ordinary message (a program, or a program's result) where each
big tensor's ``data`` is ``{"frame": i}``, plus ``"frames": [n0, n1, ...]`` (byte
lengths). Each frame starts at a 64-byte boundary of the body, so the receiver can
view it in place (``torch.frombuffer``) without copying or misalignment.
"""

from __future__ import annotations

import struct
from typing import Any, Iterator

import msgpack

from .codec import unpack_msgpack
from .errors import ProtocolError, bad_request

FRAMES = "application/vnd.remote-autograd.frames"
MAGIC = b"RAF1"
ALIGN = 64
FRAME_MIN_BYTES = 64 << 10  # a tensor's data at least this big travels as a frame
_PAD = bytes(ALIGN)


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


def iter_parts(parts: list[bytes | memoryview], chunk: int = 1 << 20) -> Iterator[bytes | memoryview]:
    """The parts cut into pieces of at most ``chunk`` bytes (httpcore re-slices big buffers quadratically)."""
    for p in parts:
        view = memoryview(p)
        for start in range(0, len(view), chunk):
            yield view[start:start + chunk]

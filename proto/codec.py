"""Bodies on the wire: msgpack or JSON, chosen by Content-Type / Accept.

A server decodes what any client sent, so it can bound the work: with ``max_values`` a
body's lists and maps hold at most that many values in all, refused (413) before more
are built. Decoding builds a Python object per value (a JSON list of 100M zeros is
100M list slots and seconds of decoding that nothing can interrupt); a body of ``n``
bytes holds at most ``n`` values, so only bodies longer than the limit are counted.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

from .errors import ErrorCode, ProtocolError, bad_request

MSGPACK = "application/msgpack"
JSON = "application/json"


def is_msgpack(content_type: str | None) -> bool:
    """Media types are matched without regard to case (RFC 9110): ``Application/MsgPack`` is msgpack."""
    return bool(content_type) and ("msgpack" in content_type.lower())


def decode_body(body: bytes, content_type: str | None, *, max_values: int | None = None) -> Any:
    """Parse a request body; a malformed one is a 400 that says which format failed, one holding more
    than ``max_values`` values a 413 (``max_list_values``)."""
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

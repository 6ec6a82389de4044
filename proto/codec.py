"""Bodies on the wire: msgpack or JSON, chosen by Content-Type / Accept."""

from __future__ import annotations

import json
from typing import Any

import msgpack

from .errors import bad_request

MSGPACK = "application/msgpack"
JSON = "application/json"


def is_msgpack(content_type: str | None) -> bool:
    return bool(content_type) and ("msgpack" in content_type)


def decode_body(body: bytes, content_type: str | None) -> Any:
    """Parse a request body; a malformed one is a 400 that says which format failed."""
    if is_msgpack(content_type):
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types
            raise bad_request(f"malformed msgpack body: {exc}") from None
    if content_type and "json" not in content_type:
        raise bad_request(f"unsupported Content-Type {content_type!r}; use {MSGPACK} or {JSON}")
    try:
        return json.loads(bytes(body) if isinstance(body, memoryview) else body) if len(body) else None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_request(f"malformed JSON body: {exc}") from None


def encode_body(obj: Any, as_msgpack: bool) -> bytes:
    if as_msgpack:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

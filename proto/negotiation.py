"""Content negotiation: which encoding an answer takes, from the request's ``Accept`` and ``Content-Type``.

Beside the codec because it is part of the wire's contract (SPEC.md §1's table), and both the
HTTP layer (error bodies) and the backends (program answers) must decide it the same way.
"""

from __future__ import annotations

from .codec import is_msgpack
from .frames import FRAMES, is_frames


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

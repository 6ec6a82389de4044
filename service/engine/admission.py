"""A program's body made a ``Program``: decoded, its claims checked, validated; bounded, and off the loop when big.

Whatever a client sends, the work here is linear in the body: the decoders build at most
``max_list_values`` values (``proto.codec``), ``guards.check_limits`` caps the claimed shapes
before any arithmetic, nesting is bounded by the decoders' own depth limits, and validation
walks what was built. A body whose decoded part is over ``INLINE_BYTES`` is decoded on a
thread, so the event loop goes on answering other clients (as far as the GIL lets it: each
phase here is one C call over a bounded body). A framed body's decoded part is its header:
its frames (a training step's batch) become tensors without being read, so a small header
with big frames stays on the loop and spares the hop to a thread and back. An allocation
failure while decoding is a 507 with a body, like the device's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from remote_autograd.proto import ErrorCode, ProtocolError, decode_body
from remote_autograd.proto.codec import header_length, header_of, is_frames, unpack_frames
from remote_autograd.proto.messages import Program, validate_program

from ..settings import Settings
from .guards import check_limits

INLINE_BYTES = 64 << 10  # a body up to this is decoded on the event loop: a few hundred microseconds at most


def decode_program(body: Any, ctype: str | None, settings: Settings) -> tuple[Program, Any]:
    """The program of ``body`` and what identifies it for retries (a framed body: its header)."""
    framed = is_frames(ctype)
    try:
        if framed:
            decoded = unpack_frames(body, max_values=settings.max_list_values)
        else:
            decoded = decode_body(body, ctype, max_values=settings.max_list_values)
        check_limits(decoded, settings)
        program = validate_program(decoded)
    except MemoryError:
        raise ProtocolError(ErrorCode.OUT_OF_MEMORY, f"the server ran out of memory decoding a body of "
                            f"{len(body)} bytes: send less in one program") from None
    return program, header_of(body) if framed else body


async def admit_program(body: Any, ctype: str | None, settings: Settings) -> tuple[Program, Any]:
    """``decode_program``, on a thread when the body is big."""
    decoded = header_length(body) if is_frames(ctype) else len(body)
    if decoded <= INLINE_BYTES:
        return decode_program(body, ctype, settings)
    return await asyncio.to_thread(decode_program, body, ctype, settings)

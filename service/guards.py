"""Admission of a program: its body (size and time bounded) and a slot among the running programs.

These run on the event loop before a program reaches a worker, so a client that
sends too much, too slowly or too often is refused without costing torch anything.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable

from remote_autograd._fill_buffer import FillBuffer
from remote_autograd.proto import ErrorCode, ProtocolError

from .settings import Settings


async def read_body(receive: Callable, declared: str | None, limit: int, timeout: float) -> bytes | bytearray | memoryview:
    """The request body from ASGI ``receive``; 413 as soon as it passes ``limit`` bytes (or its
    Content-Length ``declared`` does), 400 if it stalls for ``timeout`` s.

    The timeout is on silence, not on the whole body: a big upload over a slow link
    may take as long as it needs while bytes keep coming, and a client that stops
    mid-body holds only its own connection, and only for ``timeout`` seconds.
    """
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"body of {declared} bytes: limit max_body_bytes={limit}")
    expected = int(declared) if declared is not None and declared.isdigit() else None
    size, buf = 0, None
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ProtocolError(ErrorCode.BAD_REQUEST, f"client disconnected after {size} bytes of the body")
                chunk, more = message.get("body", b""), message.get("more_body", False)
                end = size + len(chunk)
                if end > limit:
                    raise ProtocolError(ErrorCode.TOO_LARGE, f"body over the limit max_body_bytes={limit}")
                if buf is None:
                    if not more and (expected is None or end == expected):
                        return chunk  # the whole body in one message (every small one): no copy
                    # With a declared length the body lands in one buffer as it arrives: no joining
                    # copy, and a framed body's tensors can then be views of it.
                    buf = bytearray() if expected is None else FillBuffer(expected)
                if expected is None:
                    buf += chunk
                elif end > expected:
                    raise ProtocolError(ErrorCode.BAD_REQUEST, f"body longer than its Content-Length {expected}")
                else:
                    buf.append(chunk)
                size = end
                if not more:
                    break
                deadline.reschedule(loop.time() + timeout)
    except TimeoutError:
        raise ProtocolError(
            ErrorCode.BAD_REQUEST,
            f"body stalled: nothing for {timeout} s after {size} bytes: limit body_timeout_seconds={timeout}",
        ) from None
    if expected is not None and size != expected:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"body of {size} bytes, but Content-Length said {expected}")
    return buf if expected is None else buf.view


class ProgramSlots:
    """At most ``limit`` programs admitted at once (running or queued behind their session); else 429.

    Used only from the event loop, so a plain counter is enough.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.busy = 0

    def __enter__(self) -> "ProgramSlots":
        if self.busy >= self.limit:
            raise ProtocolError(
                ErrorCode.TOO_MANY,
                f"too many concurrent programs ({self.busy} running): limit max_concurrent_programs={self.limit}",
            )
        self.busy += 1
        return self

    def __exit__(self, *exc) -> None:
        self.busy -= 1


def check_limits(body: Any, settings: Settings) -> None:
    """Limits answer before anything else about a body: step count and claimed tensor sizes (413).

    Runs on the raw decoded body, before validation, so a huge claimed shape is a 413
    even when something else about the message is also wrong. The one check of these limits:
    every program passes here (``LocalSessions.answer_program``, which the Ray workers run
    too), and the runner and ``decode_tensor_data`` trust it; validation takes a shape's dims
    only as integers, so the shape counted here is the shape used.
    """
    steps = body.get("steps") if isinstance(body, dict) else None
    if not isinstance(steps, list):
        return
    if len(steps) > settings.max_steps_per_program:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"program has {len(steps)} steps, over the limit max_steps_per_program={settings.max_steps_per_program}",
        )
    for index, step in enumerate(steps):
        if not (isinstance(step, dict) and step.get("kind") == "put"):
            continue
        for key in ("value", "grad"):
            shape = step.get(key, {}).get("shape") if isinstance(step.get(key), dict) else None
            if isinstance(shape, list) and all(type(d) is int for d in shape):
                numel = math.prod(shape)
                if numel > settings.max_tensor_elements:
                    raise ProtocolError(
                        ErrorCode.TOO_LARGE,
                        f"steps.{index}.put.{key}: shape {shape} has {numel} elements, over the limit "
                        f"max_tensor_elements={settings.max_tensor_elements}",
                        step=index, op="put",
                    )

"""Admission of a program: its body (size and time bounded), the limits it claims, and a slot.

These run before a program reaches a worker, so a client that sends too much, too slowly or
too often is refused without costing torch anything; each is linear in what was sent
(``check_limits`` caps a claimed shape before any arithmetic on it). Decoding the body is
``service/engine/admission.py``.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from remote_autograd._fill_buffer import FillBuffer
from remote_autograd.proto import ErrorCode, ProtocolError

from ..settings import Settings


class BodyBytes:
    """The bytes of request bodies the server holds, all connections together (``max_body_bytes_in_flight``).

    Counted as they arrive (the buffer a declared length reserves is mapped only as it fills:
    a claim costs nothing), and held until the request is answered: a body waiting in the
    program queue is memory too. Each request's part is a ``BodyHold``. Used on the event
    loop only: no lock.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0


class BodyHold:
    """One request's bytes in ``BodyBytes``; ``release`` gives them back (the route calls it when
    the request is done, whatever happened)."""

    def __init__(self, bodies: BodyBytes) -> None:
        self.bodies, self.held = bodies, 0

    def take(self, nbytes: int) -> None:
        bodies = self.bodies
        if bodies.held + nbytes > bodies.limit:
            raise ProtocolError(ErrorCode.TOO_MANY, f"the server is receiving {bodies.held} bytes of request bodies: "
                                f"limit max_body_bytes_in_flight={bodies.limit}; send again later")
        bodies.held += nbytes
        self.held += nbytes

    def release(self) -> None:
        self.bodies.held -= self.held
        self.held = 0


async def read_body(receive: Callable, declared: str | None, limit: int, timeout: float,
                    hold: BodyHold | None = None) -> bytes | bytearray | memoryview:
    """The request body from ASGI ``receive``; 413 as soon as it passes ``limit`` bytes (or its
    Content-Length ``declared`` does), 400 if it stalls for ``timeout`` s, 429 when its bytes
    would pass what the server holds of all bodies (``hold``'s ``BodyBytes``).

    The timeout is on silence, not on the whole body: a big upload over a slow link
    may take as long as it needs while bytes keep coming, and a client that stops
    mid-body holds only its own connection, and only for ``timeout`` seconds.
    """
    expected = declared_length(declared)
    if expected is not None and expected > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"body of {declared[:24]} bytes: limit max_body_bytes={limit}")
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
                if hold is not None and chunk:
                    hold.take(len(chunk))
                if buf is None:
                    if not more and (expected is None or end == expected):
                        return chunk  # the whole body in one message (every small one): no copy
                    # With a declared length the body lands in one buffer as it arrives: no joining
                    # copy, and a framed body's tensors can then be views of it.
                    buf = bytearray() if expected is None else _fill_buffer(expected)
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
    except MemoryError:
        raise ProtocolError(ErrorCode.OUT_OF_MEMORY, f"the server ran out of memory receiving a body "
                            f"({size} bytes in): send less in one program") from None
    if expected is not None and size != expected:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"body of {size} bytes, but Content-Length said {expected}")
    return buf if expected is None else buf.view


def _fill_buffer(nbytes: int) -> FillBuffer:
    try:
        return FillBuffer(nbytes)
    except RuntimeError as exc:  # torch's allocator refuses with a RuntimeError, not a MemoryError
        raise MemoryError(str(exc)) from None


def declared_length(declared: str | None) -> int | None:
    """A ``Content-Length`` as a number (None when absent or not digits); one too long to be a body's
    length is a number past every limit, never a thousand-digit integer."""
    if declared is None or not declared.isdigit():
        return None
    return int(declared) if len(declared) <= 18 else 10**18


class ProgramSlots:
    """Programs admitted at once (running or queued behind their session): at most ``limit`` in all,
    ``per_session`` of one session and ``per_token`` of one token's sessions; past any of them, 429.

    The shares keep one tenant from holding every slot: a session with a long program and
    many queued behind it waits on its own slots while other tokens' programs are admitted.
    Used only from the event loop, so plain counters are enough.
    """

    def __init__(self, limit: int, per_session: int | None = None, per_token: int | None = None) -> None:
        self.limit = limit
        self.per_session, self.per_token = per_session or limit, per_token or limit
        self.busy = 0
        self._sessions: dict[str, int] = {}
        self._tokens: dict[str | None, int] = {}

    @classmethod
    def of(cls, settings: Settings) -> "ProgramSlots":
        return cls(settings.max_concurrent_programs, settings.max_programs_per_session,
                   settings.max_programs_per_token)

    def held_by(self, owner: str | None) -> int:
        """Programs of ``owner``'s sessions admitted now."""
        return self._tokens.get(owner, 0)

    @contextmanager
    def take(self, sid: str, owner: str | None) -> Iterator[None]:
        """One slot for a program of session ``sid`` of token ``owner``, for the ``with`` block."""
        in_session, of_token = self._sessions.get(sid, 0), self._tokens.get(owner, 0)
        if self.busy >= self.limit:
            raise ProtocolError(
                ErrorCode.TOO_MANY,
                f"too many concurrent programs ({self.busy} running): limit max_concurrent_programs={self.limit}",
            )
        if of_token >= self.per_token:
            raise ProtocolError(ErrorCode.TOO_MANY, f"this token's sessions have {of_token} programs admitted: "
                                f"limit max_programs_per_token={self.per_token}")
        if in_session >= self.per_session:
            raise ProtocolError(ErrorCode.TOO_MANY, f"this session has {in_session} programs admitted (running or "
                                f"queued behind each other): limit max_programs_per_session={self.per_session}")
        self.busy += 1
        self._sessions[sid], self._tokens[owner] = in_session + 1, of_token + 1
        try:
            yield
        finally:
            self.busy -= 1
            _count_down(self._sessions, sid)
            _count_down(self._tokens, owner)


def _count_down(counts: dict, key) -> None:
    """One less for ``key``; a key at zero leaves (the dicts hold only what is admitted now)."""
    if counts[key] <= 1:
        del counts[key]
    else:
        counts[key] -= 1


def check_limits(body: Any, settings: Settings) -> None:
    """Limits answer before anything else about a body: step count and claimed tensor sizes (413).

    Runs on the raw decoded body, before validation, so a huge claimed shape is a 413
    even when something else about the message is also wrong. The one check of these limits:
    every program passes here (``admission.decode_program``, run by ``LocalSessions.answer_program``,
    which the Ray workers run too), and the runner and ``decode_tensor_data`` trust it; validation
    takes a shape's dims only as integers, so the shape counted here is the shape used. Its work
    is linear in the body whatever the body claims (see ``check_shape_claim``).
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
        kind = step.get("kind") if isinstance(step, dict) else None
        if kind == "template":
            _check_template_claims(step, index, settings)
        if kind != "put":
            continue
        for key in ("value", "grad"):
            tensor = step.get(key)
            shape = tensor.get("shape") if isinstance(tensor, dict) else None
            if isinstance(shape, list):
                check_shape_claim(shape, f"steps.{index}.put.{key}", settings, step=index)


def _check_template_claims(step: dict, index: int, settings: Settings) -> None:
    """A template's own steps count against ``max_steps_per_program`` (each run runs them all), and
    the layouts its inputs claim are capped like a put's shapes (its calls are checked on them)."""
    inner = step.get("steps")
    if isinstance(inner, list) and len(inner) > settings.max_steps_per_program:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"template has {len(inner)} steps, over the limit "
                            f"max_steps_per_program={settings.max_steps_per_program}", step=index, op="template")
    inputs = step.get("inputs")
    for k, spec in enumerate(inputs if isinstance(inputs, list) else ()):
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if isinstance(shape, list):
            check_shape_claim(shape, f"steps.{index}.template.inputs.{k}", settings, step=index, op="template")


def check_shape_claim(shape: list, field: str, settings: Settings, *, step: int | None = None,
                      op: str = "put") -> None:
    """413 for a shape with more dims than ``max_tensor_dims`` or more elements than ``max_tensor_elements``.

    Capped before arithmetic: the dim count first, then the product stops at the first partial
    product past the limit, so no number here passes the limit times one dim (a shape of 250
    dims of 2**63-1 costs a comparison, not a 16,000-bit product), and no message formats a
    huge integer. Dims that are not non-negative integers are left to validation (400).
    """
    if len(shape) > settings.max_tensor_dims:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{field}: shape {_shape_text(shape)} has {len(shape)} dims, over "
                            f"the limit max_tensor_dims={settings.max_tensor_dims}", step=step, op=op)
    if not all(type(d) is int and d >= 0 for d in shape) or 0 in shape:
        return  # validation's 400; or no elements at all, whatever the other dims (checked when built)
    limit, numel = settings.max_tensor_elements, 1
    for d in shape:
        numel *= d  # numel was at most the limit: this is at most the limit times one dim
        if numel > limit:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"{field}: shape {_shape_text(shape)} has more elements than "
                                f"the limit max_tensor_elements={limit}", step=step, op=op)


_SHOWN_DIMS = 8


def _shape_text(shape: list) -> str:
    """The shape for a message: at most its first dims, none of them a huge number written out."""
    dims = ", ".join(_dim_text(d) for d in shape[:_SHOWN_DIMS])
    return f"[{dims}]" if len(shape) <= _SHOWN_DIMS else f"[{dims}, ...]"


def _dim_text(d: Any) -> str:
    if type(d) is int and d.bit_length() <= 64:
        return str(d)
    return f"<an integer of {d.bit_length()} bits>" if type(d) is int else f"<{type(d).__name__}>"

"""Admission of a program: its body (size and time bounded), the limits it claims, a slot, its decoding.

These run before a program reaches a worker, so a client that sends too much, too slowly or
too often is refused without costing torch anything; each is linear in what was sent
(``check_limits`` caps a claimed shape before any arithmetic on it). Decoding the body
(``admit_program``) is here too: it is where ``check_limits`` runs, and every program passes
it on the way to its worker (one module of admission, entered once by the walk of an op).

Whatever a client sends, decoding is linear in the body: the decoders build at most
``max_list_values`` values (``proto.codec``), ``check_limits`` caps the claimed shapes
before any arithmetic, nesting is bounded by the decoders' own depth limits, and validation
walks what was built. A body whose decoded part is over ``INLINE_BYTES`` is decoded on a
thread, so the event loop goes on answering other clients (as far as the GIL lets it: each
phase is one C call over a bounded body). A framed body's decoded part is its header:
its frames (a training step's batch) become tensors without being read, so a small header
with big frames stays on the loop and spares the hop to a thread and back. An allocation
failure while decoding is a 507 with a body, like the device's.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from remote_autograd._fill_buffer import FILL_MIN_BYTES, FillBuffer
from remote_autograd.proto import ErrorCode, ProtocolError, decode_body
from remote_autograd.proto.codec import header_length, header_of, is_frames, unpack_frames
from remote_autograd.proto.messages import Program, validate_program

from ..settings import Settings

INLINE_BYTES = 64 << 10  # a body up to this is decoded on the event loop: a few hundred microseconds at most


class BodyBytes:
    """The bytes of request bodies the server holds, all connections together (``max_body_bytes_in_flight``).

    Counted as they arrive (``read_body``; the buffer a declared length reserves is mapped only as
    it fills: a claim costs nothing), and held until the request is answered: a body waiting in
    the program queue is memory too. ``read_body`` gives back what it counted if it fails; once it
    returns, the route gives back the body's length when the request is done, whatever happened.
    Used on the event loop only: no lock.
    """

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0


async def read_body(receive: Callable, declared: str | None, expected: int | None, limit: int, timeout: float,
                    bodies: BodyBytes | None = None) -> bytes | bytearray | memoryview:
    """The request body from ASGI ``receive``; 413 as soon as it passes ``limit`` bytes (or its
    Content-Length ``declared``, read as ``expected = declared_length(declared)`` by the caller, who
    needed it before the body, does), 400 if it stalls for ``timeout`` s, 429 when its bytes would
    pass what the server holds of all bodies (``bodies``; they stay counted there once it returns).

    The timeout is on silence, not on the whole body: a big upload over a slow link
    may take as long as it needs while bytes keep coming, and a client that stops
    mid-body holds only its own connection, and only for ``timeout`` seconds.
    """
    if expected is not None and expected > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"body of {declared[:24]} bytes: limit max_body_bytes={limit}")
    size = taken = 0
    buf: bytearray | FillBuffer | None = None
    loop = asyncio.get_running_loop()
    try:
        try:
            async with asyncio.timeout(timeout) as deadline:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ProtocolError(ErrorCode.BAD_REQUEST,
                                            f"client disconnected after {size} bytes of the body")
                    chunk, more = message.get("body", b""), message.get("more_body", False)
                    end = size + len(chunk)
                    if end > limit:
                        raise ProtocolError(ErrorCode.TOO_LARGE, f"body over the limit max_body_bytes={limit}")
                    if bodies is not None and chunk:
                        if bodies.held + len(chunk) > bodies.limit:
                            raise ProtocolError(ErrorCode.TOO_MANY, f"the server is receiving {bodies.held} bytes of "
                                                f"request bodies: limit max_body_bytes_in_flight={bodies.limit}; "
                                                "send again later")
                        bodies.held += len(chunk)
                        taken += len(chunk)
                    if buf is None:
                        if not more and (expected is None or end == expected):
                            return chunk  # the whole body in one message (every small one): no copy
                        # With a big declared length the body lands in one buffer as it arrives: no
                        # joining copy, and a framed body's tensors can then be views of it.
                        buf = bytearray() if expected is None or expected < FILL_MIN_BYTES else _fill_buffer(expected)
                    if expected is not None and end > expected:
                        raise ProtocolError(ErrorCode.BAD_REQUEST, f"body longer than its Content-Length {expected}")
                    if type(buf) is bytearray:
                        buf += chunk
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
    except BaseException:
        if bodies is not None:
            bodies.held -= taken  # refused or gone: its bytes are not held any more
        raise
    return buf if type(buf) is bytearray else buf.view


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

    def take(self, sid: str, owner: str | None) -> None:
        """One slot for a program of session ``sid`` of token ``owner``; the caller gives it back with
        ``give`` (in a ``finally``)."""
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

    def give(self, sid: str, owner: str | None) -> None:
        """The slot ``take`` gave back; a key at zero leaves (the dicts hold only what is admitted now)."""
        self.busy -= 1
        for counts, key in ((self._sessions, sid), (self._tokens, owner)):
            if counts[key] <= 1:
                del counts[key]
            else:
                counts[key] -= 1


def check_limits(body: Any, settings: Settings) -> None:
    """Limits answer before anything else about a body: step count and claimed tensor sizes (413).

    Runs on the raw decoded body, before validation, so a huge claimed shape is a 413
    even when something else about the message is also wrong. The one check of these limits:
    every program passes here (``decode_program``, run by ``LocalSessions.answer_program``,
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


def decode_program(body: Any, ctype: str | None, settings: Settings, framed: bool | None = None) -> tuple[Program, Any]:
    """The program of ``body`` and what identifies it for retries (a framed body: its header).
    ``framed``: whether ``ctype`` is the framed encoding, when the caller has asked already."""
    if framed is None:
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
    framed = is_frames(ctype)
    if (header_length(body) if framed else len(body)) <= INLINE_BYTES:
        return decode_program(body, ctype, settings, framed)
    return await asyncio.to_thread(decode_program, body, ctype, settings, framed)

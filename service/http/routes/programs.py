"""``POST /v1/sessions/{sid}/programs``: run a program, the request every op rides in.

A speed path: ``answer_program_request`` is plain ASGI, mounted as a ``RawRoute``
(``service/http/raw_route.py``, which says what that saves and what it stands in for) and
called by the ``Gatekeeper`` directly. It therefore takes nothing from FastAPI's
dependencies: the backend and settings come from ``scope["app"].state``, where
``create_app`` put them, and the caller from ``deps.caller_of``.
"""

from __future__ import annotations

import asyncio
from functools import partial

from fastapi import APIRouter

from remote_autograd.proto.codec import iter_parts

from ...engine.guards import BodyHold, declared_length, read_body
from ...engine.program_watch import ProgramWatch
from ..openapi import route_doc
from ..raw_route import RawRoute
from .deps import PROTOCOL_KEY, caller_of

router = APIRouter()


async def answer_program_request(scope: dict, receive, send) -> None:
    """Find the session, read the program (size and time bounded), have the backend answer it while
    listening for the client going away, send the answer."""
    state = scope["app"].state
    settings, backend = state.settings, state.backend
    version, declared, ctype, accept = _program_headers(scope["headers"])
    owner = caller_of(scope, version)
    state.waiting_answers.check(owner)  # 429 while its slow readers' answers hold its share
    sid = scope["path_params"]["sid"]
    # an unknown or foreign id is answered before its body is read: a made-up id costs nothing
    await backend.check_session(sid, owner, declared_length(declared))
    hold = BodyHold(state.bodies)  # the body's bytes count among all bodies the server holds until answered
    try:
        body = await read_body(receive, declared, settings.max_body_bytes, settings.body_timeout_seconds, hold)
        watch = ProgramWatch(settings.max_program_seconds)
        disconnects = _DisconnectListener(receive, watch)
        try:
            async with backend.answer_program(sid, owner, body, ctype, accept, watch) as answer:
                disconnects.stop()
                await _send(answer, send)  # inside: the session runs nothing else until its answer is sent
        finally:
            disconnects.stop()
    finally:
        hold.release()


_READ = (PROTOCOL_KEY, b"content-length", b"content-type", b"accept")


def _program_headers(raw: list) -> tuple[str | None, ...]:
    """The headers the route reads (protocol version, content length, content type, accept) as
    text, None where absent, in one pass over ASGI's raw pairs (the last of a repeated one wins)."""
    found = dict.fromkeys(_READ)
    for name, value in raw:
        if name in found:
            found[name] = value.decode("latin-1")
    return tuple(found.values())


class _DisconnectListener:
    """Cancels ``watch`` when ASGI ``receive`` says the client disconnected while its program runs.

    The body was read, so the next message is the disconnect: under uvicorn it comes when the
    connection is lost (or once the answer is sent, after ``stop``). Listening starts only after
    ``LISTEN_AFTER_SECONDS``, on a timer: a program answered sooner (most: every eager op) never
    pays for a task, and one whose client leaves sooner stops that much later.
    """

    LISTEN_AFTER_SECONDS = 0.05

    def __init__(self, receive, watch: ProgramWatch) -> None:
        self._receive, self._watch = receive, watch
        self._task: asyncio.Task | None = None
        self._timer = asyncio.get_running_loop().call_later(self.LISTEN_AFTER_SECONDS, self._start)

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._watch.cancel()

    def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()


async def _send(answer, send) -> None:
    # where the time went, for clients and benchmarks: steps inside the worker, and the worker hop
    timing = f"steps;dur={answer.steps_seconds * 1e3:.3f}, worker;dur={answer.worker_seconds * 1e3:.3f}"
    await send({"type": "http.response.start", "status": answer.status, "headers": [
        (b"content-type", answer.media_type.encode()), (b"content-length", str(answer.total).encode()),
        (b"server-timing", timing.encode())]})
    pieces = list(iter_parts(answer.parts)) or [memoryview(b"")]  # a small answer is one piece: one send
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        # A piece of a big fetched tensor's frame is a view of the session's memory, and the event
        # loop's transport (uvloop) keeps what the socket did not take yet by reference, past
        # send()'s return and so past the session's gate: the next program's writes would go out
        # in this answer. So such a piece is copied as it goes out (a memcpy, never more than a
        # piece of memory); pieces of bytes (encoded answers) cannot change and go as they are.
        body = piece if isinstance(piece.obj, bytes) else bytes(piece)
        await send({"type": "http.response.body", "body": body, "more_body": i < last})


async def _program_doc(sid: str) -> None:
    """Run a program: its steps in order against the session (SPEC.md §3, Programs; its steps: §4)."""


router.add_api_route(
    "/v1/sessions/{sid}/programs", _program_doc, methods=["POST"], name="run_program",
    route_class_override=partial(RawRoute, asgi=answer_program_request),
    **route_doc(200, "ProgramResult", body="Program", extra={507: "ErrorResponse"}))

"""``POST /v1/sessions/{sid}/programs``: run a program, the request every op rides in.

A speed path: ``answer_program_request`` is plain ASGI, mounted as a ``RawRoute``
(``service/http/raw_route.py``, which says what that saves and what it stands in for) and
called by the ``Gatekeeper`` directly. It therefore takes nothing from FastAPI's
dependencies: the backend and settings come from ``scope["app"].state``, where
``create_app`` put them, and the caller from ``scope["state"]``, where the ``Gatekeeper`` put it.
"""

from __future__ import annotations

import asyncio
from functools import partial

from fastapi import APIRouter

from remote_autograd.proto import PROTOCOL_VERSION
from remote_autograd.proto.codec import iter_parts

from ...engine.guards import declared_length, read_body
from ...engine.program_watch import ProgramWatch
from ..openapi import route_doc
from ..raw_route import RawRoute
from .deps import PROTOCOL_KEY, protocol_mismatch

router = APIRouter()

_READ = (PROTOCOL_KEY, b"content-length", b"content-type", b"accept")
_PIECE_BYTES = 1 << 20  # an answer goes out in sends of at most this


async def answer_program_request(scope: dict, receive, send) -> None:
    """Find the session, read the program (size and time bounded), have the backend answer it while
    listening for the client going away, send the answer.

    Written out in one coroutine: each coroutine between the ``Gatekeeper`` and the worker's future
    is one more frame suspended on the hop to the worker and resumed when the answer comes."""
    state = scope["app"].state
    settings, backend, bodies = state.settings, state.backend, state.bodies
    # the headers read, as text (None where absent), in one pass over ASGI's raw pairs (the last of a
    # repeated one wins)
    headers = dict.fromkeys(_READ)
    for name, value in scope["headers"]:
        if name in headers:
            headers[name] = value.decode("latin-1")
    version, declared, ctype, accept = headers.values()
    if version != PROTOCOL_VERSION:
        raise protocol_mismatch(version)
    owner = scope.get("state", {}).get("owner")  # the caller's token, as the Gatekeeper found it
    waiting = state.waiting_answers
    if owner in waiting.held:  # (a token with no answer waiting for its readers holds nothing there)
        waiting.check(owner)  # 429 while its slow readers' answers hold its share
    sid = scope["path_params"]["sid"]
    expected = declared_length(declared)
    # an unknown or foreign id is answered before its body is read: a made-up id costs nothing
    found = await backend.check_session(sid, owner, expected)  # the session, for answer_program
    # the body's bytes count among all bodies the server holds (``bodies``) until it is answered
    body = await read_body(receive, declared, expected, settings.max_body_bytes, settings.body_timeout_seconds,
                           bodies)
    try:
        watch = ProgramWatch(settings.max_program_seconds)
        # What cancels the listening for the client's going away: the timer that starts it, then the
        # task it started (``_listen``), in a list of one (nothing more is made for a program that
        # is answered before the timer).
        listening = [None]
        listening[0] = asyncio.get_running_loop().call_later(LISTEN_AFTER_SECONDS, _listen, receive, watch, listening)
        try:
            async with backend.answer_program(sid, owner, body, ctype, accept, watch, found) as answer:
                listening[0].cancel()
                # inside: the session runs nothing else until its answer is sent
                # where the time went, for clients and benchmarks: steps inside the worker, and the worker hop
                timing = f"steps;dur={answer.steps_seconds * 1e3:.3f}, worker;dur={answer.worker_seconds * 1e3:.3f}"
                await send({"type": "http.response.start", "status": answer.status, "headers": [
                    (b"content-type", answer.media_type.encode()), (b"content-length", str(answer.total).encode()),
                    (b"server-timing", timing.encode())]})
                parts = answer.parts
                if len(parts) == 1 and type(parts[0]) is bytes and len(parts[0]) <= _PIECE_BYTES:
                    # a small encoded answer (every op's): one send, as it is
                    await send({"type": "http.response.body", "body": parts[0], "more_body": False})
                    return
                pieces = list(iter_parts(parts, _PIECE_BYTES)) or [memoryview(b"")]
                last = len(pieces) - 1
                for i, piece in enumerate(pieces):
                    # A piece of a big fetched tensor's frame is a view of the session's memory, and the
                    # event loop's transport (uvloop) keeps what the socket did not take yet by reference,
                    # past send()'s return and so past the session's gate: the next program's writes
                    # would go out in this answer. So such a piece is copied as it goes out (a memcpy,
                    # never more than a piece of memory); pieces of bytes (encoded answers) cannot
                    # change and go as they are.
                    piece_body = piece if isinstance(piece.obj, bytes) else bytes(piece)
                    await send({"type": "http.response.body", "body": piece_body, "more_body": i < last})
        finally:
            listening[0].cancel()
    finally:
        bodies.held -= len(body)


# The body was read, so the client's next message is the disconnect: under uvicorn it comes when the
# connection is lost (or once the answer is sent, after the listening is cancelled). Listening starts
# only after ``LISTEN_AFTER_SECONDS``, on a timer: a program answered sooner (most: every eager op)
# never pays for a task, and one whose client leaves sooner stops that much later.
LISTEN_AFTER_SECONDS = 0.05


def _listen(receive, watch: ProgramWatch, listening: list) -> None:
    listening[0] = asyncio.ensure_future(_cancel_on_disconnect(receive, watch))


async def _cancel_on_disconnect(receive, watch: ProgramWatch) -> None:
    """Cancels ``watch`` when ASGI ``receive`` says the client disconnected while its program runs."""
    while (await receive())["type"] != "http.disconnect":
        pass
    watch.cancel()


async def _program_doc(sid: str) -> None:
    """Run a program: its steps in order against the session (SPEC.md §3, Programs; its steps: §4)."""


router.add_api_route(
    "/v1/sessions/{sid}/programs", _program_doc, methods=["POST"], name="run_program",
    route_class_override=partial(RawRoute, asgi=answer_program_request),
    **route_doc(200, "ProgramResult", body="Program", extra={507: "ErrorResponse"}))

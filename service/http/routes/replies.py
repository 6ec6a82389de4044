"""Answers of the FastAPI routes: the body a route returns, encoded as the request asked.

msgpack, JSON or framed (big tensors) by the request's ``Accept`` and ``Content-Type``
(SPEC.md §1); the program route encodes its own answer (``programs.py``).
"""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from remote_autograd.proto.codec import FRAMES, iter_parts, wants_msgpack

from ...engine.answers import encode_answer


def wants_msgpack_of(request: Request) -> bool:
    return wants_msgpack(request.headers.get("accept"), request.headers.get("content-type"))


def reply(request: Request, body: dict, status: int = 200) -> Response:
    media_type, parts, total = encode_answer(body, wants_msgpack_of(request), request.headers.get("accept"))
    if media_type == FRAMES:
        return StreamingResponse(_aiter(parts), status_code=status, media_type=FRAMES,
                                 headers={"content-length": str(total)})
    return Response(parts[0], status_code=status, media_type=media_type)


async def _aiter(parts):
    for piece in iter_parts(parts):
        yield piece

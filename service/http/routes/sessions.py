"""``/v1/sessions`` and ``/v1/sessions/{sid}``: make, describe and delete a session."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..openapi import route_doc
from .deps import Backend, Caller
from .replies import reply

router = APIRouter()


@router.post("/v1/sessions", status_code=201, **route_doc(201, "SessionCreated"))
async def create_session(request: Request, backend: Backend, caller: Caller) -> Response:
    return reply(request, await backend.create_session(caller), 201)


@router.get("/v1/sessions/{sid}", **route_doc(200, "SessionInfo"))
async def session_info(sid: str, request: Request, backend: Backend, caller: Caller) -> Response:
    return reply(request, await backend.describe_session(sid, caller))


@router.delete("/v1/sessions/{sid}", status_code=204, **route_doc(204, None))
async def delete_session(sid: str, backend: Backend, caller: Caller) -> Response:
    await backend.delete_session(sid, caller)
    return Response(status_code=204)

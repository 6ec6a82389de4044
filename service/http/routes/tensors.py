"""``GET /v1/sessions/{sid}/tensors/{tid}``: one tensor's value and grad."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..openapi import route_doc
from .deps import Backend, Caller
from .replies import reply, wants_msgpack_of

router = APIRouter()


@router.get("/v1/sessions/{sid}/tensors/{tid}", **route_doc(200, "TensorMessage"))
async def read_tensor(sid: str, tid: str, request: Request, backend: Backend, caller: Caller,
                      value: bool = True, grad: bool = True) -> Response:
    request.app.state.waiting_answers.check(caller)  # 429 while its slow readers' answers hold its share
    message = await backend.read_tensor(sid, caller, tid, value=value, grad=grad,
                                        as_json=not wants_msgpack_of(request))
    return reply(request, message)

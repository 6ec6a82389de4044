"""``GET /v1/ops``: the op table, from which the SDK builds its routes (``client/session/_routes.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ...ops import OP_TABLE
from ..openapi import route_doc
from .deps import Caller
from .replies import reply

router = APIRouter()


@router.get("/v1/ops", **route_doc(200, "OpList"))
async def list_ops(request: Request, _caller: Caller) -> Response:
    return reply(request, {"ops": [entry.info() for entry in OP_TABLE]})

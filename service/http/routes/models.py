"""``GET /v1/models`` and ``GET /v1/models/{name}``: the safetensors files a ``load`` step may name.

Both read the model directory of this process's settings (``service/engine/model_dir.py``); with
the Ray backend the workers that run the loads read the same path on their nodes.
Plain functions, not coroutines: FastAPI runs them on its thread pool, so reading a
directory or a file's header never holds up the event loop.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ...engine import model_dir
from ..openapi import route_doc
from .deps import Caller
from .replies import reply

router = APIRouter()


@router.get("/v1/models", **route_doc(200, "ModelList"))
def list_models(request: Request, _caller: Caller) -> Response:
    return reply(request, {"models": model_dir.list_models(request.app.state.settings.model_dir)})


@router.get("/v1/models/{name:path}", **route_doc(200, "ModelInfo"))
def describe_model(name: str, request: Request, _caller: Caller) -> Response:
    return reply(request, model_dir.describe(request.app.state.settings.model_dir, name))

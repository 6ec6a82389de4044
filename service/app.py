"""The HTTP surface: every route in one short file. Routes parse, authorise and delegate.

Programs run in a worker thread (``run_program`` under the session's lock) so the
event loop keeps answering ``/healthz`` while torch works.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from proto import (
    MSGPACK,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    ErrorCode,
    ProtocolError,
    decode_body,
    encode_body,
    is_msgpack,
)
from proto.messages import validate_program
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .ops import OP_TABLE, load_op_modules
from .runner import check_limits
from .settings import Settings
from .store import SessionStore

log = logging.getLogger("service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """A configured app: its own store, worker pool and settings (tests make several)."""
    settings = settings or Settings.from_env()
    load_op_modules(settings.op_modules)
    if settings.test_ops:
        from . import testing_ops  # noqa: F401  (registers test-only ops)
    store = SessionStore(settings)
    executor = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="remote-autograd")
    app = FastAPI(title="remote-autograd", version=__version__, docs_url="/docs")
    app.state.settings, app.state.store = settings, store
    tokens = tuple(settings.tokens)

    def owner_of(request: Request) -> str | None:
        """The caller's token (its identity), or None when the server has no tokens."""
        if not tokens:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer":
            for t in tokens:
                if hmac.compare_digest(given.encode(), t.encode()):
                    return t
        raise ProtocolError(ErrorCode.UNAUTHORIZED, "missing or invalid bearer token")

    def check_v1(request: Request) -> str | None:
        owner = owner_of(request)
        version = request.headers.get(PROTOCOL_HEADER)
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.PROTOCOL_MISMATCH,
                f"protocol version mismatch: client sent {PROTOCOL_HEADER}: {version or '(none)'}, "
                f"server speaks {PROTOCOL_VERSION}; upgrade the older side",
            )
        return owner

    async def run(fn, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(request: Request, exc: ProtocolError) -> Response:
        return _reply(request, {"error": exc.to_wire(), "results": []}, exc.status)

    @app.exception_handler(RequestValidationError)
    async def _bad_parameters(request: Request, exc: RequestValidationError) -> Response:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in err.get("loc", ())) or "request"
        return await _protocol_error(request, ProtocolError(ErrorCode.BAD_REQUEST, f"{where}: {err.get('msg')}"))

    @app.exception_handler(StarletteHTTPException)
    async def _framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.BAD_REQUEST
        err = ProtocolError(code, f"{request.method} {request.url.path}: {exc.detail}")
        return _reply(request, {"error": err.to_wire(), "results": []}, exc.status_code)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "device": str(store.device), "protocol": PROTOCOL_VERSION}

    @app.get("/readyz")
    async def readyz() -> Response:
        try:
            torch.ones(1, device=store.device).add_(1)
        except Exception as exc:  # the device is not usable: say so, do not crash
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready", "device": str(store.device)})

    @app.get("/v1/ops")
    async def list_ops(request: Request) -> Response:
        check_v1(request)
        return _reply(request, {"ops": [entry.info() for entry in OP_TABLE]})

    @app.post("/v1/sessions", status_code=201)
    async def create_session(request: Request) -> Response:
        session = store.create(check_v1(request))
        s = settings
        body = {
            "session_id": session.id,
            "protocol": PROTOCOL_VERSION,
            "device": str(store.device),
            "server_version": __version__,
            "limits": {
                "max_body_bytes": s.max_body_bytes,
                "max_steps_per_program": s.max_steps_per_program,
                "max_tensor_elements": s.max_tensor_elements,
                "max_tensors_per_session": s.max_tensors_per_session,
                "max_session_bytes": s.max_session_bytes,
                "session_ttl_seconds": s.session_ttl_seconds,
            },
        }
        return _reply(request, body, 201)

    @app.get("/v1/sessions/{sid}")
    async def session_info(sid: str, request: Request) -> Response:
        session = store.get(sid, check_v1(request))
        return _reply(request, {"session_id": sid, "tensors": len(session.tensors), "bytes": session.bytes_held})

    @app.delete("/v1/sessions/{sid}", status_code=204)
    async def delete_session(sid: str, request: Request) -> Response:
        await run(store.delete, sid, check_v1(request))
        return Response(status_code=204)

    @app.post("/v1/sessions/{sid}/programs")
    async def run_program(sid: str, request: Request) -> Response:
        owner = check_v1(request)
        body = await _read_body(request, settings.max_body_bytes)
        session = store.get(sid, owner)
        decoded = decode_body(body, request.headers.get("content-type"))
        check_limits(decoded, settings)
        program = validate_program(decoded)
        outcome = await run(store.run_program, session, program, body, not _wants_msgpack(request))
        return _reply(request, outcome.body, outcome.status)

    @app.get("/v1/sessions/{sid}/tensors/{tid}")
    async def read_tensor(sid: str, tid: str, request: Request, value: bool = True, grad: bool = True) -> Response:
        session = store.get(sid, check_v1(request))
        message = await run(lambda: store.read_tensor(session, tid, value=value, grad=grad, as_json=not _wants_msgpack(request)))
        return _reply(request, message)

    @app.on_event("shutdown")
    async def _stop_workers() -> None:
        executor.shutdown(wait=True)

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` (before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"body of {declared} bytes: limit max_body_bytes={limit}")
    parts = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"body over the limit max_body_bytes={limit}")
        parts.append(chunk)
    return b"".join(parts)


def _wants_msgpack(request: Request) -> bool:
    accept = request.headers.get("accept")
    if accept and accept != "*/*":
        return "msgpack" in accept
    return is_msgpack(request.headers.get("content-type"))


def _reply(request: Request, body: dict, status: int = 200) -> Response:
    as_msgpack = _wants_msgpack(request)
    return Response(
        encode_body(body, as_msgpack),
        status_code=status,
        media_type=MSGPACK if as_msgpack else "application/json",
    )

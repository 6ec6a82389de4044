"""The HTTP surface: every route in one short file. Routes parse, check and delegate.

Authentication, request ids, metrics and access logs happen in ``middleware.Gatekeeper``
before any route. Programs run in a worker thread (``run_program`` under the session's
lock) so the event loop keeps answering ``/healthz`` while torch works; a background
task frees idle sessions.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from functools import partial
from time import perf_counter
from typing import Any

import torch
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from remote_autograd.proto import (
    MSGPACK,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    ErrorCode,
    ProtocolError,
    decode_body,
    encode_body,
)
from remote_autograd.proto.frames import FRAME_MIN_BYTES, FRAMES, extract_frames, header_of, is_frames, iter_parts, pack_frames, unpack_frames
from remote_autograd.proto.messages import validate_program
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .auth import Tokens
from .docs_page import install as install_docs_page
from .answers import fetched_data
from .guards import ProgramSlots, check_limits, read_body
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics
from .middleware import Gatekeeper, header_text, wants_msgpack
from .openapi import install as install_openapi
from .openapi import route_doc
from .raw_route import RawRoute
from .ops import OP_TABLE, load_op_modules
from .settings import Settings
from .store import SessionStore
from .workers import WorkerThreads

log = logging.getLogger("remote_autograd.service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """A configured app: its own store, worker pool, metrics and settings (tests make several)."""
    settings = settings or Settings.from_env()
    load_op_modules(settings.op_modules)
    if settings.test_ops:
        from . import testing_ops  # noqa: F401  (registers test-only ops)
    store = SessionStore(settings)
    workers = WorkerThreads(settings.resolved_workers())  # each session always on the same one
    slots = ProgramSlots(settings.max_concurrent_programs)
    metrics = Metrics(store, in_flight=lambda: slots.busy)
    store.on_step = metrics.observe_step

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sweeper = asyncio.create_task(_sweep_forever(store, settings.sweep_interval_seconds))
        try:
            yield
        finally:  # uvicorn has let running requests finish by now: their programs are done
            sweeper.cancel()
            workers.shutdown()

    # FastAPI's native OpenTelemetry looks up the global providers on every request; the
    # service exports Prometheus metrics instead, so it is off (see service.metrics).
    app = FastAPI(title="remote-autograd", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    install_openapi(app)  # the protocol's message schemas in /docs
    install_docs_page(app)  # /docs without a CDN, and with a token field
    app.state.settings, app.state.store, app.state.metrics = settings, store, metrics
    app.add_middleware(Gatekeeper, tokens=Tokens(settings.tokens), metrics=metrics, routes=app.router.routes)

    def check_v1(request: Request) -> str | None:
        """The caller (its token, as the Gatekeeper found it) once the protocol header matches."""
        return _caller(request.scope, request.headers.get(PROTOCOL_HEADER))

    async def run(session, fn, *args) -> Any:
        """``fn(*args)`` on ``session``'s worker thread, with this request's context (its id reaches the logs)."""
        return await workers.run(session.worker, fn, *args)

    @app.exception_handler(ProtocolError)
    async def _protocol_error(request: Request, exc: ProtocolError) -> Response:
        return _reply(request, exc.answer(), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _bad_parameters(request: Request, exc: RequestValidationError) -> Response:
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in err.get("loc", ())) or "request"
        return await _protocol_error(request, ProtocolError(ErrorCode.BAD_REQUEST, f"{where}: {err.get('msg')}"))

    @app.exception_handler(StarletteHTTPException)
    async def _framework_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.BAD_REQUEST
        err = ProtocolError(code, f"{request.method} {request.url.path}: {exc.detail}")
        return _reply(request, err.answer(), exc.status_code)

    @app.get("/healthz", **route_doc(200, "Health", v1=False))
    async def healthz() -> dict:
        return {"status": "ok", "device": str(store.device), "protocol": PROTOCOL_VERSION}

    @app.get("/readyz", **route_doc(200, "Readiness", v1=False, extra={503: "Readiness"}))
    async def readyz() -> Response:
        try:
            torch.ones(1, device=store.device).add_(1)
        except Exception as exc:  # the device is not usable: say so, do not crash
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready", "device": str(store.device)})

    @app.get("/v1/ops", **route_doc(200, "OpList"))
    async def list_ops(request: Request) -> Response:
        check_v1(request)
        return _reply(request, {"ops": [entry.info() for entry in OP_TABLE]})

    @app.get("/metrics", include_in_schema=False)  # Prometheus text, not part of the protocol
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.post("/v1/sessions", status_code=201, **route_doc(201, "SessionCreated"))
    async def create_session(request: Request) -> Response:
        session = store.create(check_v1(request))
        session.worker = workers.least_loaded(s.worker for s in store.sessions() if s is not session)
        body = {
            "session_id": session.id,
            "protocol": PROTOCOL_VERSION,
            "device": str(store.device),
            "server_version": __version__,
            "gpu_name": torch.cuda.get_device_name(store.device) if store.device.type == "cuda" else None,
            "gpu_memory_bytes": (torch.cuda.get_device_properties(store.device).total_memory
                                 if store.device.type == "cuda" else None),
            "limits": settings.limits(),
        }
        return _reply(request, body, 201)

    @app.get("/v1/sessions/{sid}", **route_doc(200, "SessionInfo"))
    async def session_info(sid: str, request: Request) -> Response:
        session = store.get(sid, check_v1(request))
        return _reply(request, {"session_id": sid, "tensors": len(session.tensors), "bytes": session.bytes_held})

    @app.delete("/v1/sessions/{sid}", status_code=204, **route_doc(204, None))
    async def delete_session(sid: str, request: Request) -> Response:
        owner = check_v1(request)
        await run(store.get(sid, owner), store.delete, sid, owner)
        return Response(status_code=204)

    async def run_program(scope: dict, receive, send) -> None:
        """POST /v1/sessions/{sid}/programs, in plain ASGI: the hot path of every op (see ``RawRoute``)."""
        headers = dict(scope["headers"])
        owner = _caller(scope, header_text(headers.get(_PROTOCOL_KEY)))
        body = await read_body(receive, header_text(headers.get(b"content-length")), settings.max_body_bytes,
                               settings.body_timeout_seconds)
        session = store.get(scope["path_params"]["sid"], owner)
        ctype, accept = header_text(headers.get(b"content-type")), header_text(headers.get(b"accept"))
        framed = is_frames(ctype)
        decoded = unpack_frames(body) if framed else decode_body(body, ctype)
        check_limits(decoded, settings)
        program = validate_program(decoded)
        key = header_of(body) if framed else body  # idempotency: a framed body is known by its header
        as_msgpack = wants_msgpack(accept, ctype)
        with slots:
            async with session.gate:  # this session's programs queue here, not in the workers
                start = perf_counter()
                outcome = await run(session, store.run_program, session, program, key, not as_msgpack)
                worker = perf_counter() - start
                metrics.program_seconds.observe(worker)
        media_type, parts, total = _encode(outcome.body, as_msgpack, accept)
        # where the time went, for clients and benchmarks: steps inside the worker, and the worker hop
        timing = f"steps;dur={outcome.seconds * 1e3:.3f}, worker;dur={worker * 1e3:.3f}"
        await send({"type": "http.response.start", "status": outcome.status, "headers": [
            (b"content-type", media_type.encode()), (b"content-length", str(total).encode()),
            (b"server-timing", timing.encode())]})
        pieces = list(iter_parts(parts)) or [b""]  # a small answer is one piece: one send
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": i < last})

    async def _program_doc(sid: str) -> None:
        """Run a program: its steps in order against the session (SPEC.md §5)."""

    app.router.add_api_route(
        "/v1/sessions/{sid}/programs", _program_doc, methods=["POST"], name="run_program",
        route_class_override=partial(RawRoute, asgi=run_program),
        **route_doc(200, "ProgramResult", body="Program", extra={507: "ErrorResponse"}))
    routes = app.router.routes  # the router tries routes in order: the busiest goes first
    routes.insert(0, routes.pop())

    @app.get("/v1/sessions/{sid}/tensors/{tid}", **route_doc(200, "TensorMessage"))
    async def read_tensor(sid: str, tid: str, request: Request, value: bool = True, grad: bool = True) -> Response:
        session = store.get(sid, check_v1(request))
        message = await run(session, lambda: store.read_tensor(session, tid, value=value, grad=grad, as_json=not _wants_msgpack(request)))
        return _reply(request, message)

    return app


async def _sweep_forever(store: SessionStore, interval: float) -> None:
    """Free idle sessions every ``interval`` seconds, so their memory returns even if nobody calls."""
    while True:
        await asyncio.sleep(interval)
        try:
            store.sweep()
        except Exception:  # never let the sweeper die: the next round tries again
            log.exception("session sweep failed")


_PROTOCOL_KEY = PROTOCOL_HEADER.lower().encode()


def _caller(scope: dict, version: str | None) -> str | None:
    """The caller (its token, as the Gatekeeper found it) once the protocol header ``version`` matches."""
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.PROTOCOL_MISMATCH,
            f"protocol version mismatch: client sent {PROTOCOL_HEADER}: {version or '(none)'}, "
            f"server speaks {PROTOCOL_VERSION}; upgrade the older side",
        )
    return scope.get("state", {}).get("owner")


def _framable(body: dict) -> bool:
    """Whether an answer holds a fetched tensor big enough to travel as a frame (looked up
    directly: ``extract_frames`` copies the whole answer while it searches)."""
    return any(memoryview(data).nbytes >= FRAME_MIN_BYTES for data in fetched_data(body))


async def _aiter(parts):
    for piece in iter_parts(parts):
        yield piece


def _wants_msgpack(request: Request) -> bool:
    return wants_msgpack(request.headers.get("accept"), request.headers.get("content-type"))


def _encode(body: dict, as_msgpack: bool, accept: str | None) -> tuple[str, list[bytes | memoryview], int]:
    """(media type, body parts, total length) of an answer: framed when it carries big tensors and
    the client accepts frames (they then go out of the tensors' own memory, never packed into one buffer)."""
    if as_msgpack and FRAMES in (accept or "") and _framable(body):
        header, frames = extract_frames(body, FRAME_MIN_BYTES)
        if frames:
            parts, total = pack_frames(header, frames)
            return FRAMES, parts, total
    data = encode_body(body, as_msgpack)
    return (MSGPACK if as_msgpack else "application/json"), [data], len(data)


def _reply(request: Request, body: dict, status: int = 200) -> Response:
    media_type, parts, total = _encode(body, _wants_msgpack(request), request.headers.get("accept"))
    if media_type == FRAMES:
        return StreamingResponse(_aiter(parts), status_code=status, media_type=FRAMES,
                                 headers={"content-length": str(total)})
    return Response(parts[0], status_code=status, media_type=media_type)

"""The HTTP surface: every route in one short file. Routes parse, check and delegate.

Authentication, request ids, metrics and access logs happen in ``middleware.Gatekeeper``
before any route. Routes speak to a ``SessionBackend`` in ids and bytes: ``LocalSessions``
(the default: sessions in this process, torch on worker threads, so the event loop keeps
answering ``/healthz`` while torch works) or ``RaySessions`` (sessions in worker actors on
a Ray cluster; this process then keeps no session state).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from remote_autograd.proto import PROTOCOL_HEADER, PROTOCOL_VERSION, ErrorCode, ProtocolError
from remote_autograd.proto.frames import FRAMES, iter_parts

from . import __version__
from .answers import encode_answer
from .auth import Tokens
from .docs_page import install as install_docs_page
from .guards import read_body
from .local_sessions import LocalSessions
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics
from .middleware import Gatekeeper, header_text, wants_msgpack
from .openapi import install as install_openapi
from .openapi import route_doc
from .ops import OP_TABLE, load_op_modules
from .raw_route import RawRoute
from .settings import Settings

log = logging.getLogger("remote_autograd.service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """A configured app: its own backend (sessions, workers), metrics and settings (tests make several)."""
    settings = settings or Settings.from_env()
    load_op_modules(settings.op_modules)
    if settings.test_ops:
        from . import testing_ops  # noqa: F401  (registers test-only ops)
    backend = make_backend(settings)
    local = backend if isinstance(backend, LocalSessions) else None  # the front holds the sessions itself
    metrics = Metrics(local.store if local else None, in_flight=lambda: backend.slots.busy)
    if local is not None:
        local.store.on_step = metrics.observe_step
    backend.observe_program = metrics.program_seconds.observe

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        backend.start()
        try:
            yield
        finally:  # uvicorn has let running requests finish by now: their programs are done
            backend.close()

    # FastAPI's native OpenTelemetry looks up the global providers on every request; the
    # service exports Prometheus metrics instead, so it is off (see service.metrics).
    app = FastAPI(title="remote-autograd", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    install_openapi(app)  # the protocol's message schemas in /docs
    install_docs_page(app)  # /docs without a CDN, and with a token field
    app.state.settings, app.state.backend, app.state.metrics = settings, backend, metrics
    app.state.store = local.store if local else None
    app.add_middleware(Gatekeeper, tokens=Tokens(settings.tokens), metrics=metrics, routes=app.router.routes)

    def check_v1(request: Request) -> str | None:
        """The caller (its token, as the Gatekeeper found it) once the protocol header matches."""
        return _caller(request.scope, request.headers.get(PROTOCOL_HEADER))

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
        return {"status": "ok", **backend.health(), "protocol": PROTOCOL_VERSION}

    @app.get("/readyz", **route_doc(200, "Readiness", v1=False, extra={503: "Readiness"}))
    async def readyz() -> Response:
        ready, body = await backend.readiness()
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/v1/ops", **route_doc(200, "OpList"))
    async def list_ops(request: Request) -> Response:
        check_v1(request)
        return _reply(request, {"ops": [entry.info() for entry in OP_TABLE]})

    @app.get("/metrics", include_in_schema=False)  # Prometheus text, not part of the protocol
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.post("/v1/sessions", status_code=201, **route_doc(201, "SessionCreated"))
    async def create_session(request: Request) -> Response:
        return _reply(request, await backend.create_session(check_v1(request)), 201)

    @app.get("/v1/sessions/{sid}", **route_doc(200, "SessionInfo"))
    async def session_info(sid: str, request: Request) -> Response:
        return _reply(request, await backend.describe_session(sid, check_v1(request)))

    @app.delete("/v1/sessions/{sid}", status_code=204, **route_doc(204, None))
    async def delete_session(sid: str, request: Request) -> Response:
        await backend.delete_session(sid, check_v1(request))
        return Response(status_code=204)

    async def run_program_route(scope: dict, receive, send) -> None:
        """POST /v1/sessions/{sid}/programs, in plain ASGI: the hot path of every op (see ``RawRoute``)."""
        headers = dict(scope["headers"])
        owner = _caller(scope, header_text(headers.get(_PROTOCOL_KEY)))
        body = await read_body(receive, header_text(headers.get(b"content-length")), settings.max_body_bytes,
                               settings.body_timeout_seconds)
        answer = await backend.answer_program(scope["path_params"]["sid"], owner, body,
                                              header_text(headers.get(b"content-type")),
                                              header_text(headers.get(b"accept")))
        # where the time went, for clients and benchmarks: steps inside the worker, and the worker hop
        timing = f"steps;dur={answer.steps_seconds * 1e3:.3f}, worker;dur={answer.worker_seconds * 1e3:.3f}"
        await send({"type": "http.response.start", "status": answer.status, "headers": [
            (b"content-type", answer.media_type.encode()), (b"content-length", str(answer.total).encode()),
            (b"server-timing", timing.encode())]})
        pieces = list(iter_parts(answer.parts)) or [b""]  # a small answer is one piece: one send
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": i < last})

    async def _program_doc(sid: str) -> None:
        """Run a program: its steps in order against the session (SPEC.md §5)."""

    app.router.add_api_route(
        "/v1/sessions/{sid}/programs", _program_doc, methods=["POST"], name="run_program",
        route_class_override=partial(RawRoute, asgi=run_program_route),
        **route_doc(200, "ProgramResult", body="Program", extra={507: "ErrorResponse"}))
    routes = app.router.routes  # the router tries routes in order: the busiest goes first
    routes.insert(0, routes.pop())

    @app.get("/v1/sessions/{sid}/tensors/{tid}", **route_doc(200, "TensorMessage"))
    async def read_tensor(sid: str, tid: str, request: Request, value: bool = True, grad: bool = True) -> Response:
        message = await backend.read_tensor(sid, check_v1(request), tid, value=value, grad=grad,
                                            as_json=not _wants_msgpack(request))
        return _reply(request, message)

    return app


def make_backend(settings: Settings):
    """The ``SessionBackend`` that ``settings.backend`` names: ``inprocess`` (default) or ``ray``."""
    if settings.backend == "inprocess":
        return LocalSessions(settings)
    if settings.backend == "ray":
        from .ray_sessions import RaySessions  # ray is an optional extra: imported only when asked for

        return RaySessions(settings)
    raise ValueError(f"REMOTE_AUTOGRAD_BACKEND={settings.backend!r}: use inprocess or ray")


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


async def _aiter(parts):
    for piece in iter_parts(parts):
        yield piece


def _wants_msgpack(request: Request) -> bool:
    return wants_msgpack(request.headers.get("accept"), request.headers.get("content-type"))


def _reply(request: Request, body: dict, status: int = 200) -> Response:
    media_type, parts, total = encode_answer(body, _wants_msgpack(request), request.headers.get("accept"))
    if media_type == FRAMES:
        return StreamingResponse(_aiter(parts), status_code=status, media_type=FRAMES,
                                 headers={"content-length": str(total)})
    return Response(parts[0], status_code=status, media_type=media_type)

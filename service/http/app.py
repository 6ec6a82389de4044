"""``create_app``: the app wired from its parts. The routes themselves are in ``service/http/routes/``.

Authentication, request ids, metrics and access logs happen in ``middleware.Gatekeeper``
before any route. Routes speak to a ``SessionBackend`` in ids and bytes: ``TenantProcesses`` (the default:
each token's sessions in a worker process of its own, each running ``LocalSessions``),
``LocalSessions`` (``REMOTE_AUTOGRAD_TENANT_PROCESSES=off``: sessions in this process, torch
on worker threads, so the event loop keeps answering ``/healthz`` while torch works) or
``RaySessions`` (sessions in worker actors on a Ray cluster). The first and the last keep no
session state in this process.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .. import __version__
from ..backends import state_volume
from ..backends.local_sessions import LocalSessions
from ..backends.tenant_processes import TenantProcesses
from ..engine import compiled_templates
from ..engine.guards import BodyBytes
from ..ops import load_configured_ops
from ..settings import Settings
from .auth import Tokens
from .docs_page import API_DESCRIPTION
from .docs_page import install as install_docs_page
from .metrics import Metrics
from .middleware import Gatekeeper
from .openapi import install as install_openapi
from .routes import ROUTERS, errors
from .tenant_metrics import TenantFigures
from .waiting_answers import WaitingAnswers

log = logging.getLogger("remote_autograd.service")

SINGLE_PROCESS_RISK = (
    "REMOTE_AUTOGRAD_TENANT_PROCESSES=off: every session runs in the server's own process. A kernel that "
    "crashes (a segfault, an abort) ends the server and every session in it; every tenant shares one address "
    "space; a step that runs past max_program_seconds cannot be stopped. Leave it unset (on) for a worker "
    "process per tenant")


def create_app(settings: Settings | None = None) -> FastAPI:
    """A configured app: its own backend (sessions, workers), metrics and settings (tests make several)."""
    settings = settings or Settings.from_env()
    load_configured_ops(settings.op_modules, test_ops=settings.test_ops)
    backend = make_backend(settings)
    local = backend if isinstance(backend, LocalSessions) else None  # the front holds the sessions itself
    figures = TenantFigures(backend) if isinstance(backend, TenantProcesses) else None
    metrics = Metrics(local.store if local else None, backend.slots, figures)
    if local is not None:
        local.on_step = metrics.op_seconds
    backend.observe_program = metrics.program_seconds.observe

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if local is not None and settings.state_dir:
            state_volume.restore_all(local, settings)
        backend.start()
        try:
            yield
        finally:  # uvicorn has let running requests finish by now: their programs are done
            await backend.close()  # a process per tenant: each worker saves its sessions (with a state directory)
            if local is not None and settings.state_dir:
                state_volume.save_all(local, settings)

    # FastAPI's native OpenTelemetry looks up the global providers on every request; the
    # service exports Prometheus metrics instead, so it is off (see service.http.metrics).
    app = FastAPI(title="remote-autograd", version=__version__, description=API_DESCRIPTION, docs_url=None,
                  redoc_url=None, lifespan=lifespan, telemetry={"tracing": False, "metrics": False, "logs": False})
    install_openapi(app)  # the protocol's message schemas in /docs
    install_docs_page(app)  # /docs without a CDN, and with a token field
    app.state.settings, app.state.backend, app.state.metrics = settings, backend, metrics
    app.state.bodies = BodyBytes(settings.max_body_bytes_in_flight)
    app.state.waiting_answers = WaitingAnswers(settings.max_bytes_per_token)  # (http_protocol charges it)
    # the Gatekeeper matches routes itself (the program route, and the route of a request it refuses):
    # it gets them flat, as an included router sits in app.router.routes as one opaque entry
    routes = [*app.router.routes, *(route for router in ROUTERS for route in router.routes)]
    app.add_middleware(Gatekeeper, tokens=Tokens(settings.tokens, operator=settings.metrics_token), metrics=metrics,
                       routes=routes)

    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def make_backend(settings: Settings):
    """The ``SessionBackend`` that ``settings.backend`` names: ``inprocess`` (default) or ``ray``.

    In process, each token's sessions run in a worker process of their own (one token or none
    too), unless ``REMOTE_AUTOGRAD_TENANT_PROCESSES=off``: then in this process, without the hop
    between processes (``SINGLE_PROCESS_RISK``, which a server's start logs, says what that risks)."""
    settings.replays()  # a misspelt REMOTE_AUTOGRAD_REPLAY stops the server at its start, not a program
    settings.graph_mode()  # and REMOTE_AUTOGRAD_CUDA_GRAPHS
    compiled_templates.available(settings)  # and REMOTE_AUTOGRAD_COMPILE; a missing compiler said at the start
    if settings.backend == "inprocess":
        return TenantProcesses(settings) if settings.per_tenant_processes() else LocalSessions(settings)
    if settings.backend == "ray":
        from ..backends.ray_sessions import RaySessions  # ray is an optional extra: imported only when asked for

        return RaySessions(settings)
    raise ValueError(f"REMOTE_AUTOGRAD_BACKEND={settings.backend!r}: use inprocess or ray")


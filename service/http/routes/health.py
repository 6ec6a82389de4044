"""``/healthz``, ``/readyz`` and ``/metrics``: for probes and Prometheus, outside the protocol."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from remote_autograd.proto import PROTOCOL_VERSION

from ..metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from ..openapi import route_doc
from .deps import AppMetrics, Backend

router = APIRouter()


@router.get("/healthz", **route_doc(200, "Health", v1=False))
async def healthz(backend: Backend) -> dict:
    return {"status": "ok", **backend.health(), "protocol": PROTOCOL_VERSION}


@router.get("/readyz", **route_doc(200, "Readiness", v1=False, extra={503: "Readiness"}))
async def readyz(backend: Backend) -> Response:
    ready, body = await backend.readiness()
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)  # Prometheus text, not part of the protocol
async def prometheus_metrics(request: Request, metrics: AppMetrics) -> Response:
    """Everything for the operator (the Gatekeeper says who that is), a tenant's own figures otherwise."""
    state = request.scope.get("state", {})
    await metrics.refresh()  # figures held by other processes (a worker process per tenant)
    body = metrics.render(state.get("owner"), everything=bool(state.get("operator")))
    return Response(body, media_type=METRICS_CONTENT_TYPE)

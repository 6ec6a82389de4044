"""``Gatekeeper``: the one pure-ASGI middleware every request passes, before any route.

It gives the request an id (echoed as ``X-Request-ID``), checks the bearer token
on every path but ``auth.PUBLIC_PATHS`` (``/openapi.json`` and ``/metrics``
included: they are not routes of ours, so a route-level check would miss them),
and when the answer is sent counts it and writes one access-log line. Pure ASGI,
not ``BaseHTTPMiddleware``: it adds a few microseconds, not a task per request.
A ``RawRoute`` (the program route, every op's path) it calls itself, past the
exception middleware and the router (a speed path: see ``service/http/raw_route.py``).
"""

from __future__ import annotations

import logging
import re
import uuid
from time import perf_counter
from typing import Any, Callable

from starlette.routing import Match

from remote_autograd.proto import MSGPACK, ProtocolError, encode_body
from remote_autograd.proto.codec import wants_msgpack

from ..logs import REQUEST_ID
from .auth import METRICS_PATH, PUBLIC_PATHS, Tokens
from .metrics import METHODS, Metrics
from .raw_route import RawRoute

access_log = logging.getLogger("remote_autograd.service.access")
error_log = logging.getLogger("remote_autograd.service")
_SANE_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")  # a request id of the caller's we echo and log


def error_response(err: ProtocolError, as_msgpack: bool) -> tuple[bytes, str]:
    """The protocol's error body for ``err`` and its media type."""
    body = encode_body(err.answer(), as_msgpack)
    return body, MSGPACK if as_msgpack else "application/json"


class Gatekeeper:
    """Request id, authentication, metrics and the access log around the app."""

    def __init__(self, app: Callable, *, tokens: Tokens, metrics: Metrics, routes: list) -> None:
        self.app, self.tokens, self.metrics, self.routes = app, tokens, metrics, routes
        self._raw_routes: list[RawRoute] | None = None  # found at the first request, once all routes exist
        self._counters: dict[tuple, Any] = {}  # the requests counter of each (route, method, status) counted

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        # The request id, the caller and the raw route are found here inline: every request (every
        # op's) passes, and each was a method or function of its own to follow for a few lines.
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = perf_counter()
        headers = dict(scope["headers"])
        rid = headers.get(b"x-request-id")  # the caller's if it is short and plain, else a new one
        rid = rid.decode() if rid and _SANE_ID.fullmatch(rid) else uuid.uuid4().hex
        status = 500  # if the app raises before answering, Starlette answers 500
        started = False
        context = REQUEST_ID.set(rid)

        async def send_with_id(message: dict) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            try:
                # the caller's token (None on public paths and for the operator, whom the metrics route
                # is told of as ``state["operator"]``), or 401
                state = scope.setdefault("state", {})
                path, authorization, tokens = scope["path"], headers.get(b"authorization"), self.tokens
                if path in PUBLIC_PATHS:
                    state["owner"] = None
                elif path == METRICS_PATH and tokens.is_operator(authorization):
                    state["owner"], state["operator"] = None, True
                else:
                    state["owner"] = tokens.owner(authorization) if tokens.enabled else None
                # the app of the ``RawRoute`` that fully matches (its path parameters and route put in
                # ``scope``, as the router would), else the app's router
                app = self.app
                if self._raw_routes is None:
                    self._raw_routes = [route for route in self.routes if isinstance(route, RawRoute)]
                for route in self._raw_routes:
                    match, child = route.matches(scope)
                    if match is Match.FULL:
                        scope.update(child)
                        app = route.app
                        break
                await app(scope, receive, send_with_id)
            except ProtocolError as err:  # refused here, or raised by a raw route (the router's handlers are past)
                if started:
                    raise
                await self._refuse(err, headers, send_with_id)
        finally:
            REQUEST_ID.reset(context)
            self._observe(scope, status, perf_counter() - start, rid)

    async def _refuse(self, err: ProtocolError, headers: dict, send: Callable) -> None:
        as_msgpack = wants_msgpack(header_text(headers.get(b"accept")), header_text(headers.get(b"content-type")))
        body, media_type = error_response(err, as_msgpack)
        extra = [(b"www-authenticate", b"Bearer")] if err.status == 401 else []
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode()),
                                *extra]})
        await send({"type": "http.response.body", "body": body})

    def _observe(self, scope: dict, status: int, seconds: float, rid: str) -> None:
        # the route's template (``/v1/sessions/{sid}``, not the path: bounded labels), found by matching
        # when auth refused early
        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] is Match.FULL), None)
        route = getattr(route, "path", None) or "unmatched"
        method = scope["method"]
        key = (route, method if method in METHODS else "OTHER", status)
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = self.metrics.request_counter(*key)
        counter.inc()
        if status >= 500:
            error_log.error("answered %d to %s %s", status, scope["method"], route,
                            extra=_fields(scope, route, status, seconds, rid))
        elif access_log.isEnabledFor(logging.INFO):
            access_log.info("%s %s %d", scope["method"], route, status, extra=_fields(scope, route, status, seconds, rid))


def _fields(scope: dict, route: str, status: int, seconds: float, rid: str) -> dict[str, Any]:
    return {"request_id": rid, "route": route, "status": status, "duration_ms": round(seconds * 1000, 3),
            "session": scope.get("path_params", {}).get("sid")}


def header_text(raw: bytes | None) -> str | None:
    """A raw ASGI header value as text (None stays None)."""
    return raw.decode("latin-1") if raw is not None else None

"""What routes depend on, as FastAPI dependencies: the backend, the metrics, the caller.

Each provider reads ``app.state`` (``create_app`` puts the backend, metrics and
settings there), so a route takes what it needs as a parameter and a test can
serve one router on a bare app with ``app.dependency_overrides`` in place of them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from remote_autograd.proto import PROTOCOL_HEADER, PROTOCOL_VERSION, ErrorCode, ProtocolError

from ...backends.protocol import SessionBackend
from ..metrics import Metrics


def backend(request: Request) -> SessionBackend:
    """The app's backend (``LocalSessions``, ``TenantProcesses`` or ``RaySessions``)."""
    return request.app.state.backend


def metrics(request: Request) -> Metrics:
    return request.app.state.metrics


def caller(request: Request) -> str | None:
    """The caller (its token, as the Gatekeeper found it) once the protocol header matches."""
    version = request.headers.get(PROTOCOL_HEADER)
    if version != PROTOCOL_VERSION:
        raise protocol_mismatch(version)
    return request.scope.get("state", {}).get("owner")


PROTOCOL_KEY = PROTOCOL_HEADER.lower().encode()  # as a raw ASGI header name


def protocol_mismatch(version: str | None) -> ProtocolError:
    """The error for a protocol header that is not ``PROTOCOL_VERSION`` (``version``: what was sent)."""
    return ProtocolError(
        ErrorCode.PROTOCOL_MISMATCH,
        f"protocol version mismatch: client sent {PROTOCOL_HEADER}: {version or '(none)'}, "
        f"server speaks {PROTOCOL_VERSION}; {_what_to_do(version)}",
    )


def _what_to_do(version: str | None) -> str:
    """A missing header is the first curl's mistake, not an old client: it says which header to add."""
    if not version:
        return f"add the header `{PROTOCOL_HEADER}: {PROTOCOL_VERSION}` to every request under /v1"
    if version.isdigit():
        return "upgrade the older side"
    return f"send `{PROTOCOL_HEADER}: {PROTOCOL_VERSION}` (a protocol version is a whole number)"


Backend = Annotated[SessionBackend, Depends(backend)]
Caller = Annotated[str | None, Depends(caller)]
AppMetrics = Annotated[Metrics, Depends(metrics)]

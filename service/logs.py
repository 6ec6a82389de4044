"""Structured logs: one JSON object per line, through the standard ``logging`` module.

Every line has the same keys (``time, level, logger, message, request_id, route,
status, duration_ms, session``; null when unknown), so a log pipeline needs no
per-message parsing. The request id (the ``Gatekeeper``'s: the caller's ``X-Request-ID``
when it is sane, else a new one) is carried into worker threads by a context variable.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import datetime, timezone

# Once-a-process events an operator needs whatever the level (sessions saved at SIGTERM, restored at
# start): info records, not warnings (nothing is wrong), shown at the default level (``configure``).
LIFECYCLE = "remote_autograd.service.lifecycle"
REQUEST_ID: ContextVar[str | None] = ContextVar("remote_autograd_request_id", default=None)
FIELDS = ("request_id", "route", "status", "duration_ms", "session")


class JsonFormatter(logging.Formatter):
    """A record as one JSON line; request fields come from ``extra=`` or the current request."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            out[name] = getattr(record, name, None)
        if out["request_id"] is None:
            out["request_id"] = REQUEST_ID.get()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "warning") -> None:
    """Send every logger's records (uvicorn's too) to stderr as JSON lines, at ``level``.

    The ``LIFECYCLE`` logger's info records pass at ``warning`` too (the default: a line per
    request is ``info``'s, too many for it, while a restart's saves and restores are a few lines
    an operator looks for); ``error`` and above silence them as everything else.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger(LIFECYCLE).setLevel(logging.INFO if root.level <= logging.WARNING else root.level)

"""The HTTP routes, one router per resource; ``service/http/app.py`` includes them all.

``deps.py`` holds what routes depend on (backend, metrics, caller) as FastAPI
dependencies, ``replies.py`` the encoding of their answers, ``errors.py`` the
exception handlers. ``programs.py`` is the one route in plain ASGI (the hot path).
"""

from __future__ import annotations

from . import health, models, ops, programs, sessions, tensors

ROUTERS = (programs.router, sessions.router, tensors.router, ops.router, models.router, health.router)

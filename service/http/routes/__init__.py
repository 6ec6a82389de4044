"""The HTTP routes, one router per resource; ``service/http/app.py`` includes them all.

``deps.py`` holds what routes depend on (backend, metrics, caller) as FastAPI
dependencies, ``replies.py`` the encoding of their answers, ``errors.py`` the
exception handlers. ``programs.py`` is the one route in plain ASGI (the hot path).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``programs.py``: the program route: ``answer_program_request``, plain ASGI (the hot path of every op)

The routers: ``programs.py``, ``sessions.py``, ``tensors.py``, ``ops.py`` (``GET /v1/ops``), ``models.py``
(the model directory), ``health.py``.
"""

from __future__ import annotations

from . import health, models, ops, programs, sessions, tensors

ROUTERS = (programs.router, sessions.router, tensors.router, ops.router, models.router, health.router)

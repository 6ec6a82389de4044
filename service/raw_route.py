"""``RawRoute``: a route documented in ``/docs`` like any other, whose handler is a plain ASGI app.

FastAPI's request handling (dependency solving, ``Request`` and ``Response`` objects)
costs ~30 µs a request here; the program route carries every op, so it skips that
and speaks ASGI itself. The ``Gatekeeper`` calls it directly, past the exception
middleware and the router (~12 µs more), and answers the ``ProtocolError`` it raises
the way the app's handler would.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi.routing import APIRoute


class RawRoute(APIRoute):
    """An ``APIRoute`` whose ``endpoint`` only describes it (path parameters, docs); ``asgi`` answers."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, asgi: Callable, **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = asgi

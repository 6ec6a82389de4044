"""``RawRoute``: a route documented in ``/docs`` like any other, whose handler is a plain ASGI app.

A speed path. The plain path it stands in for is an ordinary FastAPI route (a ``Request``,
dependencies solved per call, a ``Response`` object); the program route carries every op, so
it skips that work and speaks ASGI itself (``service/http/routes/programs.py``). The ``Gatekeeper``
(``service/http/middleware.py``) also calls it directly, past the exception middleware and the
router, and answers the ``ProtocolError`` it raises the way the app's handler would. What
that saves shows in ``make bench``'s ``[latency]`` lines: "an empty program (same
transport)" against "floor: bare FastAPI msgpack endpoint (same transport)".
``tests/service/http/test_raw_route.py`` checks it answers as the plain FastAPI route would, and
``tests/service/http/test_gatekeeper.py`` that the Gatekeeper's direct call does what the router would.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi.routing import APIRoute


class RawRoute(APIRoute):
    """An ``APIRoute`` whose ``endpoint`` only describes it (path parameters, docs); ``asgi`` answers."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, asgi: Callable, **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        self.app = asgi

"""``sess.ops.<name>(...)``: any op of the server's table, by name."""

from __future__ import annotations

from typing import Any

from ._core import SessionCore, call_op


class OpsNamespace:
    """Attribute access maps to the server's op names; unknown names raise at once."""

    def __init__(self, session: SessionCore) -> None:
        self._session = session

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        session = self._session
        if name not in session._routes.ops:
            raise AttributeError(f"the server's op table has no op {name!r} (see dir(sess.ops) or GET /v1/ops)")

        def call(*args: Any, **kwargs: Any):
            return call_op(session, name, args, kwargs)

        call.__name__ = name
        return call

    def __dir__(self) -> list[str]:
        return sorted(self._session._routes.ops)

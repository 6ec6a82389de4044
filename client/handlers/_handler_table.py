"""``HandlerTable``: the torch callables one module answers itself, and the function that answers each.

Each handler module (``_metadata``, ``_autograd``, ``_moves``, ``_packed``, ``_composites``,
``_copies``) fills a table of its own as it is imported; ``handlers.LOCAL_HANDLERS`` merges them
into the one ``RemoteTensor.__torch_function__`` consults (``client/_core``'s ``LOCAL_HANDLERS``, which the
handlers package fills as it is imported), and refuses a callable claimed twice (which table won would otherwise depend on
import order).
"""

from __future__ import annotations

from typing import Callable


class HandlerTable(dict):
    """torch callable -> the handler that answers it for a RemoteTensor."""

    def on(self, *funcs: Callable) -> Callable[[Callable], Callable]:
        """A decorator: the handler answers each of ``funcs``."""

        def register(handler: Callable) -> Callable:
            for f in funcs:
                self[f] = handler
            return handler

        return register


def merge(*tables: HandlerTable) -> dict[Callable, Callable]:
    """One table from several; a callable in two of them is an error, never a silent choice."""
    merged: dict[Callable, Callable] = {}
    for table in tables:
        twice = merged.keys() & table.keys()
        if twice:
            raise RuntimeError(f"torch callables with two handlers: {sorted(map(str, twice))}")
        merged.update(table)
    return merged

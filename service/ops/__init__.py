"""The op table. Importing this package registers every built-in family, then torch's own ops
from the committed allow-list (``surface.json``, see ``surface.py``).

``OP_TABLE`` maps a name to an ``OpEntry``; ``load_op_modules`` imports an
operator's own modules (``REMOTE_AUTOGRAD_OP_MODULES``) so their ``@op``
decorators register too.
"""

from __future__ import annotations

import importlib

from . import (  # noqa: F401  (importing a family registers its ops)
    casts,
    custom,
    factories,
    indexing,
    session,
)
from . import surface  # noqa: F401,E402  (last: torch's own ops the families above do not serve)
from ._checks import OpRegistrationError, check_entry
from ._registry import OP_TABLE, OpEntry, OpTable, op
from ._samples import S, Sample, T

__all__ = ["OP_TABLE", "OpEntry", "OpRegistrationError", "OpTable", "S", "Sample", "T", "check_entry",
           "load_configured_ops", "load_op_modules", "op"]


def load_configured_ops(op_modules: tuple[str, ...] | list[str], *, test_ops: bool) -> None:
    """The ops a server's settings add to the table: the operator's modules, and the test-only ops
    when asked (a front and every Ray worker load the same)."""
    load_op_modules(op_modules)
    if test_ops:
        from . import testing_ops  # noqa: F401  (registers test-only ops)


def load_op_modules(names: tuple[str, ...] | list[str]) -> None:
    """Import operator-supplied modules by dotted name (from settings, never from the wire), then check their ops.

    An op that fails a registration check is removed from the table and the error re-raised,
    so a server never starts with an op whose gradient is broken.
    """
    for name in names:
        before = set(OP_TABLE.names())
        importlib.import_module(name)
        for op_name in sorted(set(OP_TABLE.names()) - before):
            try:
                check_entry(OP_TABLE.get(op_name))
            except OpRegistrationError:
                OP_TABLE.remove(op_name)
                raise

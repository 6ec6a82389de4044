"""What a user Function keeps for its backward in a closure instead of on ``ctx``: torch.compile's form of one.

Dynamo traces a user's ``autograd.Function`` inside a compiled region into ``autograd_function_apply``, whose
runtime is an ``ApplyTemplate`` Function (``torch/_functorch/autograd_function.py``): its forward runs the
traced forward body and keeps the tensors the body saves in ``saved_values``, a variable its backward closes
over, not ``ctx.save_for_backward``. Recorded as any Function (``_user_functions.attach``), its backward read
tensors it was not given. ``closure_saved`` finds that variable's cell; ``bound`` puts the recording's
handles in it while the backward records, and the forward's tensors back after.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

_CELL = "saved_values"  # the name torch's ApplyTemplate closes over


def closure_saved(backward: Any) -> tuple[Any, list] | None:
    """The cell of torch.compile's ``saved_values`` in ``backward``'s closure, with its list; None for any
    other backward (a user's own keeps what it saves on ``ctx``)."""
    code, cells = getattr(backward, "__code__", None), getattr(backward, "__closure__", None)
    if code is None or not cells or _CELL not in code.co_freevars:
        return None
    if getattr(backward, "__qualname__", "") != "AutogradFunctionApply.__call__.<locals>.ApplyTemplate.backward":
        return None
    cell = cells[code.co_freevars.index(_CELL)]
    values = cell.cell_contents
    return (cell, list(values)) if isinstance(values, (list, tuple)) else None


@contextlib.contextmanager
def bound(closure: tuple[Any, list, dict] | None, handles: list) -> Iterator[None]:
    """``closure`` (its cell, its values, and for each remote value the index of its handle) holding the
    handles instead of the remote values while the body runs."""
    if closure is None:
        yield
        return
    cell, values, index = closure
    cell.cell_contents = [handles[index[k]] if k in index else v for k, v in enumerate(values)]
    try:
        yield
    finally:
        cell.cell_contents = values

"""``replayable_call``: whether a call step's result follows from its arguments alone, so that a capture
may run it without the runner's step handler. One rule for the server's captures: the CUDA graph of
a repeated program (``graph_signature``) and a template's compiled form (``template_graph``).

A call fits when its entry is ``capturable`` (torch's own op whose output shapes follow from the
layouts, or one of our own whose values are torch's from the arguments alone: a factory; ``getitem``
by a basic index), drawing no random number (or, a dropout of probability 0, drawing nothing:
``ops._native.draws_nothing``), without autocast, ``out=`` or ``out_many``, and not an in-place op
that changes its target's layout (its entry's ``relayout``). Whether the entry's own
argument contract (``OpEntry.check``) may run elsewhere is each capture's to say.
"""

from __future__ import annotations

from typing import Any

from remote_autograd.proto.messages import CallStep

from ..ops._native import draws_nothing
from ..ops._registry import Resolved


def replayable_call(found: Resolved, step: CallStep, args: list, kwargs: dict) -> bool:
    """Whether call ``step`` (``found`` what its name resolved to; ``args``, ``kwargs`` as the wire gives
    them or resolved: the numbers are the same) fits a capture."""
    entry = found.entry
    # getitem is ours (it reads our wire form of an index) and data-dependent for a tensor index
    # (a mask's True count); by ints, slices and None it is torch's own view
    basic_index = entry.name == "getitem" and not names_a_tensor(step.args[1:])
    deterministic = entry.exact or draws_nothing(step.op, args, kwargs)
    return not ((not entry.capturable and not basic_index)
                or not deterministic or step.autocast is not None or step.out_many
                or (step.kwargs and "out" in step.kwargs)
                or (found.inplace and entry.relayout))


def names_a_tensor(wire: Any) -> bool:
    """Whether a wire value names a tensor (``{ref}``, ``{grad_of}``) anywhere inside it."""
    if type(wire) is dict:
        return "ref" in wire or "grad_of" in wire or any(names_a_tensor(v) for v in wire.values())
    if type(wire) is list:
        return any(names_a_tensor(w) for w in wire)
    return False

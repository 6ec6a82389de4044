"""``torch.autograd.detect_anomaly()`` for one program's backward, without torch's switch.

torch's anomaly mode is process-global (``torch.is_anomaly_enabled`` answers the same on every
thread), and the server runs many sessions' programs at once: it is never switched on here. What
it changes in a result is in the backward: a node whose gradient holds a NaN raises "Function
'SqrtBackward0' returned nan values in its 0th output." (with ``check_nan``, its default) where
without it the NaN flows into ``.grad``. So a backward or grad step sent with ``detect_anomaly``
runs with a hook before and after every node of its graph (``detecting``): the one after checks
the node's gradients where torch's engine checks them, and raises torch's words; the one before
remembers the node that runs, so that a failure of any node (torch's "modified by an inplace
operation" too) names the call that made it.

torch names that call by the forward's traceback, which it records while anomaly mode is on. Here
the call steps of a program sent with ``detect_anomaly`` mark the nodes they make with their step
(``Forwards``), and the error answer carries it (``error.forward``: program, step, op), which the
SDK turns into the user's line. A node made by a program sent without it is named by nothing, as
torch names a node made outside anomaly mode.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from remote_autograd.proto import ErrorCode, ProtocolError

from .autograd_graph import ACCUMULATE_GRAD, graph_nodes

_MADE_BY = "remote_autograd_step"  # the key of a node's metadata that says which step made it


class Forwards:
    """A program's call steps marking the autograd nodes they make (``ProgramRun.forward``)."""

    __slots__ = ("program",)

    def __init__(self, program: str) -> None:
        self.program = program

    def record(self, index: int, op: str, outputs: Any, inputs: list) -> None:
        """The nodes between ``outputs`` and the step's ``inputs`` are the step's own (a composite
        op makes several); an in-place step's target (``inputs`` empty) gets its new node only."""
        made_by = {"program": self.program, "step": index, "op": op}
        before = {t.grad_fn for t in _tensors(inputs)}
        stack = [t.grad_fn for t in _tensors(outputs)]
        while stack:
            node = stack.pop()
            if node is None or node in before or type(node) is ACCUMULATE_GRAD or _MADE_BY in node.metadata:
                continue
            node.metadata[_MADE_BY] = made_by
            if inputs:
                stack.extend(n for n, _ in node.next_functions)


@contextlib.contextmanager
def detecting(roots: list[torch.Tensor], check_nan: bool) -> Iterator[None]:
    """The backward inside runs as under ``torch.autograd.detect_anomaly(check_nan=check_nan)``."""
    running: list = [None]
    handles = []
    try:
        for node in graph_nodes(roots):
            handles.append(node.register_prehook(_note(running, node)))
            if check_nan:
                handles.append(node.register_hook(_no_nan(node)))
        yield
    except (RuntimeError, ValueError, TypeError) as exc:
        node = running[0]
        made_by = node.metadata.get(_MADE_BY) if node is not None else None
        if made_by is None:
            raise
        forward = {**made_by, "node": node.name()}
        raise ProtocolError(ErrorCode.OP_ERROR, str(exc).strip()[:2000], forward=forward) from None
    finally:
        for handle in handles:
            handle.remove()


def _note(running: list, node):
    def hook(grad_outputs):
        running[0] = node
    return hook


def _no_nan(node):
    def hook(grad_inputs, grad_outputs):  # the node's results, checked as torch's engine checks them
        for i, grad in enumerate(grad_inputs):
            if grad is not None and torch.isnan(grad)._is_any_true().item():
                raise RuntimeError(f"Function '{node.name()}' returned nan values in its {i}th output.")
    return hook


def _tensors(values: Any) -> list[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        return [values]
    found = []
    for v in values if isinstance(values, (list, tuple)) else ():
        found.extend(_tensors(v))
    return found

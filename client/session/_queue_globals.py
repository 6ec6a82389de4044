"""The client's torch settings a program carries to the server (``proto/torch_globals.py``).

torch keeps them per process, and a program runs where they are the server's, so each program says
the client's. Each is read where that is cheapest and still exact:

- the default dtype, at every op: ``call_op`` reads it anyway (the meta memo's key: the outputs'
  dtypes are inferred under it), and a change flushes the queue first
  (``SessionCore.globals_changed``), so a program has one, the one its steps were inferred under;
- the others (deterministic algorithms, the float32 precision, cuDNN's flags), when the queue gets its
  first op and when it is sent, which costs nothing per op. A change between the two fails the queued
  steps loudly, since which of them came before it is not known; one switched and back while steps
  are queued is not seen (``docs/known-differences.md``);
- anomaly detection, at each backward and grad (``detect_anomaly`` on the step): that is where torch
  checks for NaNs, and ``with torch.autograd.detect_anomaly(): loss.backward()`` is often left before
  the program is sent. A program with such a step, or sent under anomaly detection, is sent with
  ``detect_anomaly``: its calls mark the nodes they make, and the user's lines of its steps are kept
  (for the last few such programs) to name the forward call of a failing node as torch does.
"""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict

import torch

from remote_autograd.proto import torch_globals

from ..transport._errors import RemoteError
from ._callsite import user_line

_KEPT_PROGRAMS = 64  # programs sent with detect_anomaly whose steps' lines are kept (an eager session: one an op)
_ANOMALY, _CHECK_NAN = torch.is_anomaly_enabled, torch.is_anomaly_check_nan_enabled


class QueueGlobals:
    """A session's queue's view of torch's settings: ``flags`` when its first op came (``None``: no op
    queued; ``SessionCore.globals_changed`` reads them), whether a backward was queued under anomaly
    detection, and the lines kept."""

    __slots__ = ("flags", "anomaly", "lines")

    def __init__(self) -> None:
        self.flags: tuple | None = None
        self.anomaly = False
        self.lines: OrderedDict[str, list] = OrderedDict()

    def autograd_fields(self) -> dict:
        """A backward or grad step's fields that make it run under anomaly detection as torch's would now."""
        if not _ANOMALY():
            return {}
        self.anomaly = True
        return {"detect_anomaly": True} if _CHECK_NAN() else {"detect_anomaly": True, "check_nan": False}

    def fields(self, dtype: torch.dtype, program_id: str, origins: list) -> dict:
        """The program's ``torch_globals`` and ``detect_anomaly`` (only those not at their defaults);
        ``RemoteError`` when a setting changed while its steps (``origins``) were queued."""
        before, self.flags = self.flags, None
        anomaly, self.anomaly = self.anomaly or _ANOMALY(), False
        try:
            flags = torch_globals.read_flags()
        except RuntimeError as exc:  # torch cannot say them as the wire does: the steps fail, saying so
            raise RemoteError(str(exc), code="globals_unreadable") from None
        if flags != before:
            first = next((o.where for o in origins if o is not None and o.where), "the first queued step")
            names = ", ".join(torch_globals.changed((dtype, *before), (dtype, *flags)))
            raise RemoteError(
                f"{names} changed while steps were queued for the server (from {first} on): they are sent as one "
                "program, which runs under one setting, and which of them came before the change is not known. "
                "These steps did not run: call sess.sync() before changing it", code="globals_changed")
        fields: dict = {}
        wire = torch_globals.to_wire((dtype, *flags))
        if wire is not None:
            fields["torch_globals"] = wire
        if anomaly:
            fields["detect_anomaly"] = True
            self.lines[program_id] = [o.where if o is not None else None for o in origins]
            while len(self.lines) > _KEPT_PROGRAMS:
                self.lines.popitem(last=False)
        return fields

    def name_forward(self, error: RemoteError, forward: dict) -> None:
        """A backward under anomaly detection failed in a node made by ``forward`` (program, step, op, node):
        torch's warning naming the forward call, and the same in the error."""
        lines = self.lines.get(forward.get("program"))
        step = forward.get("step")
        line = lines[step] if lines is not None and isinstance(step, int) and 0 <= step < len(lines) else None
        call = f"{forward.get('op')} at {line}" if line else f"{forward.get('op')} (step {step} of program " \
                                                             f"{forward.get('program')})"
        node = forward.get("node", "a node")
        here = user_line(sys._getframe()) or "<unknown>:0"  # torch warns at the user's line too
        filename, _, lineno = here.rpartition(":")
        warnings.warn_explicit(f"Error detected in {node}. Traceback of forward call that caused the error:\n  {call}",
                               UserWarning, filename, int(lineno))
        error.args = (f"{error.args[0]} (anomaly detection: {node} was made by the forward call {call})",)

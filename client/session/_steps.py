"""What the core's queue is made of, below it: the one builder of a step, from ``proto/messages``' step types
(``make_step(CallStep, op=..., args=...)``); a queued step's ``Origin`` and the user's line it names
(``where``, ``op_where``); and torch's settings a program carries (``QueueGlobals``). One module, as every queued step
passes through all three: its walk enters one file for them, not three.

Steps.

A step goes on the wire as a dict: ``{"kind": <the type's kind>, **fields}``, its fields in the order
given and only those given (a field left out takes its default on the server). The kind is read from
the message type, never spelled by hand, and a field the type lacks raises ``TypeError`` at the line
that builds the step (not in the server's validation of the whole program, far from it). ``OMIT``
leaves a field out, so that a step whose optional fields depend on the call is still built in one
expression. Values are not validated here: the server validates every program it is sent
(``proto.messages.validate_program``), and a pydantic model per op would cost more than the op's
whole path on the client.

The user's line: ``where()`` is the plain path, ``op_where()`` its speed path for ops (``call_op``'s).
Plain path: walk from the call up through torch's frames and ours to the first frame of the user's; for every op of an optimizer's step or of ``clip_grad_norm_`` that is a dozen
frames (the optimizer, its wrappers, torch's dynamo guards), each made into a frame object as it is
read. Speed path: remember the torch frame that called the last op and the line found above it. While
that same frame object is the one calling again, it has been running all along, so every frame above
it is still suspended in the same call and the user's line is the same: the answer is one identity
check. A frame that can be suspended and resumed from another caller (a generator or coroutine) is
never remembered. The frame is held (with its locals) until another frame replaces it or the session
sends its queue (``SessionCore.flush`` empties ``HELD``), so that a tensor dropped in between is still
freed in the same program (which is why only ops use it: a frame of torch's that called anything else,
``Tensor.backward``'s, would hold its tensors past their last use). ``verifying()`` walks the plain path
beside every remembered answer.

torch's settings a program carries (``proto/torch_globals.py``): torch keeps them per process, and a
program runs where they are the server's, so each program says the client's. Each is read where that
is cheapest and still exact:

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

import contextlib
import inspect
import os
import sys
import typing
import warnings
from collections import OrderedDict
from typing import Any, Callable, Iterator

import torch

from remote_autograd.proto import messages, torch_globals

from ..transport._errors import RemoteError


class _Omit:
    """A field left out of the step (the server takes its default)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()

# the types of Step (a program's) and TemplateBodyStep (a template's, functorch's among them): the unions inside
_STEP_TYPES = {m for union in (messages.Step, messages.TemplateBodyStep)
               for m in typing.get_args(typing.get_args(union)[0])}
# message type -> (its kind, its other fields)
_SHAPES = {m: (typing.get_args(m.model_fields["kind"].annotation)[0], frozenset(m.model_fields) - {"kind"})
           for m in _STEP_TYPES}


def make_step(message: type, /, **fields: Any) -> dict:
    """The step ``message`` with ``fields`` (``OMIT``: a field left out), as the wire carries it."""
    kind, known = _SHAPES[message]
    made = {"kind": kind}
    for name, value in fields.items():  # a loop, not a comprehension: no frame of its own per step
        if value is OMIT:
            continue
        if name not in known:
            raise TypeError(f"{message.__name__} has no field {name!r}")
        made[name] = value
    return made


class Origin:
    """Where a queued step came from, what it makes, and how to undo local predictions."""

    __slots__ = ("op", "where", "outputs", "undo", "on_result")

    def __init__(self, op: str, where: str | None, outputs: list | tuple = (),
                 undo: Callable[[], None] | None = None, on_result: Callable[[Any], None] | None = None) -> None:
        self.op, self.where = op, where
        self.outputs = outputs  # weakrefs to RemoteTensors this step creates
        self.undo = undo
        self.on_result = on_result  # corrects local predictions from the step's result


# -- the user's line (see the docstring) ------------------------------------------------------------

USER, OURS, TORCHS = 0, 1, 2  # whose code a frame runs (``frame_kind``)


_CLIENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # client/, not client/session/
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# [torch's frame that called the last op, the user's line above it]: the speed path's memory (see the docstring)
HELD: list = [None, None]
_checking = False


def op_where() -> str | None:
    """What ``where()`` answers for an op's call, remembered per calling torch frame (the docstring): ``call_op``'s,
    whose ops an optimizer's step calls from one torch frame each."""
    f = sys._getframe(2)
    first = None  # the first of torch's frames met that cannot be resumed elsewhere: remembered
    while f is not None:
        code = f.f_code
        known = _KIND_OF_CODE.get(id(code))  # frame_kind's cache, read here: no call per frame walked
        kind = known[1] if known is not None else frame_kind(code)
        if kind == USER:
            line = f"{code.co_filename}:{f.f_lineno}"
            if first is not None:
                HELD[0], HELD[1] = first, line
            return line
        if f is HELD[0]:  # running all along since it called the last op: the same user's line above it
            line = HELD[1]
            if _checking:
                _check(line, where(f))
            if first is not None:
                HELD[0] = first
            return line
        if first is None and kind == TORCHS and not code.co_flags & _RESUMABLE:
            first = f
        f = f.f_back
    if first is not None:
        HELD[0], HELD[1] = first, None
    return None


@contextlib.contextmanager
def verifying() -> Iterator[None]:
    """Every remembered answer is also walked for (the plain path); a difference raises ``AssertionError``."""
    global _checking
    before, _checking = _checking, True
    try:
        yield
    finally:
        _checking = before


def _check(kept: str | None, walked: str | None) -> None:
    if kept != walked:
        raise AssertionError(f"caller memo: {kept} remembered, {walked} walked")


def where(f=None) -> str | None:
    """``file:line`` of the user's code that made the current call: the first frame that runs neither torch's
    code nor ours, from the caller's caller up (from ``f`` up, given one). The plain walk (``op_where``
    remembers its answer)."""
    if f is None:
        f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        known = _KIND_OF_CODE.get(id(code))  # frame_kind's cache, read here: no call per frame walked
        if (known[1] if known is not None else frame_kind(code)) == USER:
            return f"{code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return None


def frame_kind(code) -> int:
    """``USER``, ``OURS`` or ``TORCHS``: whose code ``code`` is."""
    # Keyed by id: a code object's own hash reads its whole body each time (big torch functions).
    known = _KIND_OF_CODE.get(id(code))
    if known is None:  # once per code object: optimizer steps walk a dozen torch frames per op
        if len(_KIND_OF_CODE) > 50_000:
            _KIND_OF_CODE.clear()
        name = code.co_filename
        kind = OURS if name.startswith(_CLIENT_DIR) else TORCHS if name.startswith(_TORCH_DIR) else USER
        known = _KIND_OF_CODE[id(code)] = (code, kind)
    return known[1]


# id(code) -> (code, whose it is); the code is kept so that its id is not reused
_KIND_OF_CODE: dict[int, tuple] = {}


# -- torch's settings a program carries (see the docstring) ----------------------------------------

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
        """A backward or grad step's fields that make it run under anomaly detection, as torch's does now
        (``SessionCore.autograd_fields`` asks only then)."""
        self.anomaly = True
        return {"detect_anomaly": True} if _CHECK_NAN() else {"detect_anomaly": True, "check_nan": False}

    def fields(self, dtype: torch.dtype, program_id: str, origins: list) -> dict:
        """The program's ``torch_globals`` and ``detect_anomaly`` (only those not at their defaults);
        ``RemoteError`` when a setting changed while its steps (``origins``) were queued."""
        before, self.flags = self.flags, None
        anomaly, self.anomaly = self.anomaly or _ANOMALY(), False
        try:
            flags = torch_globals.read()[1:]
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
        state = (dtype, *flags)
        if state != torch_globals.DEFAULT:  # to_wire's own first test, here: no call for torch's defaults
            fields["torch_globals"] = torch_globals.to_wire(state)
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
        here = where(sys._getframe()) or "<unknown>:0"  # torch warns at the user's line too
        filename, _, lineno = here.rpartition(":")
        warnings.warn_explicit(f"Error detected in {node}. Traceback of forward call that caused the error:\n  {call}",
                               UserWarning, filename, int(lineno))
        error.args = (f"{error.args[0]} (anomaly detection: {node} was made by the forward call {call})",)

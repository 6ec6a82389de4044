"""Running ahead: a program answered once the values its client waits for are known, its other steps run after.

A compiled training step's program ends ``run_template`` (the forward), ``clear_grads``, ``backward``,
``run_template`` (the optimizer), ``call detach``, ``fetch``, ``free``: the client waits for the fetched loss
alone, which the forward made. A program sent with ``answer_early`` lets the server answer sooner: the
fetches at its end (and the ``detach`` calls they read) run right after the steps before those steps that
cannot change what they read (``split``), the answer goes, and the steps passed over run after it
(``settle``), while the client runs its next step's Python. So the client's Python and the server's
backward and optimizer run at once, as torch's CUDA kernels run while Python queues the next ones, and a
training loop's step costs the longer of the two rather than their sum.

The plain path it stands in for is running the steps in order and answering at the end (a program without
``answer_early``, and any program ``split`` finds no place in). ``tests/service/engine/test_run_ahead.py``
checks both give the same values, grads and parameters, and that what may not move does not.

What may be passed over (the *middle*, between the steps whose outputs the fetches read and the fetches):
only steps that cannot write a value a fetch reads. A template run (one the session holds: a template lost in
a restart fails in order, and the client sends it again), a ``backward`` without hooks, captures, a graph of
its own or anomaly detection, ``clear_grads``, and ``set_grad`` to null. A template may write into its
inputs: after the early part ran, ``runs_into`` asks whether any input of the middle's templates shares a
storage with a tensor the fetches read, and if one does the answer waits for the middle and fetches again
(the plain order's values). The fetches read values only (a grad fetch waits for its backward).

What the order changes, and how the client hears of it:

- The answer's ``results`` hold ``null`` for the steps not yet run, and ``pending`` lists their indexes.
- A step run after the answer that fails (or whose result would not be ``null``: a ``backward``'s
  ``no_grad``, which the client could no longer apply) fails the session's next program instead, before
  any of its steps runs: the error of that step, its ``step`` the index in the program it belongs to, named
  by ``error.program``. The steps after it in that program, but for the fetches already answered, did not
  run; as with any failed program, the ones before it stay done. torch's CUDA errors surface at a later
  call the same way.
- Nothing of the session runs between: its next program, and a read of a tensor, run the pending steps
  first (``settle``) if the backend has not run them yet after the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import (
    BackwardStep,
    CallStep,
    ClearGradsStep,
    FetchStep,
    FreeStep,
    Program,
    RunTemplateStep,
    SetGradStep,
)

from ..sessions.storage_ledger import storage_of
from ..sessions.store import ProgramAnswer, Session
from .program_watch import ProgramWatch


@dataclass(frozen=True)
class Split:
    """A program in two: ``early`` (the steps before the middle, then the fetches) and ``late`` (the
    middle, then the frees), and the ids the fetches read. ``middle``, ``fetches`` and ``frees``: where
    each of those begins in the program, ``size`` its length; ``early_at`` and ``late_at``: each part's
    steps' indexes in it."""

    early: Program
    late: Program
    reads: frozenset[str]
    middle: int
    fetches: int
    frees: int
    size: int

    @property
    def early_at(self) -> tuple[int, ...]:
        return (*range(self.middle), *range(self.fetches, self.frees))

    @property
    def late_at(self) -> tuple[int, ...]:
        return (*range(self.middle, self.fetches), *range(self.frees, self.size))


@dataclass
class Pending:
    """The late part of a program answered early, for ``settle`` to run with ``run``."""

    split: Split
    run: Callable[[Program], ProgramAnswer]


def split(program: Program, session: Session) -> Split | None:
    """Where ``program`` may answer early, or None: it ends with fetches of values (and ``detach`` calls for
    them), then frees, and a middle before them that cannot write what they read. Only with
    ``omit_known_meta``: else every step of the middle answers what it made, which the answer could not hold."""
    if not program.omit_known_meta:
        return None
    steps = program.steps
    end = len(steps)
    while end and type(steps[end - 1]) is FreeStep:
        end -= 1
    fetches = end
    while fetches and _fetching(steps[fetches - 1]):
        fetches -= 1
    if fetches == end or not any(type(s) is FetchStep for s in steps[fetches:end]):
        return None
    made_here = {t for s in steps[fetches:end] if type(s) is CallStep for t in s.out}
    reads = {_read(s) for s in steps[fetches:end]} - made_here
    middle = fetches  # back to the step that makes what the fetches read, or one that may not be passed
    while middle and _passable(steps[middle - 1], session) and not reads.intersection(_made(steps[middle - 1])):
        middle -= 1
    if middle == fetches:
        return None
    return Split(
        early=program.model_copy(update={"steps": steps[:middle] + steps[fetches:end]}),
        late=program.model_copy(update={"id": program.id + "/later", "steps": steps[middle:fetches] + steps[end:]}),
        reads=frozenset(reads | made_here), middle=middle, fetches=fetches, frees=end, size=len(steps))


def _fetching(step) -> bool:
    kind = type(step)
    if kind is FetchStep:
        return not step.grad
    return (kind is CallStep and step.op == "detach" and not step.kwargs and not step.out_many
            and len(step.out) == 1 and len(step.args) == 1 and isinstance(step.args[0], dict)
            and step.args[0].keys() == {"ref"} and isinstance(step.args[0]["ref"], str))


def _read(step) -> str:
    return step.id if type(step) is FetchStep else step.args[0]["ref"]


def _made(step) -> list[str]:
    return step.out if type(step) is RunTemplateStep else []


def _passable(step, session: Session) -> bool:
    kind = type(step)
    if kind is RunTemplateStep:
        return step.template in session.templates
    if kind is BackwardStep:
        return not (step.hooks or step.node_hooks or step.module_hooks or step.capture or step.create_graph
                    or step.detect_anomaly)
    return kind is ClearGradsStep or (kind is SetGradStep and step.grad is None)


def runs_into(session: Session, part: Split) -> bool:
    """Whether a template of the middle takes a tensor sharing a storage with one the fetches read (it may
    write into it): then the fetches must wait for the middle. Asked once the early part has run."""
    read = {key for key, _, _ in storage_of(*(ct.value for ct in map(session.tensors.get, part.reads) if ct))}
    for step in part.late.steps:
        if type(step) is RunTemplateStep:
            for value in step.inputs:
                ct = session.tensors.get(value.get("ref")) if isinstance(value, dict) else None
                if ct is not None and storage_of(ct.value)[0][0] in read:
                    return True
    return False


Run = Callable[..., ProgramAnswer]  # the runner's ``run_steps(program, watch=...)``, the session and settings bound


def run(session: Session, program: Program, part: Split, steps: Run, watch: ProgramWatch | None,
        seconds: float) -> ProgramAnswer:
    """``program`` in ``part``'s two parts: the early one now, the late one left for ``settle``; or, when the
    early one failed in its fetches or the middle may write what they read, the middle now too (``_in_order``).
    ``seconds``: the time limit of a part run after the early one (a watch of its own)."""
    early = steps(part.early, watch=watch)

    def late(program: Program) -> ProgramAnswer:
        return steps(program, watch=ProgramWatch(seconds))

    failed_at = early.body["error"]["step"] if early.status != 200 else None
    if failed_at is not None and failed_at < part.middle:  # before the middle: the program's order
        return _failed(early, 0, program.id, early.body["results"])
    if failed_at is None and not runs_into(session, part):
        session.pending = Pending(part, late)
        whole: list = [None] * part.size
        for k, r in zip(part.early_at, early.body["results"]):
            whole[k] = r
        return ProgramAnswer(200, {"id": program.id, "results": whole, "pending": list(part.late_at)}, early.seconds)
    return _in_order(program, part, early, late)


def _in_order(program: Program, part: Split, early: ProgramAnswer, late: Run) -> ProgramAnswer:
    """The answer the program's own order gives, once its early part ran and failed in its fetches or read
    what the middle may write: the middle runs now; then the failed fetch fails at its place in the program,
    or the fetches run again (the ``detach`` calls made views, which show what the middle wrote) and the frees."""
    steps, results = program.steps, early.body["results"]
    middle = late(program.model_copy(update={"steps": steps[part.middle:part.fetches]}))
    done = results[:part.middle] + middle.body["results"]
    if middle.status != 200:
        return _failed(middle, part.middle, program.id, done)
    if early.status != 200:  # a step of the fetches failed, at its index in the early part
        return _failed(early, part.fetches - part.middle, program.id, done + results[part.middle:])
    again = [k for k in range(part.fetches, part.frees) if type(steps[k]) is FetchStep] + \
        list(range(part.frees, len(steps)))
    rest = late(program.model_copy(update={"steps": [steps[k] for k in again]}))
    whole = done + results[part.middle:] + [None] * (len(steps) - part.frees)
    for k, r in zip(again, rest.body["results"]):
        whole[k] = r
    if rest.status != 200:
        at = rest.body["error"]["step"]
        return _failed(rest, again[at] - at, program.id, whole)
    return ProgramAnswer(200, {"id": program.id, "results": whole}, early.seconds + middle.seconds + rest.seconds)


def _failed(outcome: ProgramAnswer, by: int, program_id: str, results: list) -> ProgramAnswer:
    """A failed part's answer as the program's: its step's index moved ``by``, the ``results`` before it."""
    error = {**outcome.body["error"], "step": outcome.body["error"]["step"] + by}
    return ProgramAnswer(outcome.status, {"id": program_id, "error": error, "results": results[:error["step"]]},
                         outcome.seconds)


def late_failure(part: Split, late: ProgramAnswer, program_id: str) -> dict | None:
    """What the pending steps' run leaves for the next program: the error of the one that failed (or of the
    first whose result is not null), at its index in ``program_id``; None when all ran as promised."""
    if late.status != 200:
        error = dict(late.body["error"])
        k = error.get("step")
        error["step"] = part.late_at[k] if k is not None else part.late_at[0]
        return {**error, "program": program_id}
    for k, r in enumerate(late.body["results"]):
        if r is not None:
            step = part.late.steps[k]
            return {"code": ErrorCode.OP_ERROR.value, "program": program_id, "step": part.late_at[k],
                    "op": step.kind, "message": f"{step.kind} ran after its program was answered and answered "
                    f"{r!r}, which the client could no longer apply: send this step without answer_early"}
    return None


def failed_before(session: Session, program_id: str) -> ProgramAnswer:
    """The answer of a program that finds an earlier one's pending step failed: that error, nothing run."""
    error, session.late_failure = session.late_failure, None
    status = ProtocolError(ErrorCode(error["code"]), "").status
    return ProgramAnswer(status, {"id": program_id, "error": error, "results": []})


def settle(session: Session) -> None:
    """Run the steps a program answered early left (the caller holds the session's lock)."""
    pending = session.pending
    if pending is None:
        return
    session.pending = None
    outcome = pending.run(pending.split.late)
    session.late_failure = late_failure(pending.split, outcome, pending.split.early.id)

"""``run_program``: a program's steps run in order against one session, under its client's torch settings.

Each step is atomic: it computes everything first and commits (stores outputs,
writes in place, accumulates grads) only at its end, so a failing step leaves
no trace while earlier steps stay done, as in eager torch.

The program's frame (the retry memory, its turn of the process-global torch settings, the context its
ops read, the checker chosen for its calls) and the loop over its steps with the handlers of the steps
every program has (``call``, ``fetch``, ``free``) are here, in one module past the usual size: the walk
of one op goes through each at every program or step. Any other step kind's handler is in
``step_kinds`` (a call's in-place run too), ``autograd_steps``, ``templates``, ``user_functions``...

A feature not in use costs the loop a test, not a call: the watch (``ProgramWatch``), the histogram
of step times (``StepHistogram.pending``), checkpoint regions, a plan (``program_plan``) are asked
only when there is one.

``TURNS`` (``GlobalsTurns``): each program runs under its client's process-global torch settings
(``Program.torch_globals``). torch keeps the default dtype, deterministic algorithms, the float32 matmul
precision and cuDNN's flags per process (``proto/torch_globals.py``), and the server runs many
sessions' programs at once on its worker threads: setting them around one program would change them
under the others. So programs take *turns*: those that ask for the state the process holds run
together; one that asks for another waits until the running ones are done, and once one waits, later
programs queue behind it (none waits for ever). Then the state is switched for it and for every waiting
program that asks for the same, and switched back once the last of them is done. A server whose clients
keep torch's defaults never switches: each program takes and gives back one uncontended lock, and reads
the process's state when it is the only one running (nothing per step). Reading it then, not once at
start, keeps the app exact inside a client's own process (``InProcessTransport``), whose user may change
the settings between programs: their own are what a switch gives back. The meta check's memo answers by
the state it ran under (an integer tensor's ``sqrt`` holds 4 or 8 bytes an element): each state has its
own (``meta_check.use_memo``), and a session's plans are keyed by the state too.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import deque
from time import perf_counter
from typing import Any, Callable

import torch

from remote_autograd.proto import ErrorCode, ProtocolError, torch_globals
from remote_autograd.proto.messages import (
    BackwardStep,
    CallStep,
    CheckpointEndStep,
    CheckpointStep,
    ClearGradsStep,
    FetchStep,
    FreeStep,
    FunctionStep,
    GradStep,
    LoadStep,
    Program,
    PutStep,
    RetainGradStep,
    RunTemplateStep,
    SetGradStep,
    SetRequiresGradStep,
    TemplateStep,
)

from .. import ops as _ops
from ..ops._context import CURRENT
from ..sessions.store import CustomTensor, ProgramAnswer, Session, check_open
from ..settings import Settings
from ..step_histogram import FOLD_AT, StepHistogram
from . import checkpoint_regions, functorch_regions, graph_steps, meta_check, program_plan, run_ahead, speed_caches
from . import templates
from . import user_functions
from .anomaly import Forwards
from .answers import keepable, reencode, tensor_message
from .autocast import autocast_dtype, run_autocast
from .autograd_steps import backward_step, grad_step
from .error_text import scrubbed
from .kept_storages import keeps_storages
from .load_step import load_step
from .meta_check import Needs
from .program_plan import PLAIN
from .program_watch import ProgramWatch
from .step_cost import UNTIMED_SECONDS, hold
from .step_kinds import (apply, clear_grads, grad_mode, put, remeasure, retain_grad, run_inplace, set_grad,
                         set_requires_grad)
from .values import (ProgramRun, check_elements, check_new_ids, counting_saved, meta_message, resolve_args,
                     resolve_kwargs, store_made)

log = logging.getLogger("remote_autograd.service.engine.runner")
OP_TABLE = _ops.OP_TABLE


def run_program(session: Session, program: Program, body: bytes, as_json: bool, settings: Settings, *,
                observe: StepHistogram | None = None, watch: ProgramWatch | None = None) -> ProgramAnswer:
    """Run ``program`` under the session's lock; a retried program id gets its first answer.

    The retry memory lives here, not in the store: a program id seen before gets its first answer
    (re-encoded if the client now asks in the other encoding), the same id with other content is a 409.

    ``body`` is what identifies the program's content (for a framed body, its header);
    ``watch`` stops the program between steps (time limit, client gone).
    """
    digest = hashlib.blake2b(body, digest_size=16).digest()
    with session.lock:
        if session.closed:  # deleted or expired while the program waited for it
            check_open(session)
        session.last_used = time.monotonic()
        cached = session.programs.get(program.id)
        if cached is not None:
            if cached[0] != digest:
                raise ProtocolError(
                    ErrorCode.CONFLICT, f"program id {program.id!r} was already used for a different program"
                )
            return cached[1] if cached[2] == as_json else reencode(cached[1], as_json)
        if session.pending is not None:  # what a program answered early left, if the backend has not run it yet
            run_ahead.settle(session)
        outcome = None if session.late_failure is None else run_ahead.failed_before(session, program.id)
        if outcome is None:
            part = run_ahead.split(program, session) if program.answer_early and _may_run_ahead(session, settings) \
                else None
            if part is None:
                outcome = run_steps(session, program, settings, as_json=as_json, observe=observe, watch=watch)
            else:
                outcome = run_ahead.run(session, program, part, functools.partial(
                    run_steps, session, settings=settings, as_json=as_json, observe=observe), watch,
                    settings.max_program_seconds)
        session.programs[program.id] = (digest, keepable(outcome, program.id), as_json)
        while len(session.programs) > settings.program_cache_size:
            session.programs.popitem(last=False)
        session.last_used = time.monotonic()
        return outcome


def run_pending(session: Session) -> None:
    """The steps a program answered early left (``run_ahead``), under the session's lock: a backend runs
    them once the answer is out; a program or read that comes first runs them itself."""
    with session.lock:
        if not session.closed:
            run_ahead.settle(session)


def _may_run_ahead(session: Session, settings: Settings) -> bool:
    # (a checkpoint region open, or CUDA-graph capture: each keeps its own order of steps, and runs in order)
    return not session.checkpoints and settings.cuda_graphs == "off"


def read_tensor(session: Session, tid: str, *, value: bool, grad: bool, as_json: bool) -> dict:
    """One tensor's message, read under the session's lock."""
    with session.lock:
        check_open(session)
        if session.pending is not None:
            run_ahead.settle(session)
        # copies, never views: the answer is sent after the lock is released, while programs may run
        return tensor_message(tid, session.tensor(tid), value=value, grad=grad, as_json=as_json, views=False)


def run_steps(session: Session, program: Program, settings: Settings, *, as_json: bool = False,
              observe: StepHistogram | None = None, watch: ProgramWatch | None = None) -> ProgramAnswer:
    """Run every step or stop at the first failure; the caller holds the session lock.

    The limits a body claims (its step count, its put steps' shapes) were checked when it was
    admitted (``guards.check_limits``, on every path a program takes); the limits of what steps
    make (outputs, tensors and bytes held) are checked here, step by step.
    ``observe`` (the metrics' histogram) is told how long each step that succeeded took.
    ``watch`` is asked before each step whether the program must stop there (its time limit, its
    client gone): the stop is that step's failure, the steps before it stay done.
    """
    # ``untimed``: the FLOPs up to which ``step_cost.hold`` passes any call (within the budget, and too
    # short to ask the clock): the runner asks ``hold`` only about calls over it (most calls are far below)
    run = ProgramRun(session, settings, as_json, omit_known_meta=program.omit_known_meta, watch=watch,
                     untimed=min(settings.max_step_flops, settings.device_flops_per_second * UNTIMED_SECONDS))
    if program.detect_anomaly:
        run.forward = Forwards(program.id)
    wire = program.torch_globals
    state = torch_globals.DEFAULT if wire is None else torch_globals.from_wire(wire)
    default = state is torch_globals.DEFAULT  # torch's defaults, as almost every program's
    run.torch_state = None if default else state
    if settings.replay == "on":  # plans answer by what the memo answered under the program's state
        run.check = program_plan.for_program(session, program.steps, run.torch_state)
    steps = StepLoop(run, program, observe, watch)
    TURNS.enter(state)  # the process-global torch settings the client had
    token = CURRENT.set(run)  # what the ops read: the session's generator and device (``ops._context``)
    if watch is not None and watch.started is None:
        watch.started = perf_counter()  # its clock starts with the steps
    try:
        # what the graph saves counts too, but inside a checkpointed function's region (checkpoint_regions)
        regions = session.checkpoints  # the regions open (most often none), as the steps open and close them
        with counting_saved(session, settings.max_session_bytes):
            if regions:
                checkpoint_regions.resume(regions)
            try:
                # a replay runs no call step: none is marked for anomaly detection, nor recorded by a region
                graphs = ((session.caches or speed_caches.of(session)).graphs if settings.cuda_graphs != "off"
                          and default and run.forward is None and not regions else None)
                if graphs is None or not graph_steps.run(graphs, steps, settings.cuda_graphs):
                    steps.execute(0, len(program.steps))
            finally:
                if regions:
                    checkpoint_regions.suspend(regions)
    finally:
        CURRENT.reset(token)
        TURNS.leave()
        if watch is not None:
            watch.finished = True  # off its thread now, even if whoever waited for it stopped waiting
        if observe is not None and len(observe.pending) >= FOLD_AT:
            observe.fold()  # the step times waiting, counted (a scrape folds them too)
    if steps.failed is not None:
        return steps.failed
    if run.check is not PLAIN:
        run.check.finish()
    return ProgramAnswer(200, {"id": program.id, "results": steps.results}, perf_counter() - steps.began)


class StepLoop:
    """A program's steps run in order, from any step to any other: all at once on the plain path,
    in two parts around a capture (``graph_steps``). ``failed``: the outcome of the step that failed
    (the loop stops there), ``results``: each step's result so far."""

    __slots__ = ("run", "program", "observe", "watch", "results", "failed", "views_from", "began", "staged", "made")

    def __init__(self, run: ProgramRun, program: Program, observe, watch) -> None:
        self.run, self.program, self.observe, self.watch = run, program, observe, watch
        self.results: list[Any] = []
        self.failed: ProgramAnswer | None = None
        # the index after the program's last step that may write to a tensor (neither a fetch nor a free):
        # fetches from there on may answer with views of the tensors' bytes (``ProgramRun.views``)
        self.views_from = 0
        for index in range(len(program.steps) - 1, -1, -1):  # most programs end with their fetches: a short walk
            if not isinstance(program.steps[index], (FetchStep, FreeStep)):
                self.views_from = index + 1
                break
        self.began = perf_counter()
        # a capture (graph_steps): put values decoded before it began, by step; each call's stored outputs
        self.staged: dict[int, torch.Tensor] | None = None
        self.made: dict[int, tuple] | None = None

    def execute(self, start: int, stop: int) -> bool:
        """Steps ``start`` to ``stop`` (not included); False, with ``failed`` set, at the first failure."""
        run, results, watch = self.run, self.results, self.watch
        pending = None if self.observe is None else self.observe.pending  # (op, seconds) of each step that ran
        storages = run.session.storages
        regions = run.session.checkpoints  # the checkpoint regions open (checkpoint_regions): most often none
        steps = self.program.steps
        for index in range(start, stop):
            step = steps[index]
            if index == self.views_from:
                run.views = True
            began = perf_counter()
            kind = type(step)
            name = step.op if kind is CallStep else step.kind
            try:
                if watch is not None:
                    watch.index, watch.op = index, name  # (only the step's name: it may hold a big body's bytes)
                    if watch.cancelled or began - watch.started > watch.seconds:
                        watch.check(index, step)  # the program stops here: its error
                if regions:
                    checkpoint_regions.admit(regions, step, run.settings.max_steps_per_program)
                if kind is CallStep:
                    results.append(_call(run, step, index))
                    if self.made is not None and step.out:
                        self.made[index] = tuple(run.session.tensors[t].value for t in step.out)
                else:
                    staged = self.staged
                    results.append(put(run, step, staged[index]) if staged is not None and kind is PutStep
                                   else _HANDLERS[kind](run, step))
                    if run.check is not PLAIN:
                        run.check.other(step)
                if regions:
                    checkpoint_regions.record(regions, step, run.session, run.settings.max_session_bytes)
            except Exception as exc:  # every failure becomes data: see _as_protocol_error
                err = _as_protocol_error(exc, index, name)
                # the traceback holds this frame, which holds err: a cycle only the garbage collector
                # breaks, keeping the failed step's tensors and the body (a refused 16 MiB put: 48 MiB each)
                exc.__traceback__ = err.__traceback__ = exc.__context__ = None
                self.failed = ProgramAnswer(err.status, err.answer(results, self.program.id), perf_counter() - self.began)
                return False
            finally:  # a freed id or a backward let the graph go: its saved tensors' bytes come back
                if storages.dead:
                    storages.settle()
            if pending is not None:
                pending.append((name, perf_counter() - began))  # counted by the histogram's ``fold``
        return True


def _execute(run: ProgramRun, step, index: int) -> Any:
    """One step of a template (``templates.run_plainly``) through the handler of its kind: the time
    limit asked first, a failure raised as a ``ProtocolError``, what the graph let go settled after."""
    if run.watch is not None:
        run.watch.check(index, step)
    try:
        if type(step) is CallStep:
            return _call(run, step, index)
        result = _HANDLERS[type(step)](run, step)
        if run.check is not PLAIN:
            run.check.other(step)
        return result
    except ProtocolError:
        raise
    except Exception as exc:  # as StepLoop.execute: every failure becomes data
        err = _as_protocol_error(exc, index, _step_op(step))
        exc.__traceback__ = exc.__context__ = None
        raise err from None
    finally:
        if run.session.storages.dead:
            run.session.storages.settle()


def _as_protocol_error(exc: Exception, step: int, op: str) -> ProtocolError:
    if isinstance(exc, ProtocolError):
        err = exc
    elif isinstance(exc, (torch.OutOfMemoryError, MemoryError)):  # the device's allocator, or the host's
        err = ProtocolError(ErrorCode.OUT_OF_MEMORY, f"device out of memory in {op}: {_first_line(exc)}")
    elif _host_allocator_refused(exc):  # the host's memory, or a tenant worker's bound (process_guards.limit_data)
        err = ProtocolError(ErrorCode.OUT_OF_MEMORY, f"host memory refused in {op} (a tenant worker holds at most "
                            f"worker_memory_bytes above its start): {_first_line(exc)}")
    elif isinstance(exc, (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError, ZeroDivisionError,
                          OverflowError, AssertionError)):
        err = ProtocolError(ErrorCode.OP_ERROR, _first_line(exc) or type(exc).__name__)
    else:  # a bug of ours, but the client still gets data, never a 500
        log.exception("unexpected error in step %d (%s)", step, op)
        err = ProtocolError(ErrorCode.OP_ERROR, f"{type(exc).__name__}: {_first_line(exc)}")
    err.message = scrubbed(err.message)  # torch's words reach the client, the server's addresses do not
    err.step, err.op = step, op
    return err


def _host_allocator_refused(exc: Exception) -> bool:
    """torch's CPU allocator refusing memory: a plain ``RuntimeError`` (c10's enforce), told by its
    fixed prefix (``c10/core/impl/alloc_cpu.cpp``): it has no type of its own to be told by."""
    return type(exc) is RuntimeError and "DefaultCPUAllocator: " in str(exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text[:2000]


def _step_op(step) -> str:
    return step.op if isinstance(step, CallStep) else step.kind


# -- the steps every program has ----------------------------------------------------------


def _call(run: ProgramRun, step: CallStep, index: int = 0) -> dict | None:
    session = run.session
    # what the name runs: the entry, the callable, whether in place (``OpTable.resolve``, remembered by name)
    call = OP_TABLE.resolved.get(step.op) or OP_TABLE.resolve(step.op)
    if call is None:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {step.op!r}; GET /v1/ops lists the op table")
    entry = call.entry
    args = resolve_args(step.args, session)
    kwargs = resolve_kwargs(step.kwargs, session) if step.kwargs else {}
    out = step.out
    if not call.inplace and not (len(out) == 1 and out[0] not in session.tensors):  # (one new id: the usual)
        check_new_ids(session, out)
    # no kernel sees arguments torch would refuse, and what it will allocate is charged first
    # (by the meta check, or where the program's plan vouches for it, by the plan: ``program_plan``)
    check = run.check
    needs = (meta_check.checked(call, args, kwargs, step.grad_enabled)[0] if check is PLAIN
             else check.check_call(index, step, call, args, kwargs))
    reserved = needs.bytes
    if reserved:
        session.storages.reserve(reserved, run.settings.max_session_bytes)
    try:
        if needs.flops > run.untimed or needs.elements > run.settings.max_tensor_elements:
            _admit(run, step, call.inplace, needs)  # a call that may pass a limit: held before its kernel runs
        run.flops += needs.flops
        if call.inplace:  # never under autocast: the op contract's autocast_applies
            try:
                run_inplace(call, step, args, kwargs)
            finally:  # a kernel that failed midway may have changed a storage too
                if not keeps_storages(call, step):
                    remeasure(session, step)
            if check is not PLAIN:
                check.ran(index, step, call, ())
            if run.forward is not None:
                run.forward.record(index, step.op, args[0], [])
            return None if run.omit_known_meta else {"tensors": []}
        if step.autocast is None and torch.is_grad_enabled() == step.grad_enabled:
            result = call.fn(*args, **kwargs)  # ``apply``, inline: the plain path of most call steps
        elif step.autocast is None:
            result = apply(call.fn, step.grad_enabled, args, kwargs)
        else:
            result = run_autocast(entry, session.device, autocast_dtype(step.autocast),
                                  lambda a, k: apply(call.fn, step.grad_enabled, a, k), args, kwargs)
        if run.forward is not None:
            run.forward.record(index, step.op, result, [*args, *kwargs.values()])
        return _store_outputs(run, step, call, result, args, kwargs, index)  # charged from the reservation
    finally:
        if reserved and session.storages.pool:  # the outputs took less than the meta check reserved
            session.storages.unreserve()  # (a view brings no bytes)


def _admit(run: ProgramRun, step: CallStep, inplace: bool, needs: Needs) -> None:
    """The rest of what the meta check says a call will take, held to the limits before its kernel
    runs: its largest output's elements (an in-place call makes no new tensor) and its work."""
    if needs.elements > run.settings.max_tensor_elements and not inplace:
        check_elements(f"{step.op}'s largest output", needs.elements, run.settings)
    hold(run, step.op, needs.flops)


def _store_outputs(run: ProgramRun, step: CallStep, call, result: Any, args: list, kwargs: dict,
                   index: int) -> dict | None:
    """Keep a call's outputs under the step's ids; their metadata is the step's result (unless
    the client named them all and asked to be spared it: ``omit_known_meta`` without ``out_many``)."""
    session = run.session
    is_tuple = isinstance(result, (tuple, list))
    # optional outputs that are None (attention weights with need_weights=False) get no id: the
    # client knows where they go from the same call on meta
    outputs = tuple(o for o in result if o is not None) if is_tuple else (result,)
    inputs = (*args, *kwargs.values()) if kwargs else args
    if len(outputs) != 1 or any(outputs[0] is a for a in inputs):  # (one new tensor: the usual case)
        outputs = _no_aliases(outputs, inputs, step.grad_enabled)
    ids = step.out
    if step.out_many:
        if len(step.out) != 1:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "out: with out_many, give exactly one id prefix")
        ids = [f"{step.out[0]}.{i}" for i in range(len(outputs))]
        check_new_ids(session, ids)
    if len(outputs) != len(ids):
        raise ProtocolError(ErrorCode.OP_ERROR, f"{step.op} returns {len(outputs)} tensor(s) but out names {len(ids)}")
    store_made(session, run.settings, [(tid, CustomTensor(t)) for tid, t in zip(ids, outputs)])
    if run.check is not PLAIN:
        run.check.ran(index, step, call, ids)
    if run.omit_known_meta and not step.out_many:
        return None
    metas = [meta_message(tid, t) for tid, t in zip(ids, outputs)]
    return {"tensors": metas, "tuple": True} if is_tuple else {"tensors": metas}


def _no_aliases(outputs: tuple, inputs, grad_enabled: bool) -> tuple:
    """Outputs that are an input object itself (``contiguous()``, ``dropout(training=False)``) become views.

    Two ids must never share one tensor object: leaves are found by object identity
    in backward, and the client already treats the result as a new non-leaf. The view is made in
    the step's grad mode, as its op ran (inside a backward, a user Function's template runs with
    grad on where the engine has it off: a view made off would cut the graph there).
    (The caller skips the usual case: one output that is none of the inputs.)
    """
    tensors = {id(a) for a in inputs if isinstance(a, torch.Tensor)}
    if not any(id(o) in tensors for o in outputs):
        return outputs
    with grad_mode(grad_enabled):
        return tuple(o.view_as(o) if id(o) in tensors else o for o in outputs)


def _free(run: ProgramRun, step: FreeStep) -> None:
    tensors = run.session.tensors
    freed = [ct for ct in (tensors.pop(tid, None) for tid in step.ids) if ct is not None]
    if freed:
        # a storage another id, a view or the autograd graph still holds stays counted
        run.session.storages.drop(freed)
    return None


def _fetch(run: ProgramRun, step: FetchStep) -> dict:
    return {"tensor": tensor_message(step.id, run.session.tensor(step.id), value=step.value, grad=step.grad,
                                     as_json=run.as_json, views=run.views)}


_HANDLERS: dict[type, Callable[..., Any]] = {
    PutStep: put,
    CallStep: _call,
    BackwardStep: functools.partial(backward_step, execute=_execute),  # (a partial: no frame of ours between)
    GradStep: functools.partial(grad_step, execute=_execute),
    SetGradStep: set_grad,
    ClearGradsStep: clear_grads,
    SetRequiresGradStep: set_requires_grad,
    RetainGradStep: retain_grad,
    FreeStep: _free,
    FetchStep: _fetch,
    LoadStep: load_step,
    TemplateStep: templates.define_template,
    RunTemplateStep: lambda run, step: templates.run_template(run, step, _execute),
    FunctionStep: lambda run, step: user_functions.apply_function(run, step, _execute),
    CheckpointStep: lambda run, step: checkpoint_regions.open_region(run.session.checkpoints, run, step, _execute),
    CheckpointEndStep: lambda run, step: checkpoint_regions.close_region(run.session.checkpoints, run, step),
    functorch_regions.Region: functorch_regions.run_region,  # a template's torch.func region, run as one
}


# -- turns of the process-global torch settings (see the module's docstring) --------------


class _Waiter:
    __slots__ = ("state", "event", "error")

    def __init__(self, state: tuple) -> None:
        self.state, self.event, self.error = state, threading.Event(), None


class GlobalsTurns:
    """``enter(state)`` before a program's first step, ``leave()`` after its last (always, in a ``finally``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._state: tuple | None = None  # what the running programs run under
        self._own: tuple | None = None  # what the process held before this turn switched it (None: not switched)
        self._waiting: deque[_Waiter] = deque()

    def enter(self, state: tuple) -> None:
        with self._lock:
            if not self._waiting:
                if not self._running:
                    self._begin(state)  # raises, running nothing, when torch refuses the state
                    self._running = 1
                    return
                if state == self._state:
                    self._running += 1
                    return
            waiter = _Waiter(state)
            self._waiting.append(waiter)
        waiter.event.wait()  # admitted: counted as running, the state switched (or refused)
        if waiter.error is not None:
            raise waiter.error

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running:
                return
            if self._own is not None:  # (as ``_end``: most turns switched nothing)
                self._end()
            self._state = None
            while self._waiting:
                state = self._waiting[0].state
                admitted = [w for w in self._waiting if w.state == state]
                self._waiting = deque(w for w in self._waiting if w.state != state)
                try:
                    self._begin(state)
                except ProtocolError as exc:
                    for waiter in admitted:
                        waiter.error = exc
                        waiter.event.set()
                    continue
                self._running = len(admitted)
                for waiter in admitted:
                    waiter.event.set()
                return

    def _begin(self, state: tuple) -> None:
        """A turn begins (nothing runs): the process is made to hold ``state``."""
        own = torch_globals.read()
        self._state = state
        if state != meta_check.memo_state:
            meta_check.use_memo(state)
        if own == state:
            return
        self._own = own
        try:
            torch_globals.apply(state)
        except (RuntimeError, TypeError, ValueError) as exc:
            self._end()
            raise ProtocolError(ErrorCode.OP_ERROR, f"torch_globals: the server's torch refused them: {exc}") from None

    def _end(self) -> None:
        """The last program of a turn is done: the process gets back what it held before."""
        if self._own is not None:
            own, self._own = self._own, None
            torch_globals.apply(own)
        self._state = None


TURNS = GlobalsTurns()

"""``run_steps``: execute a program's steps in order against one session.

Each step is atomic: it computes everything first and commits (stores outputs,
writes in place, accumulates grads) only at its end, so a failing step leaves
no trace while earlier steps stay done, as in eager torch.
"""

from __future__ import annotations

import contextlib
import logging
from time import perf_counter
from typing import Any, Callable

import torch

from remote_autograd.proto import ErrorCode, ProtocolError, dtype_name, torch_globals
from remote_autograd.proto.messages import (
    BackwardStep,
    CallStep,
    CheckpointEndStep,
    CheckpointStep,
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
from remote_autograd.proto.codec import decode_tensor_data

from .. import ops as _ops
from ..ops._context import RunContext, reset, set_current
from ..sessions.store import CustomTensor
from ..sessions.store import ProgramAnswer, Session
from ..settings import Settings
from . import checkpoint_regions, functorch_regions, graph_steps, templates, user_functions
from .anomaly import Forwards
from .answers import tensor_message
from .autocast import autocast_dtype, run_autocast
from .autograd_steps import backward_step, grad_step
from .error_text import scrubbed
from .globals_turns import TURNS
from .kept_storages import keeps_storages
from .load_step import load_step
from .meta_check import Needs
from . import program_plan, speed_caches
from .program_run import ProgramRun
from .program_watch import ProgramWatch
from .saved_tensors import counting_saved
from .step_cost import hold, untimed
from .values import (check_elements, check_new_ids, meta_message, resolve_args, resolve_kwargs, resolve_value,
                     step_refs, store_made, store_tensors)

log = logging.getLogger("remote_autograd.service.engine.runner")
OP_TABLE = _ops.OP_TABLE


def run_steps(session: Session, program: Program, settings: Settings, *, as_json: bool = False,
                observe: Callable[[str, float], None] | None = None, watch: ProgramWatch | None = None) -> ProgramAnswer:
    """Run every step or stop at the first failure; the caller holds the session lock.

    The limits a body claims (its step count, its put steps' shapes) were checked when it was
    admitted (``guards.check_limits``, on every path a program takes); the limits of what steps
    make (outputs, tensors and bytes held) are checked here, step by step.
    ``observe(op, seconds)`` is told how long each step that succeeded took (metrics).
    ``watch`` is asked before each step whether the program must stop there (its time limit, its
    client gone): the stop is that step's failure, the steps before it stay done.
    """
    run = ProgramRun(session, settings, as_json, omit_known_meta=program.omit_known_meta, watch=watch,
                     untimed=untimed(settings))
    if program.detect_anomaly:
        run.forward = Forwards(program.id)
    state = torch_globals.from_wire(program.torch_globals)
    default = state is torch_globals.DEFAULT  # torch's defaults, as almost every program's
    run.torch_state = None if default else state
    if settings.replay == "on":  # plans answer by what the memo answered under the program's state
        run.check = program_plan.for_program(session, program.steps, run.torch_state)
    steps = StepLoop(run, program, observe, watch)
    TURNS.enter(state)  # the process-global torch settings the client had (globals_turns)
    token = set_current(RunContext(session.generator, session.device, settings.max_tensor_elements))
    try:
        # what the graph saves counts too, but inside a checkpointed function's region (checkpoint_regions)
        with counting_saved(session, settings.max_session_bytes), checkpoint_regions.resumed(session.checkpoints):
            # a replay runs no call step: none is marked for anomaly detection, nor recorded by a region
            graphs = (speed_caches.of(session).graphs if settings.cuda_graphs != "off" and default
                      and run.forward is None and not session.checkpoints else None)
            if graphs is None or not graph_steps.run(graphs, steps, settings.cuda_graphs):
                steps.execute(0, len(program.steps))
    finally:
        reset(token)
        TURNS.leave()
        if watch is not None:
            watch.finished = True  # off its thread now, even if whoever waited for it stopped waiting
    if steps.failed is not None:
        return steps.failed
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
        self.views_from = _views_from(program.steps)
        self.began = perf_counter()
        # a capture (graph_steps): put values decoded before it began, by step; each call's stored outputs
        self.staged: dict[int, torch.Tensor] | None = None
        self.made: dict[int, tuple] | None = None

    def execute(self, start: int, stop: int) -> bool:
        """Steps ``start`` to ``stop`` (not included); False, with ``failed`` set, at the first failure."""
        run, results, observe, watch = self.run, self.results, self.observe, self.watch
        storages = run.session.storages
        regions = run.session.checkpoints  # the checkpoint regions open (checkpoint_regions): most often none
        steps = self.program.steps
        for index in range(start, stop):
            step = steps[index]
            if index == self.views_from:
                run.views = True
            began = perf_counter()
            try:
                if watch is not None:
                    watch.check(index, step)
                if regions:
                    checkpoint_regions.admit(regions, step, run.settings.max_steps_per_program)
                kind = type(step)
                if kind is CallStep:
                    results.append(_call(run, step, index))
                    if self.made is not None and step.out:
                        self.made[index] = tuple(run.session.tensors[t].value for t in step.out)
                else:
                    staged = self.staged
                    results.append(_put(run, step, staged[index]) if staged is not None and kind is PutStep
                                   else _HANDLERS[kind](run, step))
                    run.check.other(step)
                if regions:
                    checkpoint_regions.record(regions, step, run.session, run.settings.max_session_bytes)
            except Exception as exc:  # every failure becomes data: see _as_protocol_error
                err = _as_protocol_error(exc, index, _step_op(step))
                # the traceback holds this frame, which holds err: a cycle only the garbage collector
                # breaks, keeping the failed step's tensors and the body (a refused 16 MiB put: 48 MiB each)
                exc.__traceback__ = err.__traceback__ = exc.__context__ = None
                self.failed = ProgramAnswer(err.status, err.answer(results, self.program.id), perf_counter() - self.began)
                return False
            finally:  # a freed id or a backward let the graph go: its saved tensors' bytes come back
                if storages.dead:
                    storages.settle()
            if observe is not None:
                observe(step.op if kind is CallStep else step.kind, perf_counter() - began)
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


def _views_from(steps: list) -> int:
    """The index after the program's last step that may write to a tensor (neither a fetch nor a
    free): fetches from there on may answer with views of the tensors' bytes (``ProgramRun.views``)."""
    for index in range(len(steps) - 1, -1, -1):  # most programs end with their fetches: a short walk
        if not isinstance(steps[index], (FetchStep, FreeStep)):
            return index + 1
    return 0


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


# -- values -------------------------------------------------------------------------------


def _put(run: ProgramRun, step: PutStep, staged: torch.Tensor | None = None) -> dict | None:
    """``staged``: the value, decoded already (a capture decodes its puts before it begins: ``graph_steps``)."""
    session = run.session
    check_new_ids(session, [step.id])
    # validated with the program, its shapes within max_tensor_elements (guards.check_limits)
    value = staged if staged is not None else decode_tensor_data(
        step.value, field="value", device=session.device, copy=False)  # a framed body's bytes become the tensor
    grad = None
    if step.grad is not None:
        grad = decode_tensor_data(step.grad, field="grad", device=session.device)
        if grad.shape != value.shape or grad.dtype != value.dtype:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "grad: must have the value's shape and dtype")
    if step.requires_grad:
        value.requires_grad_(True)  # torch's own error for integer dtypes
    store_tensors(session, run.settings, [(step.id, CustomTensor(value, grad))])
    return None if run.omit_known_meta else {"tensors": [meta_message(step.id, value)]}


def _call(run: ProgramRun, step: CallStep, index: int = 0) -> dict | None:
    session = run.session
    call = OP_TABLE.resolve(step.op)  # what the name runs: the entry, the callable, whether in place
    if call is None:
        raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {step.op!r}; GET /v1/ops lists the op table")
    entry = call.entry
    args = resolve_args(step.args, session)
    kwargs = resolve_kwargs(step.kwargs, session) if step.kwargs else {}
    if not call.inplace:
        check_new_ids(session, step.out)
    # no kernel sees arguments torch would refuse, and what it will allocate is charged first
    # (by the meta check, or where the program's plan vouches for it, by the plan: ``program_plan``)
    needs = run.check.check_call(index, step, call, args, kwargs)
    reserved = needs.bytes
    if reserved:
        session.storages.reserve(reserved, run.settings.max_session_bytes)
    try:
        if needs.flops > run.untimed or needs.elements > run.settings.max_tensor_elements:
            _admit(run, step, call.inplace, needs)  # a call that may pass a limit: held before its kernel runs
        run.flops += needs.flops
        if call.inplace:  # never under autocast: the op contract's autocast_applies
            try:
                _run_inplace(call, step, args, kwargs)
            finally:  # a kernel that failed midway may have changed a storage too
                if not keeps_storages(call, step):
                    _remeasure(session, step)
            run.check.ran(index, step, call, ())
            if run.forward is not None:
                run.forward.record(index, step.op, args[0], [])
            return None if run.omit_known_meta else {"tensors": []}
        if step.autocast is None:
            with _grad_mode(step.grad_enabled):  # ``_apply``, inline: the plain path of every call step
                result = call.fn(*args, **kwargs)
        else:
            result = run_autocast(entry, session.device, autocast_dtype(step.autocast),
                                  lambda a, k: _apply(call.fn, step.grad_enabled, a, k), args, kwargs)
        if run.forward is not None:
            run.forward.record(index, step.op, result, [*args, *kwargs.values()])
        return _store_outputs(run, step, call, result, args, kwargs, index)  # charged from the reservation
    finally:
        if reserved:
            session.storages.unreserve()  # what the outputs did not take (a view brings no bytes)


def _admit(run: ProgramRun, step: CallStep, inplace: bool, needs: Needs) -> None:
    """The rest of what the meta check says a call will take, held to the limits before its kernel
    runs: its largest output's elements (an in-place call makes no new tensor) and its work."""
    if needs.elements > run.settings.max_tensor_elements and not inplace:
        check_elements(f"{step.op}'s largest output", needs.elements, run.settings)
    hold(run, step.op, needs.flops)


def _remeasure(session: Session, step: CallStep) -> None:
    """Count again the tensors an in-place step named: ``resize_`` may have grown a storage,
    ``set_data`` or ``as_strided_`` pointed a tensor at another (``storage_ledger``)."""
    tids = step_refs(step.args, set())
    if step.kwargs:
        step_refs(step.kwargs.values(), tids)
    tensors = session.tensors
    session.storages.remeasure([tensors[t] for t in tids if t in tensors])


def _store_outputs(run: ProgramRun, step: CallStep, call, result: Any, args: list, kwargs: dict,
                   index: int) -> dict | None:
    """Keep a call's outputs under the step's ids; their metadata is the step's result (unless
    the client named them all and asked to be spared it: ``omit_known_meta`` without ``out_many``)."""
    session = run.session
    is_tuple = isinstance(result, (tuple, list))
    # optional outputs that are None (attention weights with need_weights=False) get no id: the
    # client knows where they go from the same call on meta
    outputs = tuple(o for o in result if o is not None) if is_tuple else (result,)
    outputs = _no_aliases(outputs, (*args, *kwargs.values()) if kwargs else args, step.grad_enabled)
    ids = step.out
    if step.out_many:
        if len(step.out) != 1:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "out: with out_many, give exactly one id prefix")
        ids = [f"{step.out[0]}.{i}" for i in range(len(outputs))]
        check_new_ids(session, ids)
    if len(outputs) != len(ids):
        raise ProtocolError(ErrorCode.OP_ERROR, f"{step.op} returns {len(outputs)} tensor(s) but out names {len(ids)}")
    store_made(session, run.settings, [(tid, CustomTensor(t)) for tid, t in zip(ids, outputs)])
    run.check.ran(index, step, call, ids)
    if run.omit_known_meta and not step.out_many:
        return None
    metas = [meta_message(tid, t) for tid, t in zip(ids, outputs)]
    return {"tensors": metas, "tuple": True} if is_tuple else {"tensors": metas}


def _apply(fn, grad_enabled: bool, args: list, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` (the resolved callable) in the step's grad mode."""
    with _grad_mode(grad_enabled):
        return fn(*args, **kwargs)


def _requires_grad(args: list, kwargs: dict) -> bool:
    """Whether a tensor argument requires grad: only then can an op record a graph."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


_SAME_MODE = contextlib.nullcontext()


def _grad_mode(enabled: bool, *, matters: bool = True):
    """``torch.set_grad_enabled(enabled)`` as a context, or a no-op one when the mode already is ``enabled``
    or cannot ``matter`` (autograd looks at it only when a tensor requires grad). Most steps switch
    nothing: switching and restoring costs more than many small ops."""
    return _SAME_MODE if not matters or torch.is_grad_enabled() == enabled else torch.set_grad_enabled(enabled)


def _no_aliases(outputs: tuple, inputs, grad_enabled: bool) -> tuple:
    """Outputs that are an input object itself (``contiguous()``, ``dropout(training=False)``) become views.

    Two ids must never share one tensor object: leaves are found by object identity
    in backward, and the client already treats the result as a new non-leaf. The view is made in
    the step's grad mode, as its op ran (inside a backward, a user Function's template runs with
    grad on where the engine has it off: a view made off would cut the graph there).
    """
    if len(outputs) == 1 and not any(outputs[0] is a for a in inputs):  # the usual case, without a set
        return outputs
    tensors = {id(a) for a in inputs if isinstance(a, torch.Tensor)}
    if not any(id(o) in tensors for o in outputs):
        return outputs
    with _grad_mode(grad_enabled):
        return tuple(o.view_as(o) if id(o) in tensors else o for o in outputs)


def _run_inplace(call, step: CallStep, args: list, kwargs: dict) -> None:
    """``x.op_(...)``: torch's own in-place callable when the name spells one (``Tensor.add_``), or when no
    graph is recorded (optimizer updates: the same result, without an out-of-place value and a
    copy); else ``_inplace_by_copy``."""
    entry = call.entry
    if args and isinstance(args[0], list) and call.inplace and (call.writes or entry.inplace):
        with _grad_mode(step.grad_enabled):  # torch._foreach_X_(tensors, ...): torch's kernel
            call.fn(*args, **kwargs)
        return None
    if not args or not isinstance(args[0], torch.Tensor):
        raise ProtocolError(ErrorCode.OP_ERROR, f"{step.op}: the first argument must be a tensor")
    target = args[0]
    needs_grad = _requires_grad(args, kwargs)
    recording = step.grad_enabled and needs_grad
    if entry.relayout or (call.writes and not call.by_copy):
        # torch's own in-place op on the stored tensor: its own checks (a leaf that requires grad,
        # shapes, dtypes) come before any change, and its derivative is torch's
        with _grad_mode(step.grad_enabled, matters=needs_grad):
            call.fn(*args, **kwargs)
        return None
    if recording and target.is_leaf and target.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            "a leaf Variable that requires grad is being used in an in-place operation.")
    if "inplace" in kwargs:
        del kwargs["inplace"]
    with _grad_mode(step.grad_enabled, matters=needs_grad):
        if call.writes:  # torch's in-place op on a copy: a failure midway leaves the target as it was
            work = target.clone()
            call.fn(work, *args[1:], **kwargs)
            target.copy_(work)
        elif recording or entry.native_inplace is None or entry.kind == "native":
            _inplace_by_copy(call.fn, args, kwargs, recording, entry.inplace)
        else:
            entry.native_inplace(*args, **kwargs)


def _inplace_by_copy(fn, args: list, kwargs: dict, recording: bool, inplace_only: bool = False) -> None:
    """Compute out of place, check it fits ``x``, then write it in with ``copy_``.

    Writing through ``copy_`` bumps ``x``'s version counter, so a backward that saved
    the old ``x`` fails with torch's own error, as it would after a native in-place op.
    When a graph is recorded we compute from a clone, so our own Function never holds
    the tensor we are about to overwrite. When ``x`` is a view (the view ops are torch's
    own), ``copy_`` writes through to its base and torch rebases the base's graph.
    """
    target = args[0]
    value = fn(target.clone() if recording else target, *args[1:], **kwargs)
    if isinstance(value, (tuple, list)):
        value = value[0]
    if value is target:
        return
    if value.shape != target.shape:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(value.shape)}")
    if not torch.can_cast(value.dtype, target.dtype) and not inplace_only:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            f"result type {dtype_name(value.dtype)} can't be cast to the desired output type "
                            f"{dtype_name(target.dtype)}")
    target.copy_(value)  # a view a custom op's Function returned: torch's own refusal, as locally


def _set_grad(run: ProgramRun, step: SetGradStep) -> None:
    session = run.session
    ct = session.tensor(step.id)
    grad = resolve_value(step.grad, session)
    if grad is not None:
        if not isinstance(grad, torch.Tensor):
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad expected to be a Tensor or None")
        if grad.shape != ct.shape:
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad has data of a different size")
        if grad.dtype != ct.dtype:
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad has data of a different type")
    ct.grad = grad  # aliasing, as `p.grad = g` does in torch: a session tensor's storage, counted already
    session.storages.remeasure([ct])
    return None


def _set_requires_grad(run: ProgramRun, step: SetRequiresGradStep) -> dict | None:
    ct = run.session.tensor(step.id)
    ct.value.requires_grad_(step.requires_grad)  # torch's own errors for non-leaves and int dtypes
    return None if run.omit_known_meta else {"tensors": [meta_message(step.id, ct.value)]}


def _retain_grad(run: ProgramRun, step: RetainGradStep) -> None:
    ct = run.session.tensor(step.id)
    if not ct.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR, "can't retain_grad on Tensor that has requires_grad=False")
    if not ct.is_leaf:
        ct.retains_grad = True
    return None


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
    PutStep: _put,
    CallStep: _call,
    BackwardStep: lambda run, step: backward_step(run, step, _execute),
    GradStep: lambda run, step: grad_step(run, step, _execute),
    SetGradStep: _set_grad,
    SetRequiresGradStep: _set_requires_grad,
    RetainGradStep: _retain_grad,
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

"""The regions of ``torch.utils.checkpoint(fn, *args, use_reentrant=False)``: what their ops save is dropped
and recomputed at the backward, on the server, as torch does it (``proto/SPEC.md`` §4, "checkpoint").

On the client no autograd node ever packs a tensor (the server does the autograd), so torch's own hooks
there save nothing. The SDK tells the server where ``fn`` begins and ends instead: a ``checkpoint`` step
opens a region, a ``checkpoint_end`` step closes it, and the steps between (in one program or several)
are ``fn``'s. The server runs them under torch's own machinery: a ``_CheckpointFrame`` whose inputs are
the checkpoint's tensor arguments (saved with ``_make_saved_tensor`` under the hooks below, as torch's
``save_inputs`` saves them: the session's ``counting_saved``, or an enclosing region's), and torch's
``_checkpoint_hook`` pushed while the region's steps run, so every tensor their ops save becomes a
holder. At the first unpack, torch calls the frame's ``recompute_fn``: ``_recompute`` runs the region's
recorded steps again, under torch's ``_recomputation_hook``, on the frame's inputs and on the other
tensors the steps read (kept as ``fn``'s closure keeps them: read as they are then, counted while the
region lives), with the session's generator as it was at the open (``preserve_rng_state``) and put back
after, as ``fork_rng`` does. Its names live in the session's table under a prefix no client id can have
(``~ck<n>/``) for the recomputation only, and are dropped there; the recomputed tensors torch keeps until
they are unpacked. torch's rules hold as they are: nested regions (one opened inside another's steps is
opened again while the outer one is recomputed), a second backward (another graph task recomputes
again), the determinism check, early stop (here after the step that recomputed the last saved tensor).

A region's steps are calls, ``set_requires_grad``, user Functions (``function``: its ``node`` names the
forward's node still) and compiled graphs (``run_template``), run again; puts (their tensor kept);
and steps that compute nothing (fetch, free, retain_grad, set_grad, template definitions: not run
again). A backward, grad or load step inside one is refused (torch's recomputation of a backward inside
the function, its rule 6, is not followed). A region lives as long as the
graph keeps its holders (the frame, its recomputation and what it keeps are reached only from them).

Between programs the session keeps its open regions; ``resume`` pushes their hooks again before each
program's steps, ``suspend`` pops those open after them (torch's hooks are per thread and the program's own
``counting_saved`` is below them).
"""

from __future__ import annotations

import functools
import itertools
import weakref
from typing import Any

import torch
from torch.utils.checkpoint import (GraphExecGroup, _allowed_determinism_checks_to_fns, _checkpoint_hook,
                                    _CheckpointFrame)

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import (BackwardStep, CallStep, CheckpointEndStep, CheckpointStep, FunctionStep,
                                            GradStep, LoadStep, PutStep, RunTemplateStep, SetRequiresGradStep)

from ..ops._context import CURRENT, RunContext
from ..sessions.store import CustomTensor
from .templates import Execute, GradStandIn, renamed
from .values import ProgramRun, pinned, step_refs

_RUNS = itertools.count()
MAX_OPEN = 32  # regions open at once (torch's nested checkpoints are a few deep): each step is recorded by each
STEPS_PER_PROGRAM = 16  # a region's steps: at most this many times max_steps_per_program (its programs' steps)
_REFUSED = (BackwardStep, GradStep, LoadStep)
_REFUSED_NAMES = {BackwardStep: "a backward", GradStep: "torch.autograd.grad", LoadStep: "a load"}


class Region:
    """One open (or closed, still needed) region: its steps, what they read from outside, its generator state.
    It holds no tensor of its own steps' making, and its frame only weakly: the frame holds it (``_recompute``)."""

    __slots__ = ("id", "session", "execute", "inputs", "known", "closure", "steps", "rng", "early_stop", "frame",
                 "hook", "again", "__weakref__")

    def __init__(self, step: CheckpointStep, session, execute: Execute, rng: tuple | None) -> None:
        self.id = step.region
        self.session = weakref.ref(session)
        self.execute = execute
        self.inputs = list(step.inputs)  # bound to the frame's saved inputs at a recomputation
        self.known = set(step.inputs)  # names a recomputation can read: inputs, what the steps made, the closure
        self.closure: dict[str, tuple[CustomTensor, Any]] = {}  # other names read: (the tensor, its pin)
        self.steps: list = []
        self.rng = rng  # (the generator's state at the open, its pin), or None
        self.early_stop = step.early_stop
        self.frame: weakref.ref | None = None
        self.hook: _checkpoint_hook | None = None  # while open
        # once recomputed: its name prefix, its steps renamed under it, and which names go after each (_deaths).
        # One prefix per region: its recomputations run one at a time (a backward inside one is refused)
        self.again: tuple[str, list, dict[int, list[str]]] | None = None

    def record(self, step, session, limit: int) -> None:
        """``step`` ran inside the region: kept to run again (a put: its tensor kept), what it reads from
        outside kept as ``fn``'s closure."""
        kind = type(step)
        if kind is PutStep:
            self._keep(step.id, session, limit)
            return
        if kind not in _RUN_AGAIN:
            return  # computes nothing a later step reads: fetch, free, retain_grad, set_grad, a template defined
        for tid in _reads(step):
            if tid not in self.known:
                self._keep(tid, session, limit)
        self.known.update(_made(step, session))
        self.steps.append(step)

    def _keep(self, tid: str, session, limit: int) -> None:
        ct = session.tensor(tid)
        self.known.add(tid)
        self.closure[tid] = (ct, pinned(session, ct.value, limit))


_RUN_AGAIN = (CallStep, SetRequiresGradStep, FunctionStep, RunTemplateStep, CheckpointStep, CheckpointEndStep)


def _reads(step) -> set[str] | list[str]:
    """The names a step of a region reads (``_RUN_AGAIN``'s kinds)."""
    kind = type(step)
    if kind is CallStep:
        found = step_refs(step.args, set())
        return step_refs(step.kwargs.values(), found) if step.kwargs else found
    if kind is RunTemplateStep:
        return step_refs(step.inputs, set())
    if kind is FunctionStep:
        return [*step.inputs, *step.outputs, *step.saved, *step.live]
    return [step.id] if kind is SetRequiresGradStep else step.inputs if kind is CheckpointStep else ()


def _deaths(steps: list) -> dict[int, list[str]]:
    """After which step each name a call of ``steps`` makes is read no more: a recomputation lets it go there,
    as torch's would once ``fn``'s Python drops it (what a node saved stays with torch until unpacked)."""
    made, last = {}, {}
    for index, step in enumerate(steps):
        for tid in _reads(step):
            last[tid] = index
        if not getattr(step, "out_many", False):  # (out_many's names go at the end)
            made.update((tid, index) for tid in _made(step, None))
    deaths: dict[int, list[str]] = {}
    for tid, index in made.items():
        deaths.setdefault(max(index, last.get(tid, index)), []).append(tid)
    return deaths


def _made(step, session) -> list[str]:
    kind = type(step)
    if kind is RunTemplateStep:
        return step.out
    if kind is not CallStep:
        return []
    if not step.out_many:
        return step.out
    tensors, prefix, made = session.tensors, step.out[0], []
    while f"{prefix}.{len(made)}" in tensors:
        made.append(f"{prefix}.{len(made)}")
    return made


# -- the steps ---------------------------------------------------------------------------------------


def admit(regions: list, step, max_steps_per_program: int) -> None:
    """A step about to run inside open ``regions``: refused when a region could not run it again, or would
    hold more steps than it may (the outermost holds the most)."""
    if type(step) in _REFUSED:
        raise ProtocolError(ErrorCode.OP_ERROR, f"{_REFUSED_NAMES[type(step)]} inside the function of "
                            "torch.utils.checkpoint(..., use_reentrant=False) is not supported on remote tensors: "
                            "call it outside the checkpointed function")
    if len(regions[0].steps) >= STEPS_PER_PROGRAM * max_steps_per_program and type(step) in _RUN_AGAIN:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"checkpoint region {regions[0].id!r} would hold more than "
                            f"{STEPS_PER_PROGRAM} x max_steps_per_program={max_steps_per_program} steps")


def record(regions: list, step, session, limit: int) -> None:
    """``step`` ran with ``regions`` open: each keeps it (an outer region runs an inner one's steps again too)."""
    if type(step) is not CheckpointStep and type(step) is not CheckpointEndStep:
        for region in regions:
            region.record(step, session, limit)


def open_region(regions: list, run: ProgramRun, step: CheckpointStep, execute: Execute) -> None:
    """The ``checkpoint`` step: the frame made, its inputs saved under the hooks below, its hook pushed."""
    session = run.session
    if any(r.id == step.region for r in regions):
        raise ProtocolError(ErrorCode.CONFLICT, f"checkpoint region {step.region!r} is open already")
    if len(regions) >= MAX_OPEN:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"checkpoint region {step.region!r} would be the {MAX_OPEN + 1}th "
                            f"open at once: at most {MAX_OPEN}")
    limit = run.settings.max_session_bytes
    inputs = [session.tensor(tid).value for tid in step.inputs]
    rng = None
    if step.preserve_rng_state:
        state = session.generator.get_state()
        rng = (state, pinned(session, state, limit))
    region = Region(step, session, execute, rng)
    frame = _CheckpointFrame(functools.partial(_recompute, region), False, None,
                             _allowed_determinism_checks_to_fns[step.determinism_check])
    region.frame = weakref.ref(frame)
    frame.save_inputs(*inputs)  # as torch's save_inputs: before the region's own hook
    region.hook = _checkpoint_hook(frame)
    region.hook.__enter__()
    for outer in regions:  # the enclosing regions see the open as a step of theirs (its inputs read)
        outer.record(step, session, limit)
    regions.append(region)


def close_region(regions: list, run: ProgramRun, step: CheckpointEndStep) -> None:
    """The ``checkpoint_end`` step: the region and those opened inside it closed (their forward complete)."""
    depth = next((k for k, r in enumerate(regions) if r.id == step.region), None)
    if depth is None:
        return None  # its checkpoint step never ran (its program failed before it)
    while len(regions) > depth:
        region = regions.pop()
        region.hook.__exit__(None, None, None)
        region.hook = None
        frame = region.frame()
        if frame is not None:
            frame.forward_completed = True
    for region in regions:
        region.record(step, run.session, run.settings.max_session_bytes)
    return None


def resume(regions: list) -> None:
    """The open regions' hooks pushed again before a program's steps (above its ``counting_saved``)."""
    for region in regions:
        region.hook.__enter__()


def suspend(regions: list) -> None:
    """After a program's steps, the hooks of the regions open at its end popped (the program may have opened
    or closed some): torch's hooks are a stack per thread, and the program's own ``counting_saved`` must be
    the one its end pops."""
    for region in reversed(regions):
        region.hook.__exit__(None, None, None)


# -- the recomputation --------------------------------------------------------------------------------


def _recompute(region: Region, *inputs: torch.Tensor) -> None:
    """torch's ``recompute_fn``: the region's steps run again on its inputs and closure (see the docstring)."""
    session = region.session()
    run = None if session is None else session.autograd_run
    if run is None:
        raise RuntimeError("torch.utils.checkpoint(use_reentrant=False): a saved tensor of a checkpointed region is "
                           "recomputed only inside a backward or grad step of its session")
    frame = region.frame()
    gid = GraphExecGroup._get_current_group() or torch._C._current_graph_task_id()  # as torch's unpack hook
    if region.again is None:
        prefix = f"~ck{next(_RUNS)}/"
        region.again = (prefix, [renamed(step, prefix) for step in region.steps], _deaths(region.steps))
    prefix, steps, deaths = region.again
    tensors = session.tensors
    bound = {prefix + tid: GradStandIn(t) for tid, t in zip(region.inputs, inputs)}
    bound.update({prefix + tid: GradStandIn(ct.value, ct.grad) for tid, (ct, _) in region.closure.items()})
    tensors.update(bound)
    names: list[str] = []
    inner = ProgramRun(session, run.settings, run.as_json, omit_known_meta=True, torch_state=run.torch_state,
                       watch=run.watch, untimed=run.untimed)
    nested: list[Region] = []
    generator, before = session.generator, None
    # what the runner sets around a program, set again: on a CUDA device autograd unpacks on a thread of its own
    token = CURRENT.set(RunContext(generator, session.device, run.settings.max_tensor_elements))
    try:
        if region.rng is not None:
            before = generator.get_state()
            generator.set_state(region.rng[0])
        with torch.enable_grad():
            for index, step in enumerate(steps):
                _run_again(nested, inner, step, index, region, names)
                dead = deaths.get(index)
                if dead:
                    gone = [tensors.pop(prefix + tid, None) for tid in dead]
                    session.storages.drop([ct for ct in gone if ct is not None])
                if region.early_stop and frame is not None and gid != -1 and \
                        frame.recomp_counter[gid] >= len(frame.weak_holders):
                    break  # every tensor the backward needs is recomputed (torch's early stop)
    except ProtocolError as err:
        raise ProtocolError(err.code, f"recomputing a torch.utils.checkpoint region: {err.message}") from None
    finally:
        for open_inner in reversed(nested):
            open_inner.hook.__exit__(None, None, None)
        if before is not None:
            generator.set_state(before)
        CURRENT.reset(token)
        gone = [ct for ct in (tensors.pop(name, None) for name in (*bound, *names)) if ct is not None]
        session.storages.drop(gone)


def _run_again(nested: list, inner: ProgramRun, step, index: int, region: Region, names: list) -> None:
    kind = type(step)
    if kind is CheckpointStep:
        open_region(nested, inner, step, region.execute)
    elif kind is CheckpointEndStep:
        close_region(nested, inner, step)
    else:
        region.execute(inner, step, index)
        if nested:
            record(nested, step, inner.session, inner.settings.max_session_bytes)
        names.extend(_made(step, inner.session))

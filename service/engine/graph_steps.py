"""A repeated program captured once as a CUDA graph and launched again (``REMOTE_AUTOGRAD_CUDA_GRAPHS``).

The plain path it replaces: every step through the runner, each kernel launched from Python
one by one. A training loop sends the same program every step, with new ids and new values: the
same kernels on tensors of the same layouts. Captured (``graph_capture``), the device work of a
step is one launch; what Python still does is the step's bookkeeping, which a graph cannot
replay: ids stored and freed, ``.grad`` assigned, version counters moved, bytes counted.

**Which programs** (``graph_signature``): a program is keyed by everything but its ids and its put
values: every step's kind, op and arguments, floats by value (a learning rate baked into a
kernel is replayed as it was), and every session tensor it names by address and layout (the
graph reads and writes those addresses). Only what a graph can replay exactly takes part:
torch's own deterministic ops (no random draw, except calls that draw nothing: a dropout of
probability 0, ``ops._native.draws_nothing``; no contract that reads values, no data-dependent
shape, no autocast, no ``out=``, no in-place op that changes a layout), puts without a grad,
``set_grad`` to None (and ``clear_grads``), one kind of ``backward`` (no ``gradient``, ``inputs``, retained or
higher-order graph, roots made by the program) and fetches only after the last step that
computes. A session tensor that requires grad must be a leaf: a backward reaches no graph but
the program's. Anything else runs the plain path, every time.

**When**: a signature seen ``WARMUP_RUNS`` times on the plain path (torch's advice: warm up
before capturing) is captured on its next run. The warm-up runs are watched (``HostReads``): a
program whose steps read a device value on the host (an ``.item()`` in an op, a meta check that
needs a 0-d tensor's value, as ``narrow``'s tensor ``start``) would fail its capture, so it
is never captured. That run is a plain run inside the capture,
its puts staged before it (a host-to-device copy cannot be captured); the capture launches
nothing, so the graph is replayed once at its end, and the fetches after it read the values.

**Lifetime**: a replay rewrites every tensor its capture made. The session never holds those
tensors themselves, only aliases (new tensor objects on the same storage), so a storage's use
count says whether anything still holds one: an id, a view, a saved tensor, an answer being
sent. A capture is replayed only when nothing but the capture holds any of its storages.
A training loop frees step N's loss and inputs during step N+1, so a signature gets ``SLOTS``
captures, used in turn; when both are held, the step runs the plain path.

**What a replay does in Python**: the same answers (every step's result must be None, as with
``omit_known_meta``), the same ids stored and freed, the same grads assigned (aliases of the
captured ones), the same version counts (each session tensor moved by what its capture moved).
A replay that would fail (an id in use, the tensor limit, calls whose cost, counted at
capture, is more than the program's time left is worth: ``step_cost``) runs the plain path
instead, which answers the error at its step. Bytes: each capture's tensors stay counted to the session while
the capture lives (``_Slot.keepers``); the capture's own temporaries (a backward's
intermediate grads) are not counted, as on the plain path.

``tests/service/engine/test_graph_steps.py`` runs the training tests' programs with
``RecordedGraph`` (the stand-in) and without, answer for answer and tensor for tensor.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import BackwardStep, CallStep, ClearGradsStep, FreeStep, PutStep, SetGradStep
from remote_autograd.proto.codec import decode_tensor_data

from ..sessions.store import CustomTensor, ProgramAnswer
from . import step_cost
from .graph_capture import CudaGraph, HostReads, RecordedGraph
from .graph_signature import Unfit, signature
from .program_plan import PLAIN
from .values import check_new_ids, store_made, store_tensors

WARMUP_RUNS = 2
SLOTS = 2
GRAPHS_PER_SESSION = 2  # signatures kept per session (a training step, an evaluation step)
log = logging.getLogger("remote_autograd.service.engine.graph_steps")


def run(graphs: OrderedDict, steps, mode: str) -> bool:
    """Run ``steps`` (a ``runner.StepLoop``) here: warm-up, capture or replay. False: not a program
    for a graph, the caller runs the plain path."""
    session = steps.run.session
    if mode == "on" and session.device.type != "cuda":
        return False
    try:
        key, inputs = signature(session, steps.program.steps, steps.views_from, steps.program.omit_known_meta)
    except Unfit:
        return False
    entry = graphs.get(key)
    if entry is None:
        entry = graphs[key] = _Entry()
        while len(graphs) > GRAPHS_PER_SESSION:
            graphs.popitem(last=False)[1].release(session)
    graphs.move_to_end(key)
    if entry.refused:
        return False
    if entry.seen < WARMUP_RUNS:  # a plain run, watched: a program that reads a value on the host is never captured
        reads = HostReads()
        with reads:
            ok = steps.execute(0, steps.views_from)
        if ok and steps.execute(steps.views_from, len(steps.program.steps)):
            entry.seen += 1
            entry.refused = reads.seen
        return True
    if not _fits(steps):
        return False  # the plain path answers the id in use, or the limit, at its step
    if steps.watch is not None:
        try:
            steps.watch.check()
        except ProtocolError:
            return False  # the plain path stops at its first step, as it would have
    for slot in entry.slots:
        if slot.free():
            if not step_cost.in_time(steps.run, slot.flops):
                return False  # the plain path refuses the call that would not end in time, at its step
            _replay(slot, steps, inputs)
            return True
    if len(entry.slots) < SLOTS:
        _capture(entry, steps, inputs, CudaGraph() if mode == "on" else RecordedGraph())
        return True
    return False


class _Entry:
    """One signature's warm-up count and captures."""

    __slots__ = ("seen", "slots", "refused")

    def __init__(self) -> None:
        self.seen = 0
        self.slots: list[_Slot] = []
        # never captured: a warm-up read a value on the host, a capture had a result to answer, or its
        # bytes could not stay counted
        self.refused = False

    def release(self, session) -> None:
        for slot in self.slots:
            slot.release(session)
        self.slots.clear()


class _Slot:
    """One capture: the graph, the tensors it made, and what a replay does besides launching it."""

    __slots__ = ("graph", "staged", "made", "grads", "versions", "watched", "keepers", "flops")

    def __init__(self, graph) -> None:
        self.graph = graph
        # the work of the capture's calls (``step_cost``), each held to max_step_flops when captured
        self.flops = 0.0
        self.staged: dict[int, torch.Tensor] = {}  # put step -> the tensor its values are copied into
        self.made: dict[int, tuple] = {}  # call step -> the tensors it stored (out-of-place calls)
        self.grads: list[tuple[tuple, torch.Tensor | None]] = []  # origin -> the grad the program left it
        self.versions: list[tuple[int, bool, int]] = []  # (input, its grad?, how far the program moved it)
        self.watched: dict[int, int] = {}  # storage (its _cdata) -> its use count when nothing else holds it
        self.keepers: list[CustomTensor] = []  # count the capture's tensors to the session while it lives

    def free(self) -> bool:
        """Whether nothing but this capture holds any of its storages (then a replay may rewrite them)."""
        use_count = torch._C._storage_Use_Count
        return all(use_count(key) == ours for key, ours in self.watched.items())

    def release(self, session) -> None:
        self.graph.release()
        if self.keepers and not session.closed:
            session.storages.drop(self.keepers)
        self.keepers = []


def _fits(steps) -> bool:
    """Whether the plain path would store every id of the program (none in use, the tensor limit kept):
    checked before a replay, which must not fail midway."""
    session, settings = steps.run.session, steps.run.settings
    live = set(session.tensors)
    count, limit = len(live), settings.max_tensors_per_session
    for step in steps.program.steps[:steps.views_from]:
        kind = type(step)
        if (kind is SetGradStep and step.id not in live) or (kind is ClearGradsStep and not live.issuperset(step.ids)):
            return False  # the plain path answers the unknown id at that step
        new = _made_ids(step)
        for tid in new:
            if tid in live:
                return False
            live.add(tid)
        count += len(new)
        if count > limit:
            return False
        if kind is FreeStep:
            for tid in step.ids:
                if tid in live:
                    live.discard(tid)
                    count -= 1
    return True


# -- capture and replay -----------------------------------------------------------------------


def _capture(entry: _Entry, steps, inputs: list[CustomTensor], graph) -> None:
    run, session = steps.run, steps.run.session
    program, head = steps.program.steps, steps.views_from
    staged = {index: decode_tensor_data(step.value, field="value", device=session.device)
              for index, step in enumerate(program[:head]) if type(step) is PutStep}
    before = _versions(inputs)
    grads_before = [ct.grad for ct in inputs]
    made: dict[int, tuple] = {}
    steps.staged, steps.made = staged, made
    spent = run.flops
    try:
        try:
            with graph.capturing():
                ok = steps.execute(0, head)
        finally:
            steps.staged = steps.made = None
        graph.replay()  # the capture launched nothing: this run's device work, done now
    except Exception as exc:  # CUDA refused the capture: the steps' device work is lost
        _lost(steps, head, exc)
        return
    slot = _Slot(graph)
    slot.flops = run.flops - spent
    if not ok:  # a step failed: its answer stands, and a later run may capture again
        slot.release(session)
        return
    if not (all(r is None for r in steps.results) and _keep(slot, steps, inputs, staged, made, before,
                                                            grads_before)):
        entry.refused = True  # an answer a replay could not give, or bytes it could not keep counted
        slot.release(session)
    else:
        entry.slots.append(slot)
    steps.execute(head, len(program))


def _lost(steps, head: int, exc: Exception) -> None:
    """The session cannot go on: its steps ran in Python but not on the device. It is closed, loudly."""
    session = steps.run.session
    log.error("session %s closed: a CUDA graph capture failed: %s", session.id, exc)
    session.clear()
    err = ProtocolError(ErrorCode.OP_ERROR,
                        f"this session was closed: capturing its program as a CUDA graph failed ({exc}); "
                        "set REMOTE_AUTOGRAD_CUDA_GRAPHS=off and report it")
    err.step, err.op = head, "graph"
    steps.failed = ProgramAnswer(err.status, err.answer(steps.results, steps.program.id), 0.0)


def _keep(slot: _Slot, steps, inputs, staged, made, before, grads_before) -> bool:
    """Record what a replay needs from the capture that just ran, and let the session hold only aliases
    of the tensors it made. False: the capture cannot be replayed (its bytes could not stay counted)."""
    session, settings = steps.run.session, steps.run.settings
    program = steps.program.steps
    slot.staged, slot.made = staged, made
    statics = {id(t): t for t in (*slot.staged.values(), *(t for ts in made.values() for t in ts))}
    # the grads the program left: inputs' (changed) and those of tensors it made
    origins = _origins(session, program, steps.views_from, inputs)
    for origin, ct in origins.items():
        old = grads_before[origin[1]] if origin[0] == "s" else None
        if ct.grad is not old:
            slot.grads.append((origin, ct.grad))
            if ct.grad is not None:
                statics.setdefault(id(ct.grad), ct.grad)
    after = _versions(inputs)
    # a grad's count moved only if the program kept the same grad (a new one starts a count of its own)
    slot.versions = [(n, is_grad, a - b) for (n, is_grad, b), (_, _, a) in zip(before, after)
                     if a != b and (not is_grad or inputs[n].grad is grads_before[n])]
    inputs_storages = {_storage_key(ct.value) for ct in inputs} | {_storage_key(ct.grad) for ct in inputs
                                                                    if ct.grad is not None}
    ours = [t for t in statics.values() if _storage_key(t) not in inputs_storages]
    slot.keepers = [CustomTensor(t) for t in ours]
    try:
        session.storages.hold(slot.keepers, settings.max_session_bytes)
    except ProtocolError:
        slot.keepers = []
        return False
    # the session's ids and grads now name aliases; the capture keeps the tensors themselves
    static_ids = set(statics)
    aliases: dict[int, int] = {}  # storage -> aliases made on it just now
    for ct in session.tensors.values():
        if id(ct.value) in static_ids:
            ct.value = _alias(ct.value)
            _count(aliases, ct.value)
        if ct.grad is not None and id(ct.grad) in static_ids:
            ct.grad = _alias(ct.grad)
            _count(aliases, ct.grad)
    # what holds each storage now besides those aliases (this capture's tensors, the ledger's entry, a
    # RecordedGraph's calls) holds it for as long as the capture lives: more than that is someone else
    use_count = torch._C._storage_Use_Count
    keys = {_storage_key(t) for t in ours}
    slot.watched = {key: use_count(key) - aliases.get(key, 0) for key in keys}
    return True


def _count(counts: dict[int, int], t: torch.Tensor) -> None:
    key = _storage_key(t)
    counts[key] = counts.get(key, 0) + 1


def _replay(slot: _Slot, steps, inputs: list[CustomTensor]) -> None:
    run, session, settings = steps.run, steps.run.session, steps.run.settings
    run.check = PLAIN  # the session's plan for this program stays the one its plain runs recorded
    program, head = steps.program.steps, steps.views_from
    values = {index: decode_tensor_data(program[index].value, field="value", device=session.device, copy=False)
              for index in slot.staged}
    with torch.no_grad():
        for index, value in values.items():
            slot.staged[index].copy_(value)
    made: dict[tuple, CustomTensor] = {}
    for index in range(head):
        step = program[index]
        kind = type(step)
        if kind is PutStep:
            ct = made[("u", index)] = CustomTensor(_alias(slot.staged[index]))
            store_tensors(session, settings, [(step.id, ct)])
            steps.results.append(None)
        elif kind is CallStep:
            outputs = slot.made.get(index)
            if outputs is not None:
                check_new_ids(session, step.out)
                pairs = [(tid, CustomTensor(_alias(t))) for tid, t in zip(step.out, outputs)]
                for k, (_, ct) in enumerate(pairs):
                    made[("p", index, k)] = ct
                store_made(session, settings, pairs)
            steps.results.append(None)
        elif kind is BackwardStep:
            steps.results.append(None)
        elif not steps.execute(index, index + 1):  # set_grad, clear_grads, free: the runner's own handlers
            raise RuntimeError(f"graph replay: step {index} failed after its checks passed")
    slot.graph.replay()
    changed = []
    for origin, grad in slot.grads:
        ct = inputs[origin[1]] if origin[0] == "s" else made.get(origin)
        if ct is not None:
            ct.grad = None if grad is None else _alias(grad)
            changed.append(ct)
    session.storages.remeasure(changed)
    for n, is_grad, moved in slot.versions:
        tensor = inputs[n].grad if is_grad else inputs[n].value
        for _ in range(moved):
            torch.autograd.graph.increment_version(tensor)
    steps.execute(head, len(program))


def _origins(session, program: list, head: int, inputs: list[CustomTensor]) -> dict[tuple, CustomTensor]:
    """Each origin whose tensor the session holds at the end of ``program[:head]``, with that tensor."""
    found: dict[tuple, CustomTensor] = {("s", n): ct for n, ct in enumerate(inputs)}
    for index, step in enumerate(program[:head]):
        for k, tid in enumerate(_made_ids(step)):
            ct = session.tensors.get(tid)
            if ct is not None:
                found[("u", index) if type(step) is PutStep else ("p", index, k)] = ct
    return found


def _made_ids(step) -> list[str]:
    """The ids a step stores anew: a put's, a call's outputs."""
    kind = type(step)
    return [step.id] if kind is PutStep else step.out if kind is CallStep else []


def _versions(inputs: list[CustomTensor]) -> list[tuple[int, bool, int]]:
    out = []
    for n, ct in enumerate(inputs):
        out.append((n, False, ct.value._version))
        out.append((n, True, -1 if ct.grad is None else ct.grad._version))
    return out


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor object on ``t``'s storage, as autograd sees ``t``: a non-leaf stays one (its graph
    reached through a view), a leaf stays a leaf."""
    if t.requires_grad and t.grad_fn is not None:
        with torch.enable_grad():
            return t.view_as(t)
    alias = t.detach()
    return alias.requires_grad_(True) if t.requires_grad else alias


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


"""The autograd steps: ``backward`` (grads accumulate into the leaves) and ``grad`` (new tensors).

Gradients are computed into temporaries first and committed at the end, so a
failing backward leaves every ``.grad`` as it was.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.autograd.graph import GradientEdge

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import BackwardStep, GradStep

from ..sessions.store import CustomTensor, Session
from ..sessions.tensor_snapshot import LOST
from ..settings import Settings
from . import anomaly, tensor_hooks
from .autograd_graph import ACCUMULATE_GRAD, graph_nodes
from .user_functions import is_client_run
from .templates import Execute
from .values import ProgramRun, check_new_ids, data_bytes, meta_message, resolve_value, store_made


def _candidates(session: Session) -> list[CustomTensor]:
    """The session's tensors a backward may fill: leaves that require grad, and retained non-leaves."""
    leaves: dict[int, CustomTensor] = {}  # by tensor object: one entry per value
    retained: list[CustomTensor] = []
    for ct in session.tensors.values():
        value = ct.value
        if not value.requires_grad:  # most tensors (inputs, optimizer state): the cheapest test first
            continue
        # Views are never leaves; asking a stale view (its base changed in place) for
        # is_leaf would make autograd raise, so skip them before looking further.
        if value._base is not None and value._base.requires_grad and not ct.retains_grad:
            continue
        if value.is_leaf:
            leaves[id(value)] = ct
        elif ct.retains_grad:
            retained.append(ct)
    return [*leaves.values(), *retained]


def _reached(candidates: list[CustomTensor], roots: list[torch.Tensor]) -> list[CustomTensor]:
    """Those of ``candidates`` that a backward from ``roots`` reaches."""
    leaves = {id(ct.value): ct for ct in candidates if ct.value.is_leaf}
    found = {id(r) for r in roots if r.grad_fn is None and id(r) in leaves}
    seen = graph_nodes(roots)
    for node in seen:
        if type(node) is ACCUMULATE_GRAD and id(node.variable) in leaves:  # these nodes hold their leaf
            found.add(id(node.variable))
    return [ct for ct in candidates if id(ct.value) in found or ct.value.grad_fn in seen]


def _check_graph_kept(session: Session, roots: list[torch.Tensor]) -> None:
    """A backward through a graph lost in a restart raises (SPEC §10), before anything runs.

    The lost graph ends in a ``GraphLost`` node (``tensor_snapshot``), but ``autograd.grad`` with
    explicit inputs runs only the nodes on the way to them: it skips that one, and the leaves
    behind it would silently get no gradient. Only a restored session has such nodes, and only
    while a graph holds one."""
    lost = session.lost_graphs
    if lost and any(node in lost for node in graph_nodes(roots)):
        raise RuntimeError(LOST)


def _grad_outputs(values, session: Session) -> list | None:
    if values is None:
        return None
    return [resolve_value(v, session) for v in values]


def backward_step(run: ProgramRun, step: BackwardStep, execute: Execute) -> dict | None:
    """``execute``: the runner's, for the templates a user Function's node or a tensor hook runs.

    While autograd runs, ``run`` is held on its session (``Session.autograd_run``): a user Function's node
    needs it to run its backward template (``user_functions``), and whether the step names its inputs (a
    reentrant checkpoint refuses that, as torch's). A backward inside such a template (a checkpoint's)
    holds its own. The step's hooks are registered only when it has some (``tensor_hooks``)."""
    session = run.session
    roots = [session.tensor(t).value for t in step.tensors]
    if session.lost_graphs:
        _check_graph_kept(session, roots)
    hooked = step.hooks or step.node_hooks or step.module_hooks
    outer = session.autograd_run, session.autograd_explicit
    session.autograd_run, session.autograd_explicit = run, step.inputs is not None
    try:
        with tensor_hooks.registered(run, step, execute) if hooked else _NO_HOOKS as hooks:
            if not step.detect_anomaly:
                result = _backward(run, step, roots, hooks)
            else:
                with anomaly.detecting(roots, step.check_nan):
                    result = _backward(run, step, roots, hooks)
    finally:
        session.autograd_run, session.autograd_explicit = outer
    return tensor_hooks.answer(hooks, result) if hooked else result


_NO_HOOKS = contextlib.nullcontext(tensor_hooks.NONE)  # a step without hooks: nothing registered, nothing kept


def _backward(run: ProgramRun, step: BackwardStep, roots: list[torch.Tensor],
              hooks: tensor_hooks.StepHooks) -> dict | None:
    """The backward itself; ``hooks``: what its hooks do (``tensor_hooks``): the gradients its observing
    hooks keep are kept before any ``.grad`` is committed (a limit they meet leaves every ``.grad`` as it was)."""
    session, settings = run.session, run.settings
    grad_tensors = None if step.grad_tensors is None else _grad_outputs(step.grad_tensors, session)
    # Without ``inputs``, every candidate goes to autograd, which gives None to those the graph
    # does not reach: the graph is walked only when that matters (a byte limit, a grad left None).
    implicit = step.inputs is None
    targets = _candidates(session) if implicit else [session.tensor(t) for t in step.inputs]
    retain = step.create_graph if step.retain_graph is None else step.retain_graph
    captures = _captures(session, step, roots) if step.capture or session.nodes else []
    if not targets and not captures:  # nothing of ours to fill: still run it, for its errors and its graph freeing
        torch.autograd.backward(roots, grad_tensors, retain_graph=retain, create_graph=step.create_graph)
        store_made(session, settings, tensor_hooks.observed_pairs(hooks))
        return _backward_result(run, [])
    # Room for the new grads first (a 413 leaves the graph intact for a retry), then
    # temporaries, then commit: a failing backward leaves every .grad untouched.
    targets, reserved = _reserve(session, settings, targets, roots if implicit else None)
    try:  # only a hook of the step's can change what a retained non-leaf's grad is after it
        with (tensor_hooks.retained_after_hooks(session, step.hooks, targets) if step.hooks
              else contextlib.nullcontext({})) as after:
            grads = torch.autograd.grad(roots, [*(ct.value for ct in targets), *captures], grad_tensors,
                                        retain_graph=retain, create_graph=step.create_graph, allow_unused=True)
        if after:
            grads = tuple(after.get(k, g) for k, g in enumerate(grads))
        # first: any later name for a grad is a reference
        taken = [owned(grads, i) for i in range(len(targets))]
        captured: list = []
        if captures:
            grads, captured, arrived = _split_captured(grads, len(targets), step)
        if captured or hooks.observed is not None:  # new tensors to keep
            store_made(session, settings, tensor_hooks.observed_pairs(hooks) + captured)
    except BaseException:
        session.storages.release(reserved)
        raise
    changed = []
    for ct, g, own in zip(targets, grads, taken):
        if g is not None:
            _accumulate(ct, g, step.create_graph, own)
            changed.append(ct)
    # the grads by storage (an owned grad may share one), the room reserved for them given back: one change
    session.storages.remeasure(changed, give_back=reserved)
    without = [ct for ct in targets if ct.grad is None]
    missing = _still_without_grad(session, _reached(without, roots) if implicit else without) if without else []
    result = _backward_result(run, missing)
    return {**(result or {}), "captured": arrived} if captures else result


def _captures(session: Session, step: BackwardStep | GradStep, roots: list[torch.Tensor]) -> list[GradientEdge]:
    """Where ``step`` keeps the gradient that reaches a client-run node (``capture``), the new ids checked: a
    node no graph holds any more is ``404``, an output it does not have ``400``. A client-run node the walk
    from ``roots`` meets and ``step`` does not capture fails it (``422``): its gradient would stop there
    without a word (a template's backward step, which the client cannot stage)."""
    check_new_ids(session, [c.out for c in step.capture])
    edges = []
    for c in step.capture:
        node = session.nodes.get(c.node)
        if node is None:
            raise ProtocolError(ErrorCode.UNKNOWN_TENSOR, f"capture: no graph holds node {c.node!r} (any more)")
        if c.output >= len(node._input_metadata):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"capture: node {c.node!r} has no output {c.output}")
        edges.append(GradientEdge(node, c.output))
    if any(is_client_run(n) for n in list(session.nodes.values())):  # (a walk only while such a node lives)
        captured = {id(e.node) for e in edges}
        for node in graph_nodes(roots):
            if is_client_run(node) and id(node) not in captured:
                raise ProtocolError(ErrorCode.OP_ERROR, f"{node.spec.name}.backward runs on the client (it reads "
                                    "values), and this backward reaches it without capturing its gradient (a "
                                    "compiled step's or a template's backward cannot stage it): call backward "
                                    "outside torch.compile")
    return edges


def _split_captured(grads: tuple, n: int, step: BackwardStep | GradStep) -> tuple[tuple, list, list[bool]]:
    """A walk's gradients: the first ``n`` (the step's own), then the captured ones as the session holds them
    (``(id, tensor)`` pairs to store: a copy where autograd may hand one tensor out twice, ``owned``;
    detached unless the step records a graph), and which of them a gradient reached (the answer's ``captured``)."""
    taken = [owned(grads, i) for i in range(n, len(grads))]  # first: a slice is another holder
    captured = [g if g is None or step.create_graph else g.detach() for g in grads[n:]]
    captured = [None if g is None else g if own else g.clone(memory_format=torch.contiguous_format)
                for g, own in zip(captured, taken)]
    return (grads[:n], [(c.out, CustomTensor(g)) for c, g in zip(step.capture, captured) if g is not None],
            [g is not None for g in captured])


def _backward_result(run: ProgramRun, missing: list[str]) -> dict | None:
    """``{tensors: [], no_grad?}``; with ``omit_known_meta`` only the ``no_grad`` the client
    cannot predict, and ``None`` when there is none."""
    if run.omit_known_meta:
        return {"no_grad": missing} if missing else None
    return {"tensors": [], "no_grad": missing} if missing else {"tensors": []}


def _reserve(session: Session, settings: Settings, targets: list[CustomTensor],
             roots: list[torch.Tensor] | None) -> tuple[list[CustomTensor], int]:
    """Charge the bytes of the grads ``targets`` may get; (targets, bytes charged).

    With ``roots`` the targets are candidates: when their room is refused, the ones the
    graph reaches are charged instead (so the limit applies to those alone, as it must).
    """
    reserved = sum(data_bytes(ct) for ct in targets if ct.grad is None)
    try:
        session.storages.charge(reserved, settings.max_session_bytes)
    except ProtocolError:
        if roots is None:
            raise
        targets = _reached(targets, roots)
        reserved = sum(data_bytes(ct) for ct in targets if ct.grad is None)
        session.storages.charge(reserved, settings.max_session_bytes)
    return targets, reserved


def _still_without_grad(session: Session, without: list[CustomTensor]) -> list[str]:
    """Ids of ``without``: reached tensors that still have no grad (their inputs' gradients were None).

    The client predicts ``.grad is not None`` for every leaf a backward reaches; this
    corrects that prediction where an op gave no gradient (e.g. ``vector_norm(x, 0)``).
    """
    missing = {id(ct) for ct in without}
    if not missing:
        return []
    return [tid for tid, ct in session.tensors.items() if id(ct) in missing]


def _accumulate(ct: CustomTensor, g: torch.Tensor, create_graph: bool, own: bool) -> None:
    # A fresh grad is cloned unless it is ``owned``: in-place ops on one .grad must never show
    # up in another tensor (see ``owned`` for how autograd may share one).
    if not create_graph and g.requires_grad:  # without create_graph, grads normally have no graph already
        g = g.detach()
    if ct.grad is None:
        ct.grad = g if own else g.clone(memory_format=torch.contiguous_format)
    elif create_graph or ct.grad.requires_grad:
        ct.grad = ct.grad + g
    else:
        with torch.no_grad():
            ct.grad.add_(g)


def grad_step(run: ProgramRun, step: GradStep, execute: Execute) -> dict | None:
    session, settings = run.session, run.settings
    if len(step.out) != len(step.inputs):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "out: needs one id per input")
    check_new_ids(session, step.out)
    outputs = [session.tensor(t).value for t in step.outputs]
    inputs = [session.tensor(t).value for t in step.inputs]
    _check_graph_kept(session, outputs)
    retain = step.create_graph if step.retain_graph is None else step.retain_graph
    anomalies = anomaly.detecting(outputs, step.check_nan) if step.detect_anomaly else contextlib.nullcontext()
    captures = _captures(session, step, outputs)
    if captures and not step.allow_unused:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "capture: a grad step that captures allows unused inputs")
    outer = session.autograd_run, session.autograd_explicit  # held while autograd runs (see backward_step)
    session.autograd_run, session.autograd_explicit = run, True
    try:
        with tensor_hooks.registered(run, step, execute) as hooks, anomalies:
            grads = torch.autograd.grad(outputs, [*inputs, *captures], _grad_outputs(step.grad_outputs, session),
                                        retain_graph=retain, create_graph=step.create_graph,
                                        allow_unused=step.allow_unused)
    finally:
        session.autograd_run, session.autograd_explicit = outer
    grads, captured, arrived = _split_captured(grads, len(inputs), step)
    store_made(session, settings, [(tid, CustomTensor(g)) for tid, g in zip(step.out, grads) if g is not None]
               + captured + tensor_hooks.observed_pairs(hooks))
    if run.omit_known_meta and not step.allow_unused:  # the client named every grad and knows its shape
        return tensor_hooks.answer(hooks, None)
    result = {"tensors": [None if g is None else meta_message(tid, g) for tid, g in zip(step.out, grads)]}
    if captures:
        result["captured"] = arrived
    return tensor_hooks.answer(hooks, result)


# -- ``owned`` (a speed path): whether a gradient autograd handed back can become a ``.grad`` as it
# is, without a copy.
#
# A speed path. The plain path it stands in for is cloning every new grad
# (``g.clone()``), which is always safe: autograd may hand back one tensor for several
# inputs (``add``'s backward), the ``gradient=`` the client sent, an expanded view or a
# tensor a retained graph saved, and an in-place op on one ``.grad`` must never show in
# another tensor. A fresh result held by nothing but autograd's tuple (checked by
# reference counts, tensor use count and storage use count) is taken over instead: one
# copy of every parameter's grad less per backward, which shows in ``make bench``'s
# ``[training]`` lines (an MLP step). ``tests/service/engine/test_fast_paths.py`` checks that grads
# taken over never alias another tensor and equal the grads of the plain path.


def _refcount_held_by_tuple_alone() -> int:
    """``sys.getrefcount(t[i])`` of an object only the tuple ``t`` holds (2 here: the tuple and the argument;
    interpreters that borrow arguments say less), measured rather than assumed."""
    t = (object(),)
    return sys.getrefcount(t[0])


_HELD_BY_TUPLE_ALONE = _refcount_held_by_tuple_alone()


def owned(grads: tuple, i: int) -> bool:
    """Whether ``grads[i]`` is a plain tensor that nothing else holds, so it can become a ``.grad`` as it is.

    Autograd may hand back a tensor held elsewhere too: one grad for several inputs (``add``'s
    backward returns it twice), a ``gradient=`` the client sent, an expanded view, a tensor a
    retained graph saved. A fresh matmul or kernel result is held by ``grads`` alone.
    """
    if grads[i] is None or sys.getrefcount(grads[i]) != _HELD_BY_TUPLE_ALONE:
        return False
    g = grads[i]
    try:
        return (g._base is None and g.is_contiguous() and not g.requires_grad
                and g._use_count() == 1  # no other tensor object (nor a saved variable) shares it
                and torch._C._storage_Use_Count(g.untyped_storage()._cdata) == 2)  # g's and this storage object's
    except (AttributeError, RuntimeError):  # private torch calls: should an upgrade drop them, copy
        return False

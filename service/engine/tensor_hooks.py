"""Tensor hooks for one ``backward`` or ``grad`` step (``Tensor.register_hook`` on the client).

The client records each hooked tensor's hooks at each ``backward()``/``autograd.grad`` call into a
template (one input, the gradient; one output, what replaces it) and names them in the step's
``hooks``: recorded anew at every call, never replayed from an old recording, since a hook reads
Python values that change. ``registered`` puts each on its session tensor with torch's own
``register_hook`` for the duration of the step, running its template (``user_functions.run_bound``,
with every check a template run has), and removes them as the step ends, whatever happens.

A hook that reads the gradient's values (``.item()``, a NaN check, a norm logged) cannot be a template:
the client names an ``observe`` id instead, and the gradient the hook would have seen is kept under it
(a copy, taken as the hook fires). The step keeps those before it commits anything else
(``observed_pairs``, counted and limited as new tensors: a step that fails, on their limit too, keeps
none, as it keeps no ``.grad``) and answers them in the order torch called the hooks (``observed``),
for the client to call its hooks on them then.

The step's answer also names the tensors whose hooks ran (``hooked``): a client keeps a hooked tensor it
no longer refers to for as long as torch would keep the hook (with the graph: until a backward that does
not retain it reaches the tensor), and learns so when to let it go.

torch's ``retain_grad`` keeps a gradient after its tensor's hooks (its own hook runs last), but the
backward step fills its targets with ``autograd.grad``, which captures a non-leaf's gradient before its
hooks when the walk goes on past it. So a retained non-leaf that a hook of the step changes is
captured by one more hook, registered after the step's (``retained_after_hooks``).

A ``post_accumulate`` hook (``Tensor.register_post_accumulate_grad_hook``, run by the client) keeps no
gradient: its ``observe`` id is noted in that order where torch would accumulate the leaf's ``.grad``. The
step computes its grads with ``autograd.grad`` and accumulates them itself, so torch's own
post-accumulate hooks never fire here; a hook on the leaf fires as its gradient is captured, which is
where torch's engine would run its ``AccumulateGrad`` node (the same ready queue), so the order is torch's.

A ``node_hooks`` entry keeps the gradients of a node a ``function`` step named (torch's module backward
hooks, observed: ``_keeping``); ``module_hooks`` run recorded ones (``module_hooks``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import BackwardStep, GradStep, NodeHook, TensorHook

from ..sessions.store import CustomTensor
from . import module_hooks
from .templates import Execute, GradStandIn
from .user_functions import run_bound
from .values import ProgramRun, check_new_ids


class StepHooks:
    """What a step's hooks did while it ran: the gradients observed, by ``observe`` or ``keep`` id in the order
    their hooks ran (``None`` when no hook observes; ``None`` for an id that keeps nothing: a
    ``post_accumulate`` one, a node hook's ``observe``), the ids of the tensors whose hooks ran, the nodes
    named that no graph holds (``gone``), and with post-accumulate hooks the session's leaves in the order the
    backward filled them (``accumulated``)."""

    __slots__ = ("observed", "fired", "gone", "accumulated")

    def __init__(self, observed: dict | None) -> None:
        self.observed = observed
        self.fired: dict[str, None] = {}  # (ordered, once each)
        self.gone: list[str] = []
        self.accumulated: list[str] | None = None


NONE = StepHooks(None)  # a step without hooks (``autograd_steps`` does not enter ``registered`` for one)


@contextlib.contextmanager
def registered(run: ProgramRun, step: BackwardStep | GradStep, execute: Execute) -> Iterator[StepHooks]:
    """The step's hooks on their tensors and nodes while it runs; yields what they did (``StepHooks``)."""
    hooks, node_hooks = step.hooks, step.node_hooks
    if not hooks and not node_hooks and not step.module_hooks:
        yield NONE
        return
    session = run.session
    observing = [h.observe for h in hooks if h.observe is not None]
    for h in node_hooks:
        observing += [h.observe, *h.keep]
    step_hooks = StepHooks({} if observing else None)
    observed, fired = step_hooks.observed, step_hooks.fired
    check_new_ids(session, observing)
    with contextlib.ExitStack() as stack:
        for node_hook in node_hooks:
            node = session.nodes.get(node_hook.node)
            if node is None:  # no graph holds it any more: it runs no more (the client forgets its hooks)
                step_hooks.gone.append(node_hook.node)
                continue
            stack.callback(node.register_hook(_keeping(node_hook, observed)).remove)
        for module_hook in step.module_hooks:  # after: a node's gradients are kept as its hooks were given them
            module_hooks.register(run, module_hook, execute, stack, step_hooks.gone)
        if any(h.post_accumulate for h in hooks) and step.kind == "backward":
            _note_accumulation(session, step_hooks, stack)
        # a leaf's post-accumulate notes after its own hooks, whatever the order given: torch calls them so
        for hook in sorted(hooks, key=lambda h: h.post_accumulate):
            if (hook.template is None) == (hook.observe is None):
                raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: give one of template and observe")
            if hook.post_accumulate:
                value = _accumulated_leaf(session, hook, step.kind == "backward")

                def note(grad, oid=hook.observe):
                    observed.setdefault(oid, None)

                stack.callback(value.register_hook(note).remove)
                continue
            if hook.observe is not None:
                value = _hooked(session, hook.id)

                def keep(grad, oid=hook.observe, tid=hook.id):
                    observed.setdefault(oid, grad.detach().clone())  # what torch's hook would be given
                    fired[tid] = None

                stack.callback(value.register_hook(keep).remove)
                continue
            template = session.templates.get(hook.template)
            if template is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TEMPLATE, f"unknown template {hook.template!r} in this "
                                    "session: send its template step first (a restart of the server keeps none)")
            if len(template.step.inputs) != 1 or len(template.outputs) != 1:
                raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: template {hook.template!r} must "
                                    "take one input (the gradient) and make one output")
            value = _hooked(session, hook.id)
            what = f"a hook on tensor {hook.id!r}"

            def run_hook(grad, template=template, what=what, tid=hook.id):
                fired[tid] = None
                return run_bound(run, template, [GradStandIn(grad)], execute, what)[0]

            stack.callback(value.register_hook(run_hook).remove)
        yield step_hooks


def _keeping(hook: NodeHook, observed: dict):
    """A hook for the node of ``hook``: it notes the node and keeps its gradients as it runs (torch passes a
    node's hook the gradients it passes on and those it was given)."""
    def keep(grad_inputs, grad_outputs):
        grads = grad_inputs if hook.grads == "inputs" else grad_outputs
        if len(grads) != len(hook.keep):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"node hook on {hook.node!r}: keep names {len(hook.keep)} "
                                f"ids for the node's {len(grads)} grad {hook.grads}")
        observed.setdefault(hook.observe, None)
        for tid, g in zip(hook.keep, grads):
            if g is not None:
                observed.setdefault(tid, g.detach().clone())

    return keep


def _note_accumulation(session, step_hooks: StepHooks, stack: contextlib.ExitStack) -> None:
    """Every leaf of the session noted as its gradient is captured (where torch would accumulate it): the
    client refuses a post-accumulate hook's read of a ``.grad`` torch would fill only later."""
    accumulated: list[str] = []
    step_hooks.accumulated = accumulated
    for tid, ct in list(session.tensors.items()):
        value = ct.value
        if value.requires_grad and value._base is None and value.is_leaf:

            def note(grad, tid=tid):
                accumulated.append(tid)

            stack.callback(value.register_hook(note).remove)


@contextlib.contextmanager
def retained_after_hooks(session, hooks: list[TensorHook], targets: list[CustomTensor]) -> Iterator[dict]:
    """Around a backward step's ``autograd.grad``: yields, by position in ``targets``, the gradient each
    retained non-leaf with a hook of the step has after its hooks (see the module's docstring)."""
    after: dict[int, torch.Tensor] = {}
    hooked = {id(session.tensor(h.id)) for h in hooks if h.template is not None}
    handles = []
    for k, ct in enumerate(targets):
        if ct.retains_grad and id(ct) in hooked and not ct.value.is_leaf:
            def keep(grad, k=k) -> None:
                after[k] = grad

            handles.append(ct.value.register_hook(keep))
    try:
        yield after
    finally:
        for handle in handles:
            handle.remove()


def _hooked(session, tid: str):
    value = session.tensor(tid).value
    if not value.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR, f"hook on {tid!r}: cannot register a hook on a tensor that doesn't "
                            "require gradient")
    return value


def _accumulated_leaf(session, hook: TensorHook, accumulates: bool):
    if not accumulates or hook.observe is None or hook.template is not None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: a post_accumulate hook names observe "
                            "alone, in a backward step")
    value = _hooked(session, hook.id)
    if value.grad_fn is not None:  # torch's words
        raise ProtocolError(ErrorCode.OP_ERROR, f"hook on {hook.id!r}: post accumulate grad hooks cannot be "
                            "registered on non-leaf tensors")
    return value


def observed_pairs(hooks: StepHooks) -> list[tuple[str, CustomTensor]]:
    """The observed gradients as new tensors of the session, to keep once the step succeeded (a failing step
    keeps none, as it keeps no ``.grad``)."""
    observed = hooks.observed
    return [] if observed is None else [(oid, CustomTensor(g)) for oid, g in observed.items() if g is not None]


def answer(hooks: StepHooks, result: dict | None) -> dict | None:
    """``result`` naming the observed gradients in the order their hooks ran (every one, or none, ran), the
    tensors whose hooks ran, the nodes gone and the leaves' accumulation order (``StepHooks``)."""
    extra: dict = {}
    if hooks.observed is not None:
        extra["observed"] = list(hooks.observed)
    if hooks.fired:
        extra["hooked"] = list(hooks.fired)
    if hooks.gone:
        extra["gone"] = hooks.gone
    if hooks.accumulated is not None:
        extra["accumulated"] = hooks.accumulated
    return {**(result or {}), **extra} if extra else result

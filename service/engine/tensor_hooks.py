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

A ``post_accumulate`` hook (``Tensor.register_post_accumulate_grad_hook``, run by the client) keeps no
gradient: its ``observe`` id is noted in that order where torch would accumulate the leaf's ``.grad``. The
step computes its grads with ``autograd.grad`` and accumulates them itself, so torch's own
post-accumulate hooks never fire here; a hook on the leaf fires as its gradient is captured, which is
where torch's engine would run its ``AccumulateGrad`` node (the same ready queue), so the order is torch's.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import BackwardStep, GradStep, NodeHook, TensorHook

from ..sessions.custom_tensor import CustomTensor
from . import module_hooks
from .program_run import ProgramRun
from .templates import Execute, GradStandIn
from .user_functions import run_bound
from .values import check_new_ids


@contextlib.contextmanager
def registered(run: ProgramRun, step: BackwardStep | GradStep, execute: Execute) -> Iterator[dict | None]:
    """The step's hooks on their tensors and nodes while it runs; yields the gradients observed so far, by
    ``observe`` or ``keep`` id in the order their hooks ran (``None`` when no hook observes; ``None`` for an
    id that keeps nothing: a ``post_accumulate`` one, a node hook's ``observe``)."""
    hooks, node_hooks = step.hooks, step.node_hooks
    if not hooks and not node_hooks and not step.module_hooks:
        yield None
        return
    session = run.session
    observing = [h.observe for h in hooks if h.observe is not None]
    for h in node_hooks:
        observing += [h.observe, *h.keep]
    observed: _Observed | None = _Observed() if observing or step.module_hooks else None
    check_new_ids(session, observing)
    with contextlib.ExitStack() as stack:
        for node_hook in node_hooks:
            node = session.nodes.get(node_hook.node)
            if node is None:  # no graph holds it any more: it runs no more (the client forgets its hooks)
                observed.gone.append(node_hook.node)
                continue
            stack.callback(node.register_hook(_keeping(node_hook, observed)).remove)
        for module_hook in step.module_hooks:  # after: a node's gradients are kept as its hooks were given them
            module_hooks.register(run, module_hook, execute, stack, observed.gone)
        if any(h.post_accumulate for h in hooks) and step.kind == "backward":
            _note_accumulation(session, observed, stack)
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

                def keep(grad, oid=hook.observe):
                    observed.setdefault(oid, grad.detach().clone())  # what torch's hook would be given

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

            def run_hook(grad, template=template, what=what):
                return run_bound(run, template, [GradStandIn(grad)], execute, what)[0]

            stack.callback(value.register_hook(run_hook).remove)
        yield observed


def _hooked(session, tid: str):
    value = session.tensor(tid).value
    if not value.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR, f"hook on {tid!r}: cannot register a hook on a tensor that doesn't "
                            "require gradient")
    return value


class _Observed(dict):
    """The kept gradients by id, in the order their hooks ran; ``gone``: the nodes named that no graph holds;
    ``accumulated``: with post-accumulate hooks, the session's leaves in the order the backward filled them."""

    def __init__(self) -> None:
        super().__init__()
        self.gone: list[str] = []
        self.accumulated: list[str] | None = None


def _note_accumulation(session, observed: _Observed, stack: contextlib.ExitStack) -> None:
    """Every leaf of the session noted as its gradient is captured (where torch would accumulate it): the
    client refuses a post-accumulate hook's read of a ``.grad`` torch would fill only later."""
    observed.accumulated = []
    for tid, ct in list(session.tensors.items()):
        value = ct.value
        if value.requires_grad and value._base is None and value.is_leaf:

            def note(grad, tid=tid):
                observed.accumulated.append(tid)

            stack.callback(value.register_hook(note).remove)


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


def _accumulated_leaf(session, hook: TensorHook, accumulates: bool):
    if not accumulates or hook.observe is None or hook.template is not None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: a post_accumulate hook names observe "
                            "alone, in a backward step")
    value = _hooked(session, hook.id)
    if value.grad_fn is not None:  # torch's words
        raise ProtocolError(ErrorCode.OP_ERROR, f"hook on {hook.id!r}: post accumulate grad hooks cannot be "
                            "registered on non-leaf tensors")
    return value


def observed_pairs(observed: dict | None) -> list[tuple[str, CustomTensor]]:
    """The observed gradients as new tensors of the session, to keep once the step succeeded (a failing step
    keeps none, as it keeps no ``.grad``)."""
    return [] if observed is None else [(oid, CustomTensor(g)) for oid, g in observed.items() if g is not None]


def answer_observed(observed: dict | None, result: dict | None) -> dict | None:
    """``result`` naming the observed gradients in the order their hooks ran (every one, or none, ran)."""
    if observed is None:
        return result
    answer = {**(result or {}), "observed": list(observed)}
    if observed.gone:
        answer["gone"] = observed.gone
    if observed.accumulated is not None:
        answer["accumulated"] = observed.accumulated
    return answer

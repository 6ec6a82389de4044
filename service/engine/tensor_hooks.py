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
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import TensorHook

from ..sessions.custom_tensor import CustomTensor
from .program_run import ProgramRun
from .templates import Execute, GradStandIn
from .user_functions import run_bound
from .values import check_new_ids


class StepHooks:
    """What a step's hooks did while it ran: the gradients observed, by ``observe`` id in the order their
    hooks ran (``None`` when no hook observes), and the ids of the tensors whose hooks ran."""

    __slots__ = ("observed", "fired")

    def __init__(self, observed: dict | None) -> None:
        self.observed = observed
        self.fired: dict[str, None] = {}  # (ordered, once each)


_NONE = StepHooks(None)


@contextlib.contextmanager
def registered(run: ProgramRun, hooks: list[TensorHook], execute: Execute) -> Iterator[StepHooks]:
    """The step's hooks on their tensors while it runs; yields what they did (``StepHooks``)."""
    if not hooks:
        yield _NONE
        return
    session = run.session
    observing = [h.observe for h in hooks if h.observe is not None]
    step_hooks = StepHooks({} if observing else None)
    observed, fired = step_hooks.observed, step_hooks.fired
    check_new_ids(session, observing)
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            if (hook.template is None) == (hook.observe is None):
                raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: give one of template and observe")
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


def observed_pairs(hooks: StepHooks) -> list[tuple[str, CustomTensor]]:
    """The observed gradients as new tensors of the session, to keep once the step succeeded (a failing step
    keeps none, as it keeps no ``.grad``)."""
    observed = hooks.observed
    return [] if observed is None else [(oid, CustomTensor(g)) for oid, g in observed.items()]


def answer(hooks: StepHooks, result: dict | None) -> dict | None:
    """``result`` naming the observed gradients in the order their hooks ran (every one, or none, ran) and
    the tensors whose hooks ran."""
    extra: dict = {}
    if hooks.observed is not None:
        extra["observed"] = list(hooks.observed)
    if hooks.fired:
        extra["hooked"] = list(hooks.fired)
    return {**(result or {}), **extra} if extra else result

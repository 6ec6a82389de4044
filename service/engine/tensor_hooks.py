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
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import TensorHook

from ..sessions.custom_tensor import CustomTensor
from .program_run import ProgramRun
from .templates import Execute, GradStandIn
from .user_functions import run_bound
from .values import check_new_ids


@contextlib.contextmanager
def registered(run: ProgramRun, hooks: list[TensorHook], execute: Execute) -> Iterator[dict | None]:
    """The step's hooks on their tensors while it runs; yields the gradients observed so far, by ``observe``
    id in the order their hooks ran (``None`` when no hook observes)."""
    if not hooks:
        yield None
        return
    session = run.session
    observing = [h.observe for h in hooks if h.observe is not None]
    observed: dict | None = {} if observing else None
    check_new_ids(session, observing)
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            if (hook.template is None) == (hook.observe is None):
                raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: give one of template and observe")
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


def observed_pairs(observed: dict | None) -> list[tuple[str, CustomTensor]]:
    """The observed gradients as new tensors of the session, to keep once the step succeeded (a failing step
    keeps none, as it keeps no ``.grad``)."""
    return [] if observed is None else [(oid, CustomTensor(g)) for oid, g in observed.items()]


def answer_observed(observed: dict | None, result: dict | None) -> dict | None:
    """``result`` naming the observed gradients in the order their hooks ran (every one, or none, ran)."""
    return result if observed is None else {**(result or {}), "observed": list(observed)}

"""Tensor hooks for one ``backward`` or ``grad`` step (``Tensor.register_hook`` on the client).

The client records each hooked tensor's hooks at each ``backward()``/``autograd.grad`` call into a
template (one input, the gradient; one output, what replaces it) and names them in the step's
``hooks``: recorded anew at every call, never replayed from an old recording, since a hook reads
Python values that change. ``registered`` puts each on its session tensor with torch's own
``register_hook`` for the duration of the step, running its template (``user_functions.run_bound``,
with every check a template run has), and removes them as the step ends, whatever happens.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import TensorHook

from .program_run import ProgramRun
from .templates import Execute, GradStandIn
from .user_functions import run_bound


@contextlib.contextmanager
def registered(run: ProgramRun, hooks: list[TensorHook], execute: Execute) -> Iterator[None]:
    if not hooks:
        yield
        return
    session = run.session
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            template = session.templates.get(hook.template)
            if template is None:
                raise ProtocolError(ErrorCode.UNKNOWN_TEMPLATE, f"unknown template {hook.template!r} in this "
                                    "session: send its template step first (a restart of the server keeps none)")
            if len(template.step.inputs) != 1 or len(template.outputs) != 1:
                raise ProtocolError(ErrorCode.BAD_REQUEST, f"hook on {hook.id!r}: template {hook.template!r} must "
                                    "take one input (the gradient) and make one output")
            value = session.tensor(hook.id).value
            if not value.requires_grad:
                raise ProtocolError(ErrorCode.OP_ERROR, f"hook on {hook.id!r}: cannot register a hook on a tensor "
                                    "that doesn't require gradient")
            what = f"a hook on tensor {hook.id!r}"

            def run_hook(grad, template=template, what=what):
                return run_bound(run, template, [GradStandIn(grad)], execute, what)[0]

            stack.callback(value.register_hook(run_hook).remove)
        yield

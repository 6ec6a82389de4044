"""A backward or grad step's ``module_hooks``: torch's module backward hooks that return new gradients,
recorded by the client into one template per module call and run inside this step's autograd.

torch puts a module call's hooks on two identity nodes (its ``BackwardHookFunction`` applied to the
module's outputs, then to its inputs), which ``function`` steps named. The template takes the gradients
the outputs' node is given, then those the inputs' node passes on, and makes what replaces them
(``ModuleHook.outputs`` / ``inputs``: indices into its inputs, then its outputs, as a ``function`` step's
``grads``; ``null``: no gradient flows on there). The outputs' node keeps what it was given and passes on its replacements (the pre-hooks',
the template run with zeros for the inputs' gradients, which its recording never read for them); the
inputs' node runs the template on those kept gradients and its own, and passes on its replacements (the
hooks'): what torch's closures compute, in the same nodes. A gradient that is ``None`` there (torch would
give the hook ``None``) cannot be bound: the step fails, naming it.
"""

from __future__ import annotations

import contextlib

import torch

from remote_autograd.proto import ErrorCode, ProtocolError, dtype_from_name
from remote_autograd.proto.messages import ModuleHook

from .templates import Execute, GradStandIn
from .user_functions import run_bound
from .values import ProgramRun


def register(run: ProgramRun, hook: ModuleHook, execute: Execute, stack: contextlib.ExitStack, gone: list) -> None:
    """``hook`` on its nodes for the step (removed by ``stack``); a named node no graph holds is ``gone``."""
    session = run.session
    template = None if hook.template is None else session.templates.get(hook.template)
    if template is None and hook.template is not None:
        raise ProtocolError(ErrorCode.UNKNOWN_TEMPLATE, f"unknown template {hook.template!r} in this session: send "
                            "its template step first (a restart of the server keeps none)")
    n_out, n_in = len(hook.outputs), len(hook.inputs)
    shapes = [] if template is None else [(tuple(i.shape), dtype_from_name(i.dtype)) for i in template.step.inputs]
    known = n_out + n_in + (0 if template is None else len(template.outputs))
    if ((template is not None and len(shapes) != n_out + n_in)
            or any(k is not None and k >= known for k in (*hook.outputs, *hook.inputs))
            or any(None in s for s, _ in shapes)):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"module hook: template {hook.template!r} takes {len(shapes)} "
                            f"inputs for {n_out} output and {n_in} input gradients, and its indices must name "
                            f"one of its {known} tensors (its inputs' shapes given whole)")
    what = f"a module backward hook (template {hook.template!r})"
    given: list = []  # what the outputs' node was given, for the inputs' node

    def replaced(grads: tuple, picks: list) -> tuple:
        if any(g is None for g in grads):
            raise ProtocolError(ErrorCode.OP_ERROR, f"{what}: a gradient it was recorded on is None in this "
                                "backward (an output no gradient reached): torch would give the hook None")
        values = list(grads)
        if template is not None:
            values += run_bound(run, template, [GradStandIn(g) for g in grads], execute, what)
        return tuple(None if k is None else values[k] for k in picks)

    def on_outputs(grad_inputs, grad_outputs):
        given[:] = [grad_outputs]
        if all(k == j for j, k in enumerate(hook.outputs)):
            return None  # no pre-hook replaces them
        if template is None:  # (the inputs' gradients are not read)
            return tuple(None if k is None else grad_outputs[k] for k in hook.outputs)
        zeros = [torch.zeros(s, dtype=d, device=grad_outputs[0].device) for s, d in shapes[n_out:]]
        return replaced((*grad_outputs, *zeros), hook.outputs)

    def on_inputs(grad_inputs, grad_outputs):
        if not given:  # torch's closure: the gradient reached the inputs without the outputs (a double backward)
            return None
        return replaced((*given[0], *grad_inputs), hook.inputs)

    for node_id, fn in ((hook.outputs_node, on_outputs), (hook.inputs_node, on_inputs)):
        if node_id is None:
            continue
        node = session.nodes.get(node_id)
        if node is None:
            gone.append(node_id)
            continue
        stack.callback(node.register_hook(fn).remove)

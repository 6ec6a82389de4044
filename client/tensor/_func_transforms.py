"""torch.func's transforms (``grad``, ``vmap``, ``jacrev``, ``jacfwd``, ...) meeting a remote tensor.

A transform wraps its inputs in functorch tensors of its own and runs the user's function on
them *locally*, level by level, below ``__torch_function__``: the wrapped remote tensor reaches our
entry point beside wrappers the SDK cannot send (torch then says "found at least two devices,
remote:0 and remote:0", or an op of forward-mode AD is missing). None of it can give torch's
answer, so the first remote op under a transform refuses, naming the transform the user called.
(An op a transform sends below its level, as ``vmap`` over ``grad`` does, reaches
``__torch_dispatch__``, whose refusal names torch.func's transforms in general: there nothing tells
a transform's level from any other aten call.)
``torch.func.functional_call`` is no transform (it swaps a module's parameters) and runs as usual.
"""

from __future__ import annotations

from typing import Callable

import torch

active: Callable[[], bool] = torch._C._are_functorch_transforms_active  # what autograd.Function.apply asks too

_CALLED = {"Grad": "torch.func.grad / grad_and_value / vjp / jacrev", "Vmap": "torch.func.vmap",
           "Jvp": "torch.func.jvp / jacfwd / hessian", "Functionalize": "torch.func.functionalize"}


def refused(func: Callable) -> RuntimeError:
    """The error for ``func`` called on a remote tensor while a transform runs (``active()``)."""
    top = torch._C._functorch.peek_interpreter_stack()
    kind = top.key().name if top is not None else ""
    called = _CALLED.get(kind, "a torch.func transform")
    name = getattr(func, "__name__", str(func))
    return RuntimeError(
        f"{called} on remote tensors ({name} ran under it): torch.func transforms run the function locally on "
        "wrapped tensors, and a remote tensor's values live on the server, so they cannot run here. For "
        "gradients use loss.backward() or torch.autograd.grad on the device (per-sample gradients: a loop "
        "over the samples, or torch.func on local copies `.detach().cpu()`)"
    )

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
Under ``torch.compile(..., backend="remote")`` dynamo inlines ``vmap`` and ``grad`` into the graph, which
runs them on the server (``capture/_functorch``); while it traces, a handle's facts are read under the
transform (``RemoteTensor.__torch_function__`` answers those, and refuses an op on a real handle).
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
        "wrapped tensors, and a remote tensor's values live on the server, so they cannot run here. Wrap the "
        "call in torch.compile(..., backend=\"remote\") with no graph break inside the transform (a print, an "
        ".item()): the transform then runs on the server (per-sample "
        "gradients: torch.compile(lambda p, x, y: vmap(grad(loss), in_dims=(None, 0, 0))(p, x, y), "
        "backend=\"remote\")); or use loss.backward() / torch.autograd.grad on the device"
    )


def forward_mode() -> bool:
    """Whether a forward-mode transform (``jvp``, ``jacfwd``, ``hessian``) is on functorch's stack."""
    stack = torch._C._functorch.get_interpreter_stack()
    return stack is not None and any(i.key().name == "Jvp" for i in stack)


def forward_mode_refused(func: Callable) -> RuntimeError:
    """The error for a traced op under a forward-mode transform: torch.compile(backend="remote") runs
    ``vmap`` and ``grad`` on the server, not ``jvp`` (dynamo's tracing of a backward through forward-mode
    tensors of this device aborts the process in torch's autograd thread: refused before it)."""
    name = getattr(func, "__name__", str(func))
    return RuntimeError(
        f"torch.func.jvp / jacfwd / hessian on remote tensors ({name} ran under it), under "
        "torch.compile(backend=\"remote\"): forward-mode transforms are not supported on remote tensors; "
        "vmap, grad, grad_and_value, vjp and jacrev are (hessian: jacrev(jacrev(f)))"
    )

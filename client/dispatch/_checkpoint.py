"""``torch.utils.checkpoint(..., use_reentrant=True)``'s ``CheckpointFunction`` recorded like any user
Function (``_user_functions``), with what its backward reads beyond its ctx.

Its backward recomputes the forward (``ctx.run_function`` on the saved inputs, grad on), runs a backward
of its own through it, and returns the inputs' grads. Two things it reads are not on its ctx:

- the module's parameters and buffers, which it never saves: when ``run_function`` is a module or one
  of its methods (``checkpoint(layer, x)``), or a ``functools.partial`` of one (Hugging Face's
  ``partial(forward, layer, **kwargs)``), the module runs on the
  recording's stand-ins of them (torch's own ``_reparametrize_module``). They are bound *live* on the
  server (the session's own tensors, not copies): the inner backward accumulates their ``.grad`` there,
  as torch's does. Any other tensor the function reads is refused as any user Function's unsaved one.
- the device's random state at the forward, which torch keeps for a CUDA device (``fwd_device_states``)
  so that a dropout draws the forward's numbers again: ``rng_state_at_forward`` queues a ``get_rng_state``
  step as the forward's first op is queued (the state stays on the server: no round trip), and the
  template sets it before the recomputation and puts the generator back after it, as ``fork_rng`` does.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils.checkpoint import CheckpointFunction

from remote_autograd.proto.messages import CallStep

from .._core import RemoteTensor, call_op
from ..session._steps import Origin, make_step

UNSAVED = ("torch.utils.checkpoint(..., use_reentrant=True): the checkpointed function reads a remote tensor that is "
           "neither its argument nor a parameter or buffer of the module it is (or is a method of), which the SDK "
           "cannot record for the server's backward: pass it as an argument, or pass use_reentrant=False")
_CPU_STATE, _CUDA_STATE = (5056,), (16,)  # the bytes of torch's generator states (mt19937; philox seed and offset)


def is_checkpoint(cls: type) -> bool:
    return cls is CheckpointFunction


def rng_state_at_forward(cls: type, args: tuple) -> RemoteTensor | None:
    """The session generator's state as a checkpoint's forward begins (a handle: the value stays there)."""
    if cls is not CheckpointFunction or len(args) < 2 or not args[1]:  # preserve_rng_state
        return None
    session = next((a._session for a in args if isinstance(a, RemoteTensor)), None)
    if session is None:
        return None
    tid = session.new_id()
    state = RemoteTensor._new(session, tid, _CPU_STATE if session.remote_device == "cpu" else _CUDA_STATE,
                              torch.uint8)
    session.enqueue(make_step(CallStep, op="get_rng_state", args=[], out=[tid], grad_enabled=False),
                    Origin("get_rng_state", None, [weakref.ref(state)]))
    return state


def _module_of(run_function: Any) -> nn.Module | None:
    """The module ``run_function`` runs: itself, the module of a bound method, or the module a
    ``functools.partial`` passes first (Hugging Face's ``partial(forward, layer, **kwargs)``)."""
    while isinstance(run_function, functools.partial):
        if run_function.args and isinstance(run_function.args[0], nn.Module):
            return run_function.args[0]
        run_function = run_function.func
    module = run_function if isinstance(run_function, nn.Module) else getattr(run_function, "__self__", None)
    return module if isinstance(module, nn.Module) else None


class Extras:
    """What a checkpoint's backward reads besides its ctx (see the module's docstring)."""

    def __init__(self, ctx: Any, session: Any) -> None:
        self.module = _module_of(ctx.run_function)
        self.names: list[str] = []
        self.live: list[RemoteTensor] = []  # the module's remote parameters and buffers
        if self.module is not None:
            for name, t in (*self.module.named_parameters(remove_duplicate=False),
                            *self.module.named_buffers(remove_duplicate=False)):
                if isinstance(t, RemoteTensor) and t._session is session:
                    self.names.append(name)
                    self.live.append(t)

    @contextlib.contextmanager
    def recording(self, recorder: Any, handles: list, state: RemoteTensor | None) -> Iterator[None]:
        """The module running on the recording's ``handles`` of its parameters and buffers, and the
        generator at ``state`` (the recording's handle of the forward's), put back after."""
        with contextlib.ExitStack() as stack:
            if self.module is not None:
                stack.enter_context(_reparametrize_module(self.module, dict(zip(self.names, handles)),
                                                          tie_weights=True, strict=False))
            if state is not None:
                now = recorder.new_id()
                recorder.enqueue(make_step(CallStep, op="get_rng_state", args=[], out=[now], grad_enabled=False))
                call_op(recorder, "set_rng_state", [state], {}, n_out=0)
                stack.callback(lambda: recorder.enqueue(make_step(CallStep, op="set_rng_state", args=[{"ref": now}],
                                                                  out=[], grad_enabled=False)))
            yield

"""Whether a call runs inside a user's ``autograd.Function``'s forward: run, or refused where torch would
record it (``_frame_return`` waits for its ``apply`` to return). It reads the Python stack, with
``_steps.where`` for the line an error names.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, Iterator

import torch

from ..device._device import DEVICE_TYPE
from . import _frame_return
from ._steps import where

_APPLY_CODE = torch.autograd.function.Function.apply.__func__.__code__
_FWD_GRAD_ENABLED = torch._C._is_fwd_grad_enabled
_ON_EVENT = _frame_return.ON_EVENT_CODE  # the profile callback's frame: the outer apply returns below it


def refuse_custom_function(func: Callable) -> None:
    """Inside a user's ``autograd.Function``: let its forward run unless its gradient would be lost.

    torch runs a Function's forward with grad off and never shows us ``apply`` itself, so we
    look for ``Function.apply`` on the stack. Where torch records nothing (no tensor input
    requires grad, or the caller's grad mode was off) the forward's ops are ordinary calls and
    the result is torch's. Where it records the call, the node lives in the client's autograd,
    which the server's backward never reaches: a remote input would get no gradient, nor would
    a local one through a remote output. Such a call is refused. (A Function on local tensors
    whose forward only reads remote values, with local outputs, is an ordinary local node.)
    Which case it is shows only as ``apply`` returns (the caller's grad mode is hidden until
    then): each enclosing ``apply`` with an input that requires grad is watched
    (``_frame_return``) and refused at its return if grad mode is on there.
    torch also turns forward-mode AD off around every Function's forward: while it is on,
    no forward is running and the walk (an optimizer's every op, under no_grad) is skipped.
    """
    if _FWD_GRAD_ENABLED():
        return
    f = sys._getframe(2)
    if getattr(_recording, "on", False):
        _refuse_nested(f)
        return
    while f is not None:  # the whole stack: an outer Function around an inner one needs its check too
        if f.f_code is _APPLY_CODE and not _frame_return.watching(f):
            _watch_apply(f)
        f = f.f_back


# ``dispatch/_user_functions``' ``attach`` and ``before_forward``, above this room: it registers them as it is
# imported (a table this module defines and that one fills, not a slot the package wires).
# ``attach`` makes a recorded call on remote outputs a node of the server's autograd, or raises;
# ``before_forward(cls, args)`` runs as the forward's first remote op is queued: what it gives is
# restored as apply returns, whatever happens, then goes to ``attach``.
ATTACH: list[Callable] = []
BEFORE_FORWARD: list[Callable] = []
_recording = threading.local()  # .on: a Function's backward is being recorded (``recording``)


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """While a Function's backward is recorded (inside a profile callback, where no return is seen):
    a Function the backward applies is refused where torch would record it, never watched."""
    before = getattr(_recording, "on", False)
    _recording.on = True
    try:
        yield
    finally:
        _recording.on = before


def _refuse_nested(f) -> None:
    """A Function applied inside a backward being recorded (which runs in the profile callback of the outer
    ``apply``'s return, where no return is seen): refused where torch could record it, never lost."""
    while f is not None and f.f_code is not _ON_EVENT:
        if f.f_code is _APPLY_CODE:
            apply_locals = f.f_locals
            if any(isinstance(a, torch.Tensor) and a.requires_grad
                   for a in (*apply_locals.get("args", ()), *(apply_locals.get("kwargs") or {}).values())):
                error = _recorded_error(apply_locals.get("cls"), where(f.f_back))
                raise RuntimeError(f"{error} (It is applied inside another Function's backward, which the SDK "
                                   "records as it runs: refused.)")
        f = f.f_back


def _watch_apply(apply_frame) -> None:
    apply_locals = apply_frame.f_locals
    remote_needs, local_needs = False, False  # torch's rule: a tensor argument (positional or named) requires grad
    for a in (*apply_locals.get("args", ()), *(apply_locals.get("kwargs") or {}).values()):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            if _on_the_device(a):
                remote_needs = True
            else:
                local_needs = True
    if not (remote_needs or local_needs) or torch.is_inference_mode_enabled():  # (kept on around the forward)
        return
    cls, line = apply_locals.get("cls"), where(apply_frame.f_back)
    by_keyword = any(isinstance(a, torch.Tensor) for a in (apply_locals.get("kwargs") or {}).values())
    error = _recorded_error(cls, line, _BY_KEYWORD if by_keyword and not local_needs else _LOCAL)
    args = tuple(apply_locals.get("args", ()))
    attachable = ATTACH and not local_needs and not by_keyword
    prepared = None

    def check(output) -> None:  # output None: the forward raised (or made nothing)
        if prepared is not None:
            prepared.restore()
        if output is None or not torch.is_grad_enabled():
            return
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
        remote_out = any(_on_the_device(o) for o in tensors)
        if not (remote_needs or remote_out):
            return
        if attachable and remote_out and all(_on_the_device(o) for o in tensors):
            ATTACH[0](cls, args, tuple(outputs), line, prepared)  # the backward recorded and attached, or an error
            return
        raise error

    def abandon() -> None:
        if prepared is not None:
            prepared.restore()

    if not _frame_return.watch(apply_frame, check, abandon):  # another profiler is set: no way to wait for return
        raise _recorded_error(cls, line, "A profiler is active (another profile function), so the SDK cannot see "
                              "apply return, where it reads the caller's grad mode and records the backward: it "
                              "refuses either way")
    if attachable and BEFORE_FORWARD:  # once the return is watched: check undoes it
        prepared = BEFORE_FORWARD[0](cls, args)


def _on_the_device(t: torch.Tensor) -> bool:
    return t.device.type == DEVICE_TYPE


_LOCAL = ("a local tensor (an input that requires grad, or an output) would leave it in the client's autograd, which "
          "the server's backward never reaches: its gradient would be lost")
_BY_KEYWORD = "a tensor passed by keyword, which the SDK does not record: its gradient would be lost"


def _recorded_error(cls, line: str | None, why: str = _LOCAL) -> RuntimeError:
    """The error for a Function torch records on remote tensors, in the words of what the user wrote."""
    name = getattr(cls, "__name__", "a torch.autograd.Function")
    module = getattr(cls, "__module__", "")
    at = f" ({line})" if line else ""
    if name == "CheckpointFunction" and module == "torch.utils.checkpoint":
        return RuntimeError(
            f"torch.utils.checkpoint(..., use_reentrant=True) on remote tensors, with grad on: {why}. Pass "
            "use_reentrant=False (same gradients; Hugging Face: model.gradient_checkpointing_enable("
            f"gradient_checkpointing_kwargs={{'use_reentrant': False}})){at}"
        )
    return RuntimeError(
        f"{name}.apply with grad mode on and an input that requires grad, on remote tensors: torch would record "
        f"the call, and the SDK runs {name}.backward inside the server's backward where it can; here it cannot: "
        f"{why}. Its forward alone runs "
        "where torch records nothing (under torch.no_grad() or torch.inference_mode(), or on inputs that need no "
        "gradient). For the gradient, move its tensors to the device, or register the Function as a server op (@op "
        f"in a module named by REMOTE_AUTOGRAD_OP_MODULES; see README 'Custom ops'), called as sess.ops.<name>(...){at}"
    )

"""Where the user's call came from: the ``file:line`` errors name, and the ``autograd.Function``
whose forward we might be inside. Both read the Python stack; neither needs any other module of ours.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import torch

_CLIENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # client/, not client/session/
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_APPLY_CODE = torch.autograd.function.Function.apply.__func__.__code__
_FWD_GRAD_ENABLED = torch._C._is_fwd_grad_enabled


USER, OURS, TORCHS = 0, 1, 2  # whose code a frame runs (``frame_kind``)


def where() -> str | None:
    """``file:line`` of the user's code that made the current call (first frame outside torch and us)."""
    return user_line(sys._getframe(2))


def user_line(f) -> str | None:
    """``file:line`` of the first frame from ``f`` up that runs neither torch's code nor ours."""
    while f is not None:
        code = f.f_code
        if frame_kind(code) == USER:
            return f"{code.co_filename}:{f.f_lineno}"
        f = f.f_back
    return None


def frame_kind(code) -> int:
    """``USER``, ``OURS`` or ``TORCHS``: whose code ``code`` is."""
    # Keyed by id: a code object's own hash reads its whole body each time (big torch functions).
    known = _KIND_OF_CODE.get(id(code))
    if known is None:  # once per code object: optimizer steps walk a dozen torch frames per op
        if len(_KIND_OF_CODE) > 50_000:
            _KIND_OF_CODE.clear()
        name = code.co_filename
        kind = OURS if name.startswith(_CLIENT_DIR) else TORCHS if name.startswith(_TORCH_DIR) else USER
        known = _KIND_OF_CODE[id(code)] = (code, kind)
    return known[1]


# id(code) -> (code, whose it is); the code is kept so that its id is not reused
_KIND_OF_CODE: dict[int, tuple] = {}


def refuse_custom_function(func: Callable) -> None:
    """Raise if we are inside a user's ``autograd.Function.forward``: its backward would be lost.

    torch runs a Function's forward with grad disabled and never shows us ``apply``
    itself, so we look for ``Function.apply`` on the stack (only when grad is off).
    torch also turns forward-mode AD off around every Function's forward: while it is on,
    no forward is running and the walk (an optimizer's every op, under no_grad) is skipped.
    """
    if _FWD_GRAD_ENABLED():
        return
    f = sys._getframe(2)
    for _ in range(64):
        if f is None:
            return
        if f.f_code is _APPLY_CODE:
            cls = f.f_locals.get("cls")
            name = getattr(cls, "__name__", "a torch.autograd.Function")
            if name == "BackwardHookFunction":  # torch's own, for nn.Module full backward hooks
                raise RuntimeError(
                    "a module backward hook (register_full_backward_hook / register_full_backward_pre_hook) is "
                    "set on a module run on remote tensors: the hook would have to run inside the server's "
                    "backward, so it would never be called. Remove the hook, or read `.grad` after backward."
                )
            raise RuntimeError(
                f"{name}.apply was called on RemoteTensors: its forward would run as plain remote ops "
                f"and its backward on the client, so the gradient would be silently lost. Register the "
                f"Function as a server op instead (@op in a module named by REMOTE_AUTOGRAD_OP_MODULES; "
                f"see README 'Custom ops') and call it as sess.ops.<name>(...)."
            )
        f = f.f_back

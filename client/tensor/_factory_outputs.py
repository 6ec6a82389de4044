"""Factory outputs whose ``requires_grad`` torch sets after our device kernel returned.

``torch.zeros(3, device=sess.device, requires_grad=True)`` runs the kernel in ``_kernels``,
then torch sets the flag on the C++ side, where the handle cannot see it. The kernels note
each output here; ``RemoteTensor.__torch_function__`` (every entry of the SDK) settles
them before it does anything else. Its own module so that the tensor reads it without
importing the kernels, which sit above it.
"""

from __future__ import annotations

import threading

import torch


class _Made(threading.local):
    """Factory outputs (per thread) whose requires_grad torch may still set, held weakly: torch
    reuses the returned tensor only when nothing else holds it (else it detaches it, through us)."""

    def __init__(self) -> None:
        self.refs: list = []


MADE = _Made()


def settle_requires_grad() -> None:
    """Give factory outputs the ``requires_grad`` torch set on them after our kernel returned.

    Called at the SDK's entry points (every ``__torch_function__`` call of a RemoteTensor):
    torch sets the flag right after the kernel, before user code can use the tensor.
    """
    made, MADE.refs = MADE.refs, []
    for ref in made:
        t = ref()
        if t is None:
            continue
        with torch._C.DisableTorchFunctionSubclass():
            wanted = torch.Tensor.requires_grad.__get__(t)
        if wanted and not t._rg:  # torch set the C++ flag: the handle's follows (and queues its step)
            t.requires_grad_(True)

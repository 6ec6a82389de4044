"""The autograd graph's saved tensors count against the session while the graph keeps them.

An op recorded for backward saves tensors (``sin`` its input, ``exp`` its output, a
composite op its intermediates); the graph keeps them alive after the client frees every
id that named them. Uncounted, a chain of 150 ``sin`` on 16 MiB tensors that freed each
id as it went held 2.4 GB while the session was charged 32 MiB.

``counting_saved(session, limit)`` wraps a program's steps in
``torch.autograd.graph.saved_tensors_hooks``: pack counts one more reference to the saved
tensor's storage in the session's ``StorageLedger`` (charged, and 413 against ``limit``,
only when the session does not hold that storage already) and returns a small ``_Saved``
holding a detached alias; unpack hands the alias back (autograd gives it the saved
node's graph again, so values, gradients and double backward are torch's own). The
version torch checks at unpack without hooks is checked here (an in-place write to a saved
tensor is torch's own error at backward). The reference goes when autograd drops the ``_Saved`` (a backward without ``retain_graph``,
the last id of the graph freed): exactly as long as the graph keeps the bytes.
Detaching matters: a saved output holding itself (its ``grad_fn`` saves it) would be a
cycle through C++ that nothing collects.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..sessions.store import Session


class _Saved:
    """What a graph node keeps instead of the tensor: the alias, its version when saved, and the
    ledger key to give back."""

    __slots__ = ("tensor", "version", "key", "unpin")

    def __init__(self, tensor: torch.Tensor, key: object, unpin) -> None:
        self.tensor, self.version, self.key, self.unpin = tensor, tensor._version, key, unpin

    def __del__(self) -> None:  # the node freed it: may run on any thread, so it only queues the key
        self.unpin(self.key)


def pinned(session: "Session", t: torch.Tensor, limit: int) -> _Saved:
    """``t``'s storage counted while what is returned lives, as a graph node's saved tensor is (a checkpoint
    region keeps the tensors its function reads: ``checkpoint_regions``)."""
    return _Saved(t.detach(), session.storages.pin(t, limit), session.storages.unpin)


def counting_saved(session: "Session", limit: int) -> contextlib.AbstractContextManager:
    """The hooks that charge what the graph saves to ``session`` (see the module's docstring)."""
    ledger = session.storages

    def pack(t: torch.Tensor):
        if t.is_meta:  # the meta check's own graphs hold no memory
            return t
        return _Saved(t.detach(), ledger.pin(t, limit), ledger.unpin)

    def unpack(saved):
        if type(saved) is not _Saved:
            return saved
        t = saved.tensor
        if t._version != saved.version:  # with hooks torch leaves this check to them (the alias shares the counter)
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{t.type()} {list(t.shape)}], is at version {t._version}; expected version {saved.version} "
                "instead. Hint: the backtrace further above shows the operation that failed to compute its "
                "gradient. The variable in question was changed in there or anywhere later. Good luck!")
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

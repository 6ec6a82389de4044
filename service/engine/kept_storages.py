"""``keeps_storages``: the in-place steps after which no byte is counted again (a speed path).

The plain path it replaces: after an in-place step the runner counts again the storages of every
tensor the step names (``step_kinds.remeasure``, ``StorageLedger.remeasure``), because some in-place
ops change what a tensor holds: ``resize_`` grows a storage, ``set_`` and ``x.data = y`` point a
tensor at another, an ``out=`` tensor is resized, an op of our own may do anything. A foreach
optimizer step names every parameter, grad and state of a group, so on the plain path the
re-count walks them all, every step.

torch's own elementwise in-place arithmetic writes into its target as it is: the result has the
target's shape (broadcasting never grows a target), no storage is swapped or resized, and a kernel
that fails stops before its first write or writes in place. Those ops (their entry's
``keeps_storage``, declared in the op surface's generator: ``tools/derive_ops/_declared.py``, and
every in-place ``_foreach_`` op: lists of the same), without ``out=``, skip the re-count; every
other in-place step is counted again as before. ``tests/service/engine/test_kept_storages.py`` runs
each of them both ways and compares the counts.
"""

from __future__ import annotations

from remote_autograd.proto.messages import CallStep


def keeps_storages(call, step: CallStep) -> bool:
    """Whether in-place ``step`` (its resolved ``call``) leaves every storage it names as it was."""
    return call.entry.keeps_storage and not (step.kwargs and "out" in step.kwargs)  # out=: resized

"""``owned``: whether a gradient autograd handed back can become a ``.grad`` as it is, without a copy.

A speed path. The plain path it stands in for is cloning every new grad
(``g.clone()``), which is always safe: autograd may hand back one tensor for several
inputs (``add``'s backward), the ``gradient=`` the client sent, an expanded view or a
tensor a retained graph saved, and an in-place op on one ``.grad`` must never show in
another tensor. A fresh result held by nothing but autograd's tuple (checked by
reference counts, tensor use count and storage use count) is taken over instead: one
copy of every parameter's grad less per backward, which shows in ``make bench``'s
``[training]`` lines (an MLP step). ``tests/service/engine/test_fast_paths.py`` checks that grads
taken over never alias another tensor and equal the grads of the plain path.
"""

from __future__ import annotations

import sys

import torch


def _refcount_held_by_tuple_alone() -> int:
    """``sys.getrefcount(t[i])`` of an object only the tuple ``t`` holds (2 here: the tuple and the argument;
    interpreters that borrow arguments say less), measured rather than assumed."""
    t = (object(),)
    return sys.getrefcount(t[0])


_HELD_BY_TUPLE_ALONE = _refcount_held_by_tuple_alone()


def owned(grads: tuple, i: int) -> bool:
    """Whether ``grads[i]`` is a plain tensor that nothing else holds, so it can become a ``.grad`` as it is.

    Autograd may hand back a tensor held elsewhere too: one grad for several inputs (``add``'s
    backward returns it twice), a ``gradient=`` the client sent, an expanded view, a tensor a
    retained graph saved. A fresh matmul or kernel result is held by ``grads`` alone.
    """
    if grads[i] is None or sys.getrefcount(grads[i]) != _HELD_BY_TUPLE_ALONE:
        return False
    g = grads[i]
    try:
        return (g._base is None and g.is_contiguous() and not g.requires_grad
                and g._use_count() == 1  # no other tensor object (nor a saved variable) shares it
                and torch._C._storage_Use_Count(g.untyped_storage()._cdata) == 2)  # g's and this storage object's
    except (AttributeError, RuntimeError):  # private torch calls: should an upgrade drop them, copy
        return False

"""A session's tensors as storages and layouts, and back: what the state volume writes for a graceful restart.

Each distinct storage is saved once, as its bytes; each value and grad as a layout over
one (dtype, size, stride, storage offset), so after a restart the ids that shared memory
share it again, with the strides they had. Aliasing is rebuilt as torch builds it:

- the tensors of a storage are grouped by their root (``t._base``, or ``t`` itself: torch
  points every view at the root of its chain). The first root is made over the saved
  bytes; another root of the same storage (a ``detach()``) is a ``detach()`` of it re-laid
  with ``set_``, so the two share a version counter as they did;
- every other tensor is a view of its root (``as_strided``, through ``view(dtype)`` when
  it reinterprets the bytes), so it shares its root's version counter and autograd sees
  an in-place change through either, as before. A view made under ``no_grad`` of a root
  that requires grad (a leaf view) is made under ``no_grad`` again.

Autograd graphs are not saved. A leaf keeps ``requires_grad``. A tensor that had a graph
(a loss computed before the restart, not yet backpropagated) comes back as a non-leaf
whose graph ends in ``GraphLost``: a backward that reaches it raises, naming the restart,
instead of quietly giving some leaves no gradient. torch runs that node only when a backward
needs its input (a plain ``backward()``); ``autograd.grad`` with explicit inputs, which every
backward step of the runner is, skips it. So ``rebuild`` also hands the nodes to the session
(``lost_graphs``), and the autograd steps refuse a graph that holds one before it runs.
"""

from __future__ import annotations

import weakref

import torch

from remote_autograd.proto import dtype_from_name, dtype_name

from .store import CustomTensor


class GraphLost(torch.autograd.Function):
    """Marks a restored tensor whose autograd graph was lost: its backward raises."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(t)  # t itself (its storage, its version counter) becomes the non-leaf
        return t

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(LOST)


LOST = ("the autograd graph of this tensor was lost when the server restarted (graphs are not saved): compute it "
        "again from the leaves")


def snapshot(tensors: dict[str, CustomTensor]) -> tuple[dict, list[torch.Tensor]]:
    """``(layout, storages)``: every value and grad as a layout (plain values), and the bytes of each
    distinct storage as a uint8 tensor (on the tensors' device). The caller holds the session's lock."""
    storages: list[torch.Tensor] = []
    storage_of: dict[tuple, int] = {}
    roots: list[dict] = []
    root_of: dict[int, int] = {}  # id() of a root tensor -> its index in roots

    def place(t: torch.Tensor) -> dict:
        root = t._base if t._base is not None else t
        r = root_of.get(id(root))
        if r is None:
            storage = root.untyped_storage()
            key = (storage.data_ptr(), str(storage.device)) if storage.nbytes() else ("empty", len(storages))
            s = storage_of.get(key)
            if s is None:
                s = storage_of[key] = len(storages)
                storages.append(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage))
            r = root_of[id(root)] = len(roots)
            roots.append({"storage": s, **_layout(root), "requires_grad": root.requires_grad, "leaf": root.is_leaf})
        entry = {"root": r, "requires_grad": t.requires_grad, "leaf": t.is_leaf}
        if t is not root:
            entry["view"] = _layout(t)
            # a lazy conj/neg view reads its storage through a flag (the bytes are unflipped): kept too
            entry["flags"] = [flag for flag, on in (("conj", t.is_conj()), ("neg", t.is_neg())) if on]
        return entry

    entries = [{"id": tid, "value": place(ct.value), "grad": None if ct.grad is None else place(ct.grad),
                "retains_grad": ct.retains_grad} for tid, ct in tensors.items()]
    return {"roots": roots, "tensors": entries}, storages


def rebuild(layout: dict, storages: list[torch.Tensor],
            lost: weakref.WeakSet | None = None) -> list[tuple[str, CustomTensor]]:
    """The ``(id, CustomTensor)`` pairs of a ``snapshot``, over ``storages`` (uint8 tensors on the
    session's device, in the snapshot's order, each holding the saved bytes); ``lost`` is given the
    ``GraphLost`` node of each tensor whose graph was not kept."""
    roots: list[torch.Tensor] = []
    first_root_of: dict[int, torch.Tensor] = {}
    for saved in layout["roots"]:
        bytes_ = storages[saved["storage"]]
        dtype, size, stride, offset = _unpack(saved)
        first = first_root_of.get(saved["storage"])
        if first is not None and first.dtype == dtype:
            root = first.detach()  # a second root of this storage: it shares the first's version counter
        else:
            root = torch.empty(0, dtype=dtype, device=bytes_.device)
        with torch.no_grad():
            root.set_(bytes_.untyped_storage(), offset, size, stride)
        first_root_of.setdefault(saved["storage"], root)
        roots.append(root)
    for root, saved in zip(roots, layout["roots"]):
        if saved["leaf"] and saved["requires_grad"]:
            root.requires_grad_(True)
        elif not saved["leaf"]:
            GraphLost.apply(root, torch.zeros((), requires_grad=True))
            if lost is not None:
                lost.add(root.grad_fn)
    pairs = []
    for entry in layout["tensors"]:
        ct = CustomTensor(_tensor(entry["value"], roots), None if entry["grad"] is None else _tensor(entry["grad"], roots))
        ct.retains_grad = bool(entry["retains_grad"])
        pairs.append((entry["id"], ct))
    return pairs


def _tensor(entry: dict, roots: list[torch.Tensor]) -> torch.Tensor:
    root = roots[entry["root"]]
    if "view" not in entry:
        return root
    dtype, size, stride, offset = _unpack(entry["view"])
    # A view made under no_grad of a root that requires grad is a leaf (no grad_fn; torch refuses
    # in-place ops on it with grad mode on): made under no_grad again.
    with torch.set_grad_enabled(not (entry["leaf"] and root.requires_grad)):
        try:
            view = (root if root.dtype == dtype else root.view(dtype)).as_strided(size, stride, offset)
        except RuntimeError:  # a reinterpretation torch made through a narrower view: its bytes, not its counter
            view = torch.empty(0, dtype=dtype, device=root.device).set_(root.untyped_storage(), offset, size, stride)
        if "conj" in entry["flags"]:
            view = view.conj()
        if "neg" in entry["flags"]:
            view = torch._neg_view(view)
    if entry["requires_grad"] and not view.requires_grad:  # a leaf view given requires_grad_() of its own
        view.requires_grad_(True)
    return view


def _layout(t: torch.Tensor) -> dict:
    return {"dtype": dtype_name(t.dtype), "size": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset()}


def _unpack(saved: dict) -> tuple[torch.dtype, list[int], list[int], int]:
    return dtype_from_name(saved["dtype"], "state dtype"), saved["size"], saved["stride"], saved["offset"]


"""Which RemoteTensors share memory on the server, and what an in-place op on one of them changes.

The server runs torch's own view ops, so a view shares its base's memory there exactly
as in torch. The client mirrors what torch would answer locally without a round trip:

- ``Storage``: the tensors that share one piece of server memory (views of one base,
  ``detach()`` aliases) and their shared version counter (``x._version``). Every
  in-place op on a member bumps it.
- ``_view_of``: the base a differentiable view was taken from (torch's ``_base``). An
  in-place op that records a graph on a view, or on its base, makes the base and all
  of its views require grad and depend on the same leaves, as torch does
  (``CopySlices``; a view's ``grad_fn`` is regenerated from its base).
- Strides: views keep their layout (``x.t()`` is not contiguous), read from torch's
  meta kernels; they decide whether ``reshape`` gives a view, and answer ``stride()``.
  The same kernels give a view's place in its storage (``_byte_offset``: ``x[2:]`` starts
  8 bytes in), which ``storage_offset()`` and ``data_ptr()`` answer; None where unknown.
  A tensor whose layout the client cannot know (``UNKNOWN``: an op's output computed
  from a non-contiguous input) may make ``reshape``/``flatten``/``contiguous`` a view
  or a copy; such a result joins its input's storage as *uncertain*, and an in-place
  op that records a graph on that storage is refused (loudly), never guessed.
"""

from __future__ import annotations

import weakref
import torch
from torch._C import DisableTorchFunctionSubclass

UNKNOWN = "unknown"  # a ``_strides`` value: the server's layout of this tensor is not known here
_META = torch.device("meta")

T = torch.Tensor


class Storage:
    """Server memory shared by several RemoteTensors: its version counter and its live members."""

    __slots__ = ("version", "members", "uncertain", "memory")

    def __init__(self, version: int) -> None:
        self.version = version
        self.members: dict[int, weakref.ref] = {}  # id -> ref: a WeakSet would compare tensors with ==
        self.uncertain: list[weakref.ref] = []  # members that may be a view or a copy on the server
        self.memory = None  # what data_ptr() names this memory by, once asked (handlers/_storage_ids)

    def is_uncertain_member(self, t) -> bool:
        return any(r() is t for r in self.uncertain)

    def is_uncertain(self) -> bool:
        self.uncertain = [r for r in self.uncertain if r() is not None]
        return bool(self.uncertain)

    def add(self, t) -> None:
        self.members[id(t)] = weakref.ref(t)
        t._storage = self

    def alive(self) -> list:
        found = []
        for key, ref in list(self.members.items()):
            t = ref()
            if t is None:
                del self.members[key]
            else:
                found.append(t)
        return found


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def meta_of(t) -> torch.Tensor:
    """A data-free stand-in with ``t``'s shape, dtype and (where known) strides."""
    strides = t._strides
    if strides is None or strides is UNKNOWN:
        return torch.empty(t._shape, dtype=t._dtype, device=_META)
    return torch.empty_strided(t._shape, strides, dtype=t._dtype, device=_META)


def version(t) -> int:
    return t._storage.version if t._storage is not None else t._ver


def set_version(t, value: int) -> None:
    """Set the version counter ``t`` reads (its Storage's, when it has one)."""
    if t._storage is not None:
        t._storage.version = value
    else:
        t._ver = value


def strides(t) -> tuple[int, ...]:
    """What ``t.stride()`` answers: the tracked strides, contiguous ones where unknown."""
    s = t._strides
    return contiguous_strides(t._shape) if s is None or s is UNKNOWN else s


def _layout(o: torch.Tensor):
    s = tuple(o.stride())
    return None if s == contiguous_strides(tuple(o.shape)) else s


def storage_of(t) -> Storage:
    """``t``'s Storage, made for it alone if it shares memory with no other handle yet."""
    storage = t._storage
    if storage is None:
        storage = Storage(t._ver)
        storage.add(t)
    return storage


def _join(out, base, *, differentiable: bool, uncertain: bool = False) -> None:
    storage = storage_of(base)
    storage.add(out)
    if uncertain:
        storage.uncertain.append(weakref.ref(out))
    if differentiable:
        out._view_of = base._view_of if base._view_of is not None else base


def alias(out, base, *, differentiable: bool) -> None:
    """``out`` shares ``base``'s memory (``detach()``: not a differentiable view)."""
    out._strides, out._byte_offset = base._strides, base._byte_offset
    _join(out, base, differentiable=differentiable)


def _source(o: torch.Tensor, inputs: list):
    """The input RemoteTensor whose meta stand-in ``o`` is (a view of), or None."""
    return next((t for t in inputs if t._meta_t is not None and (o is t._meta_t or o._base is t._meta_t)), None)


def describe(raw: list, inputs: list) -> list[tuple]:
    """What ``settle`` reads of torch's meta outputs ``raw``: for each, the input RemoteTensor it is
    (a view of) or None, its layout (None: contiguous, else its strides), and where it starts in bytes
    from where that input starts (an input's stand-in starts its own storage: ``meta_of``)."""
    found = []
    for o in raw:
        src = _source(o, inputs)
        found.append((src, _layout(o), 0 if src is None else o.storage_offset() * o.element_size()))
    return found


def is_view_call(views: list) -> bool:
    """Whether torch on meta returned a view of (or the same) input: a view op (``views``: ``describe``'s)."""
    return any(v[0] is not None for v in views)


def settle(outs: list, inputs: list, views: list, maybe: bool, differentiable: bool) -> None:
    """Layout and aliasing of a call's new outputs.

    ``views``: ``describe`` of the meta outputs torch gave for the call (empty when the
    metadata came from a cheap rule: such ops never return views). ``inputs``: the
    RemoteTensor arguments. ``maybe``: the op's served ``maybe_view`` (``reshape``: a view or a copy
    depending on the input's strides, or the input itself).
    """
    if not views:  # elementwise and friends: a contiguous result from contiguous inputs (TensorIterator)
        for t in inputs:  # a loop, not any(genexpr): no generator frame per op
            if t._strides is not None:
                for o in outs:
                    if o is not None:
                        o._strides = UNKNOWN
                break
        return
    for out, (src, layout, offset) in zip(outs, views):
        if out is None:  # an optional output torch left out (attention weights with need_weights=False)
            continue
        if src is None and maybe and inputs and inputs[0]._strides is UNKNOWN:
            src = inputs[0]  # torch on meta saw contiguous strides; the server's may differ
        if src is None:
            known = True
            for t in inputs:  # a loop, not all(genexpr): no generator frame per op
                if t._strides is not None:
                    known = False
                    break
            out._strides = layout if known and layout is None else UNKNOWN
            continue
        out._strides = UNKNOWN if src._strides is UNKNOWN else layout
        if offset or src._byte_offset != 0:  # a view starts where its source does, plus what meta says
            out._byte_offset = None if src._byte_offset is None else src._byte_offset + offset
        _join(out, src, differentiable=differentiable, uncertain=maybe and src._strides is UNKNOWN)


def index_view(outs: list, base, index) -> None:
    """``base[index]`` where the index held tensors: a view when every one of them is a 0-d integer
    tensor (torch reads them as ints), else a copy (a mask, an index list)."""
    items = index if isinstance(index, tuple) else (index,)
    tensors = [i for i in items if isinstance(i, torch.Tensor)]
    if all(t.dim() == 0 and not (t.dtype == torch.bool or t.dtype == torch.uint8) for t in tensors):
        for out in outs:
            out._strides, out._byte_offset = UNKNOWN, None  # where it starts: the index's values say
            _join(out, base, differentiable=True)


def check_inplace(target, op_name: str, rg: bool, leaves: frozenset) -> None:
    """Refuse, before anything is queued, an in-place op whose effect on autograd the client cannot know:
    one that records a graph on memory shared with an uncertain alias, unless it would change nothing
    the client knows (every alias already requires grad, is no leaf, and depends on these leaves)."""
    storage = target._storage
    if not (rg and storage is not None and storage.is_uncertain()):
        return
    needed = leaves | target._leaves
    if all(m._rg and not m._is_leaf and needed <= m._leaves for m in storage.alive()):
        return
    raise RuntimeError(
        f"{op_name}: an in-place op that records a graph on a tensor that may share memory with another: "
        "a reshape/flatten/contiguous of a tensor whose memory layout only the server knows may be a view "
        "or a copy there, and which tensors then require grad would differ. Make it definite first: "
        ".clone() for a copy, or take the view of a contiguous tensor")


def after_inplace(target, rg: bool, leaves: frozenset) -> None:
    """What torch changes locally after ``target.op_(...)``: versions and (when a graph
    is recorded) requires_grad and leaves of the target, its base and every view of that base."""
    storage = target._storage
    if storage is None:
        target._ver += 1
        members = [target]
    else:
        storage.version += 1
        members = storage.alive()
    if not rg:
        return
    root = target._view_of if target._view_of is not None else target
    group = [m for m in members if m is root or m._view_of is root] if storage is not None else [target]
    joined = leaves
    for m in group:
        if m._rg and m._leaves:
            joined = joined | m._leaves
    for m in group:
        m._leaves = joined
        if not m._rg or m._is_leaf:
            m._rg, m._is_leaf = True, False
            with DisableTorchFunctionSubclass():  # torch.compile's guards read the C++ flag
                T.requires_grad.__set__(m, True)


def reshape_inplace_meta(op_name: str, target, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The target's new layout after a shape-changing in-place op, or None (not such an op, or one torch
    refuses: the server then answers with torch's own error, which meta kernels do not always spell alike)."""
    name = op_name.rpartition(".")[2]
    # An op the served table says relayouts: torch's in-place method of that name. The name is the
    # user's own call's, but a by-name call (sess.ops) takes it from the server's table: only an
    # in-place spelling (``t_``, never ``_private`` or ``__dunder__``) is looked up on torch.Tensor.
    if name.startswith("_") or not name.endswith("_"):
        return None
    func = getattr(T, name, None)
    if func is None:
        return None
    stand_in = meta_of(target)
    try:
        with torch.no_grad():
            func(stand_in, *args, **kwargs)
    except Exception:
        return None
    return stand_in


def set_layout(target, new: torch.Tensor, wrapper_type: type) -> None:
    """Give ``target`` the shape, strides and dtype of ``new``: our fields, and the wrapper's own (C++)
    metadata, which torch reads directly in places (``TensorBase.data.__set__``, as the subclass notes say)."""
    known = target._strides is not UNKNOWN
    target._shape, target._strides, target._meta_t = tuple(new.shape), _layout(new) if known else UNKNOWN, None
    if new.storage_offset():  # as_strided_: the offset it names is in the storage (the stand-in's starts it)
        target._byte_offset = new.storage_offset() * new.element_size()
    with DisableTorchFunctionSubclass():
        replacement = T._make_wrapper_subclass(wrapper_type, new.shape, strides=new.stride(), dtype=new.dtype,
                                               device=target.device)
        T.data.__set__(target, replacement)

"""``data_ptr()``, ``untyped_storage()``, ``storage()`` and ``storage_offset()`` of a remote tensor:
identities of server memory, never addresses.

torch code compares pointers to tell which tensors share memory: peft's and Hugging Face's tied
weights (``a.data_ptr() == b.data_ptr()``), safetensors' shared storages
(``untyped_storage().data_ptr()`` and ``nbytes()``). The client knows which handles share server
memory (``_views``: the views and ``detach()`` aliases of one ``Storage``; ``.data`` handles and
``p.data = v`` follow here) and where a view starts in it (``_byte_offset``, from torch's meta
kernels). Each piece of server memory gets a number when first asked, in a range no process maps
(above 2**62: not a canonical address on x86-64 or arm64), 2**40 apart; ``data_ptr()`` is that number
plus the tensor's byte offset. So views of one storage compare as torch's do, a clone differs, and
nothing can be dereferenced. What the client cannot know raises ``NotImplementedError`` (what torch
raises for memory it cannot address, and what such code catches): where a view taken with a tensor
index starts, and whether a reshape that only the server can decide shares memory at all.
"""

from __future__ import annotations

import itertools
import weakref

import torch

from ..tensor import _views
from ._handler_table import HandlerTable

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on

_FIRST = 0x5245_4D00_0000_0000  # "REM" and zeros: above 2**62, below 2**63 (an int64, as torch's pointers)
_APART = 1 << 40  # room for a view's byte offset inside one memory's range
_SLOTS = ((1 << 63) - _FIRST) // _APART
_numbers = itertools.count()


class _Memory:
    """One piece of server memory, as ``data_ptr()`` names it."""

    __slots__ = ("address", "nbytes")

    def __init__(self) -> None:
        self.address = _FIRST + (next(_numbers) % _SLOTS) * _APART
        self.nbytes: int | None = None  # fixed when first asked, from the handles that share it then


# Handles that kept the memory they had when another handle of their Storage took new memory (``p.data = v``)
_pinned: dict[int, tuple[weakref.ref, _Memory]] = {}


def memory_of(t) -> _Memory:
    """The server memory ``t`` is in, named once per memory (shared through ``_views``' Storage)."""
    pinned = _pinned.get(id(t))
    if pinned is not None and pinned[0]() is t:
        return pinned[1]
    storage = _views.storage_of(t)
    if storage.memory is None:
        storage.memory = _Memory()
    return storage.memory


def share_memory(out, t) -> None:
    """``out = t.data``: a handle of its own version counter, in ``t``'s memory where ``t`` starts."""
    _views.storage_of(out).memory = memory_of(t)
    out._byte_offset = t._byte_offset


def took_memory(t, value) -> None:
    """``t.data = value``: ``t`` is now in ``value``'s memory; the views it had stay in the old one, and
    views taken of ``t`` from now on are in the new one (as torch's ``set_data``)."""
    if t._storage is not None:
        for m in t._storage.alive():
            if m is not t and id(m) not in _pinned:
                _pinned[id(m)] = (weakref.ref(m, lambda _, key=id(m): _pinned.pop(key, None)), memory_of(m))
    _pinned.pop(id(t), None)
    _views.storage_of(t).memory = memory_of(value)
    t._byte_offset = value._byte_offset


def _check_known(t, what: str, *, offset: bool) -> None:
    """Raise where the client cannot know the memory (or, with ``offset``, the place in it) of ``t``."""
    t._check_usable()
    storage = t._storage
    if storage is not None and storage.is_uncertain_member(t):
        why = "a reshape/flatten of a tensor whose layout only the server knows: a view or a copy there"
    elif offset and t._byte_offset is None:
        why = "a view taken with a tensor index: where it starts depends on the index's values"
    else:
        return
    raise NotImplementedError(f"{what} of this remote tensor is known only to the server ({why})")


def _alone_and_empty(t) -> bool:
    return t._storage is None and 0 in t._shape


@_answers(T.data_ptr)
def _data_ptr(t) -> int:
    _check_known(t, "Tensor.data_ptr()", offset=True)
    if _alone_and_empty(t):  # no memory at all (torch's pointer is 0 too)
        return 0
    return memory_of(t).address + t._byte_offset


@_answers(T.storage_offset)
def _storage_offset(t) -> int:
    _check_known(t, "Tensor.storage_offset()", offset=True)
    return t._byte_offset // t._dtype.itemsize


def _nbytes(t, memory: _Memory) -> int:
    """How many bytes ``memory`` holds: the furthest any handle in it reaches (fixed when first asked)."""
    if memory.nbytes is None:
        reach = 0
        for m in ([t] if t._storage is None else t._storage.alive()):
            if m._byte_offset is None or 0 in m._shape or memory_of(m) is not memory:
                continue
            span = 1 + sum((size - 1) * stride for size, stride in zip(m._shape, _views.strides(m)))
            reach = max(reach, m._byte_offset + span * m._dtype.itemsize)
        memory.nbytes = reach
    return memory.nbytes


class RemoteStorage:
    """What ``untyped_storage()`` (``dtype`` uint8) and ``storage()`` (the tensor's dtype) answer for a
    remote tensor: the identity of its server memory and its size; nothing of its bytes."""

    def __init__(self, t, dtype: torch.dtype) -> None:
        memory = memory_of(t)
        self._address, self._nbytes = memory.address, _nbytes(t, memory)
        self.device, self.dtype = t._session.device, dtype
        self._empty = _alone_and_empty(t)

    def data_ptr(self) -> int:
        return 0 if self._empty else self._address

    def nbytes(self) -> int:
        return self._nbytes

    def element_size(self) -> int:
        return self.dtype.itemsize

    def size(self) -> int:
        return self._nbytes // self.dtype.itemsize

    __len__ = size

    @property
    def is_cuda(self) -> bool:
        return False

    def __getattr__(self, name: str):
        if name.startswith("_"):  # torch's private probes (``hasattr(s, "_fix_weakref")`` in torch.utils.weak)
            raise AttributeError(name)
        raise NotImplementedError(f"storage.{name}() of a remote tensor: its bytes live on the server; the client "
                                  "answers only which memory it is (data_ptr, nbytes, size)")

    def __repr__(self) -> str:
        return f"<remote storage of {self._nbytes} bytes on {self.device}>"


@_answers(T.untyped_storage)
def _untyped_storage(t) -> RemoteStorage:
    _check_known(t, "Tensor.untyped_storage()", offset=False)
    return RemoteStorage(t, torch.uint8)


@_answers(T.storage)
def _typed_storage(t) -> RemoteStorage:
    _check_known(t, "Tensor.storage()", offset=False)
    return RemoteStorage(t, t._dtype)

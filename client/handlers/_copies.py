"""Copies made on the server: ``copy.deepcopy`` of remote tensors, and ``torch.load(..., map_location=device)``.

``copy.deepcopy`` of a model, an optimizer or a state dict reaches ``Tensor.__deepcopy__`` for each
remote tensor, which becomes a server-side ``clone`` (no download), as torch deep-copies a tensor of
a device without client storage: the copy keeps ``requires_grad`` and (for a plain tensor) a copy
of ``.grad`` and of its Python attributes; a Parameter copies its data and ``requires_grad`` only,
as ``Parameter.__deepcopy__`` does. ``deepcopy``'s memo keeps one object one copy (tied weights stay
tied). Tensors that share memory as views of one another become separate copies.

``torch.load`` moves *storages*, not tensors: it reads each storage into client memory, asks the
deserializer registered for its target location, then builds every tensor on it with
``torch.empty((0,), device=storage.device).set_(storage, offset, size, stride)``. For a ``remote``
target our deserializer (``torch.serialization.register_package``, ahead of torch's own for
PrivateUse1, which would need device-side storage) keeps the bytes where they are and marks the
storage with the device; the ``set_`` of the empty remote tensor then uploads the storage once
(as a flat tensor of the storage's dtype) and makes the tensor that view of it on the server
(``.data =`` then ``as_strided_``), so tensors that shared a storage in the checkpoint share
memory on the server, with the dtypes, sizes, strides and offsets torch would give them.
"""

from __future__ import annotations

import copy
import re

import torch

from .._core import HANDLE_FIELDS, call_op
from ..device._device import DEVICE_TYPE, session_for
from ..session._unsupported import not_in_table
from ..tensor import _views
from ..tensor._views import contiguous_strides
from ._addresses import took_memory
from ._handler_table import HandlerTable

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on

_LEAVES_ONLY = ("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the "
                "moment.  If you were attempting to deepcopy a module, this may be because of a "
                "torch.nn.utils.weight_norm usage, see https://github.com/pytorch/pytorch/pull/103001")


@_answers(T.__deepcopy__)
def _deepcopy(t, memo):
    if id(t) in memo:
        return memo[id(t)]
    is_param = getattr(t, "_is_param", False)
    if t._rg and not t._is_leaf and not is_param:
        raise RuntimeError(_LEAVES_ONLY)
    with torch.no_grad():
        new = t.clone()  # queued: the copy is made on the server, with t's strides
    own = HANDLE_FIELDS | set(new.__dict__)  # a handle's own fields: never copied (the session is shared, ids are new)
    if is_param:  # Parameter.__deepcopy__: its data and requires_grad, nothing else
        new.requires_grad_(t._rg)
        new._is_param = True
    else:
        if t._rg:
            new.requires_grad_()
        if t._has_grad:
            new.grad = copy.deepcopy(t.grad, memo)
        for name, value in t.__dict__.items():
            if name not in own:
                setattr(new, name, copy.deepcopy(value, memo))
    memo[id(t)] = new
    return new


# -- torch.load(..., map_location=device) ---------------------------------------------------------


class _StorageForDevice(torch.UntypedStorage):
    """A storage torch.load read into client memory whose tensors go to ``device`` (set by ``_restore``)."""

    @property
    def device(self) -> torch.device:
        return self._target

    def _upload(self, dtype: torch.dtype, session) -> torch.Tensor:
        """The whole storage as a flat remote tensor of ``dtype``, uploaded once per dtype."""
        uploads = self.__dict__.setdefault("_uploads", {})
        if dtype not in uploads:
            with torch._C.DisableTorchFunctionSubclass():  # the local bytes, read as torch reads them
                flat = torch.empty(0, dtype=dtype).set_(self)
            uploads[dtype] = session.tensor(flat)
        return uploads[dtype]


def _restore(storage: torch.UntypedStorage, location: str):
    """torch.load's deserializer for ``remote`` locations; None for any other (torch's own then answer)."""
    if not re.fullmatch(f"{DEVICE_TYPE}(:[0-9]+)?", location):
        return None
    device = torch.device(location)
    session_for(device, "torch.load(map_location=...)")  # an open session, or a clear error now
    storage.__class__ = _StorageForDevice  # the bytes torch.load just read, for this load alone
    storage._target = device
    return storage


torch.serialization.register_package(15, lambda storage: None, _restore)


@_answers(torch.ops.aten.set_.source_Storage_storage_offset, torch.ops.aten.set_.source_Storage)
def _set_(t, source, storage_offset=0, size=None, stride=None):
    """``empty.set_(storage, offset, size, stride)`` as torch.load builds each tensor (torch's binding of
    ``set_(Storage)`` skips ``__torch_function__``: it reaches ``__torch_dispatch__``)."""
    if not isinstance(source, _StorageForDevice):
        raise RuntimeError("Tensor.set_(storage) is not supported on a remote tensor: the values live on the server "
                           "and there is no client storage")
    session = t._session
    flat = source._upload(t.dtype, session)
    size = tuple(flat.shape) if size is None else tuple(size)
    stride = contiguous_strides(size) if stride is None else tuple(stride)
    # Queued as the session's ops themselves: below __torch_function__, torch calls on t would not reach us.
    with torch.no_grad():
        call_op(session, "set_data", [t, flat], {})  # t now holds the storage's memory on the server
        took_memory(t, flat)
        if (size, stride, storage_offset) != (tuple(flat.shape), (1,), 0):
            call_op(session, "as_strided_", [t, list(size), list(stride), storage_offset], {})
    _views.set_version(t, 1)  # what torch's set_ leaves: one write (the steps above are one set_ to the user)
    return t


@_answers(T._backward_hooks.__set__)
def _set_backward_hooks(t, hooks) -> None:
    """What torch.load sets on every tensor it rebuilds: no hooks (torch never saves them); a hook cannot run here."""
    if hooks:
        raise not_in_table(T.register_hook)


_answers(T._backward_hooks.__get__)(lambda t: None)  # torch's answer for a tensor without hooks

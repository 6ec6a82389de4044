"""Torch calls a RemoteTensor answers itself: metadata and value reads.

Metadata never costs a round trip. Value reads (``item``, ``tolist``, ``repr``,
``bool``…) flush the queue. The autograd calls live in ``_autograd``, moves in
``_moves``; each module has a table of its own, which the package's wiring merges.
"""

from __future__ import annotations

import numbers

import torch
from torch import _tensor_str

from .._core import RemoteTensor
from ..device._device import DEVICE_TYPE
from ..dispatch._user_functions import HOOK_NODE
from ..tensor import _views
from ._handler_table import HandlerTable
from ._node_hooks import HookNode

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on


# -- metadata ---------------------------------------------------------------------------------

_answers(T.shape.__get__)(lambda t: torch.Size(t._shape))
_answers(T.dtype.__get__)(lambda t: t._dtype)
_answers(T.device.__get__)(lambda t: t._session.device)
_answers(T.get_device, torch.get_device)(lambda t: t._session.device.index)  # as a cuda tensor's: its index
_answers(T.ndim.__get__, T.dim, T.ndimension)(lambda t: len(t._shape))
_answers(T.is_leaf.__get__)(lambda t: t._is_leaf or not t._rg)
_answers(T.requires_grad.__get__)(lambda t: t._rg)
# A remote tensor is on a non-CPU device of its own: every "is it on device X" answer is
# False, locally (``is_remote``, which torch generates for the renamed backend, reads .device).
_answers(*(getattr(T, f"is_{kind}").__get__ for kind in (
    "cpu", "cuda", "xpu", "mps", "meta", "mtia", "ipu", "xla", "maia", "vulkan", "mkldnn", "sparse", "sparse_csr",
    "quantized", "nested")), T.is_inference, T.is_pinned, T.is_shared, T.is_conj, T.is_neg)(lambda t, *a: False)
_answers(getattr(T, f"is_{DEVICE_TYPE}").__get__)(lambda t: True)  # generated when the backend was named
_answers(T.is_signed)(lambda t: t._dtype.is_signed)
_answers(T.layout.__get__)(lambda t: torch.strided)
_answers(T.is_floating_point, torch.is_floating_point)(lambda t: t._dtype.is_floating_point)
_answers(T.is_complex, torch.is_complex)(lambda t: t._dtype.is_complex)
_answers(T.element_size)(lambda t: t._dtype.itemsize)
_answers(T.numel, T.nelement, torch.numel)(lambda t: _numel(t._shape))
_answers(T.is_contiguous)(lambda t, memory_format=torch.contiguous_format: t._meta().is_contiguous(memory_format=memory_format))
_answers(T.__hash__)(lambda t: id(t))
_answers(T._version.__get__)(lambda t: _views.version(t))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@_answers(T.size)
def _size(t, dim=None):
    if dim is None:
        return torch.Size(t._shape)
    return t._shape[dim]


@_answers(T.stride)
def _stride(t, dim=None):
    strides = _views.strides(t)
    return strides if dim is None else strides[dim]


@_answers(T.__len__)
def _len(t):
    if not t._shape:
        raise TypeError("len() of a 0-d tensor")
    return t._shape[0]


@_answers(T.__iter__)
def _iter(t):
    if not t._shape:
        raise TypeError("iteration over a 0-d tensor")
    return iter(t.unbind(0))


@_answers(T.grad_fn.__get__)
def _grad_fn(t):
    if t._is_leaf or not t._rg:
        return None
    node = t.__dict__.get(HOOK_NODE)  # an output of torch's module-hook Function: its node takes torch's hooks
    return _RemoteNode(t) if node is None else HookNode(t, node)


class _RemoteNode:
    """Stands in for ``grad_fn`` of a non-leaf RemoteTensor: the graph lives on the server, so the node's
    hooks and its links to other nodes are refused loudly (``nn.Module.register_backward_hook`` registers
    on the output's ``grad_fn``; ``register_multi_grad_hook`` walks ``next_functions``)."""

    def __init__(self, t) -> None:
        self.tensor_id = t._id

    def name(self) -> str:
        return "RemoteBackward"

    def __repr__(self) -> str:
        return "<RemoteBackward (graph on the server)>"

    def __getattr__(self, name: str):
        # An AttributeError, as before, so that hasattr() probes still answer False; its words say why.
        if name.startswith("__"):  # Python's own protocol probes (copy, pickle)
            raise AttributeError(name)
        why = ("a hook on an autograd node (nn.Module.register_backward_hook puts one on its output's grad_fn) "
               "would run inside the server's backward, where a hook written on the client cannot run yet; read "
               "`.grad` after backward instead" if "hook" in name
               else "the autograd graph lives on the server; the client holds no node of it")
        raise AttributeError(f"grad_fn.{name} of a remote tensor: {why}")


# -- values: these flush --------------------------------------------------------------------


@_answers(T.item)
def _item(t):
    return t._value().item()


@_answers(T.tolist)
def _tolist(t):
    return t._value().tolist()


@_answers(T.numpy)
def _numpy(t, *, force=False):
    if t._rg and not force:
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
    return t._value().numpy()


@_answers(T.__array__)
def _array(t, dtype=None, copy=None):
    value = _numpy(t)
    return value if dtype is None else value.astype(dtype)


_answers(T.__bool__)(lambda t: bool(t._value()))
_answers(T.__float__)(lambda t: float(t._value()))
_answers(T.__int__)(lambda t: int(t._value()))
_answers(T.__index__)(lambda t: t._value().__index__())


@_answers(T.__repr__, T.__str__)
def _repr(t, *, tensor_contents=None):
    """What torch prints for a tensor of a non-default device (a CUDA one): torch's own formatting of the
    values, then ``device='remote:k'``, the dtype or size where torch shows them, and the grad suffix."""
    value = t._value()
    text = _tensor_text(value, t._session.device, tensor_contents)
    grad = None if not t._rg else "requires_grad=True" if t._is_leaf else "grad_fn=<RemoteBackward>"
    if grad is not None:
        text = _tensor_str._add_suffixes(text[:-1], [grad], _INDENT, force_newline=False)
    return "Parameter containing:\n" + text if getattr(t, "_is_param", False) else text


_INDENT = len("tensor(")


def _tensor_text(value: torch.Tensor, device: torch.device, contents: str | None) -> str:
    """``_str_intern``'s answer for ``value`` had it been on ``device`` (suffixes in torch's order)."""
    suffixes = [f"device='{device}'"]
    default = torch.get_default_dtype()
    if value.numel() == 0:
        if value.dim() != 1:
            suffixes.append(f"size={tuple(value.shape)}")
        if value.dtype != default:
            suffixes.append(f"dtype={value.dtype}")
        body = "[]"
    else:
        if not _tensor_str.PRINT_OPTS.edgeitems:
            suffixes.append(f"size={tuple(value.shape)}")
        complex_default = torch.cdouble if default == torch.double else torch.cfloat
        if value.dtype not in (default, complex_default, torch.int64, torch.bool):
            suffixes.append(f"dtype={value.dtype}")
        body = _tensor_str._tensor_str(value, _INDENT)
    return _tensor_str._add_suffixes("tensor(" + (body if contents is None else contents), suffixes, _INDENT,
                                     force_newline=False)


@_answers(T.__format__)
def _format(t, spec):
    if not t._shape:
        return t._value().item().__format__(spec)
    return _repr(t) if not spec else object.__format__(t, spec)


@_answers(torch.equal)
def _equal(a, b):
    return torch.equal(_local_value(a), _local_value(b))


@_answers(torch.allclose, T.allclose)
def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return torch.allclose(_local_value(a), _local_value(b), rtol=rtol, atol=atol, equal_nan=equal_nan)


def _local_value(x):
    return x._value() if isinstance(x, RemoteTensor) else x


@_answers(T.__contains__)
def _contains(t, element) -> bool:
    """``element in t``, as torch answers it: ``(element == t).any()`` (one round trip)."""
    if isinstance(element, (torch.Tensor, numbers.Number, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return bool((element == t).any().item())
    raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a {type(element)}.")


# -- calls that read only another tensor's shape: torch never asks which device it is on -----------

_answers(T.view_as)(lambda t, other: t.view(other.shape))
_answers(T.reshape_as)(lambda t, other: t.reshape(other.shape))
_answers(T.expand_as)(lambda t, other: t.expand(other.shape))


@_answers(T.__reduce_ex__)
def _reduce_ex(t, protocol):
    # Pickle (and torch.save) store the values as a plain tensor, never the handle.
    return t.to_torch().detach().requires_grad_(t._rg).__reduce_ex__(protocol)

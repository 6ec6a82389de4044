"""Torch calls a RemoteTensor answers itself: metadata, value reads, and autograd steps.

Metadata never costs a round trip. Value reads (``item``, ``tolist``, ``repr``,
``bool``…) flush the queue. Autograd calls queue their own step kinds, and
whether a leaf's ``.grad`` is None is predicted from which leaves a backward reaches.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from ._dispatch import Encoder, where
from ._session import _Origin, meta_from_result

T = torch.Tensor
LOCAL_HANDLERS: dict[Callable, Callable] = {}


def _local(*funcs):
    def register(handler):
        for f in funcs:
            LOCAL_HANDLERS[f] = handler
        return handler

    return register


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


# -- metadata ---------------------------------------------------------------------------------

_local(T.shape.__get__)(lambda t: torch.Size(t._shape))
_local(T.dtype.__get__)(lambda t: t._dtype)
_local(T.device.__get__)(lambda t: torch.device("meta"))
_local(T.ndim.__get__, T.dim, T.ndimension)(lambda t: len(t._shape))
_local(T.is_leaf.__get__)(lambda t: t._is_leaf or not t._rg)
_local(T.requires_grad.__get__)(lambda t: t._rg)
_local(T.is_meta.__get__, T.is_cuda.__get__, T.is_sparse.__get__, T.is_quantized.__get__, T.is_nested.__get__,
       T.is_mkldnn.__get__, T.is_inference)(lambda t: False)
_local(T.layout.__get__)(lambda t: torch.strided)
_local(T.is_floating_point, torch.is_floating_point)(lambda t: t._dtype.is_floating_point)
_local(T.is_complex, torch.is_complex)(lambda t: t._dtype.is_complex)
_local(T.element_size)(lambda t: t._dtype.itemsize)
_local(T.numel, T.nelement)(lambda t: _numel(t._shape))
_local(T.is_contiguous)(lambda t, memory_format=None: True)
_local(T.__hash__)(lambda t: id(t))
_local(T._version.__get__)(lambda t: 0)
_local(torch._has_compatible_shallow_copy_type)(lambda t, other: type(t) is type(other))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@_local(T.size)
def _size(t, dim=None):
    if dim is None:
        return torch.Size(t._shape)
    return t._shape[dim]


@_local(T.stride)
def _stride(t, dim=None):
    strides = _contiguous_strides(t._shape)
    return strides if dim is None else strides[dim]


@_local(T.__len__)
def _len(t):
    if not t._shape:
        raise TypeError("len() of a 0-d tensor")
    return t._shape[0]


@_local(T.__iter__)
def _iter(t):
    if not t._shape:
        raise TypeError("iteration over a 0-d tensor")
    return iter(t.unbind(0))


@_local(T.grad_fn.__get__)
def _grad_fn(t):
    return None if (t._is_leaf or not t._rg) else _RemoteNode(t)


class _RemoteNode:
    """Stands in for ``grad_fn`` of a non-leaf RemoteTensor: the graph lives on the server."""

    def __init__(self, t) -> None:
        self.tensor_id = t._id

    def name(self) -> str:
        return "RemoteBackward"

    def __repr__(self) -> str:
        return "<RemoteBackward (graph on the server)>"


# -- values: these flush --------------------------------------------------------------------


@_local(T.item)
def _item(t):
    return t._value().item()


@_local(T.tolist)
def _tolist(t):
    return t._value().tolist()


@_local(T.numpy)
def _numpy(t, *, force=False):
    if t._rg and not force:
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
    return t._value().numpy()


@_local(T.__array__)
def _array(t, dtype=None, copy=None):
    value = _numpy(t)
    return value if dtype is None else value.astype(dtype)


_local(T.__bool__)(lambda t: bool(t._value()))
_local(T.__float__)(lambda t: float(t._value()))
_local(T.__int__)(lambda t: int(t._value()))
_local(T.__index__)(lambda t: t._value().__index__())


@_local(T.__repr__, T.__str__)
def _repr(t, *, tensor_contents=None):
    value = t._value()
    text = repr(value)
    if t._rg:
        text = text[:-1] + (", requires_grad=True)" if t._is_leaf else ", grad_fn=<RemoteBackward>)")
    return text


@_local(T.__format__)
def _format(t, spec):
    if not t._shape:
        return t._value().item().__format__(spec)
    return _repr(t) if not spec else object.__format__(t, spec)


@_local(torch.equal)
def _equal(a, b):
    return torch.equal(_local_value(a), _local_value(b))


@_local(torch.allclose, T.allclose)
def _allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return torch.allclose(_local_value(a), _local_value(b), rtol=rtol, atol=atol, equal_nan=equal_nan)


def _local_value(x):
    from ._tensor import RemoteTensor

    return x._value() if isinstance(x, RemoteTensor) else x


@_local(T.__reduce_ex__)
def _reduce_ex(t, protocol):
    # Pickle (and torch.save) store the values as a plain tensor, never the handle.
    return t.to_torch().detach().requires_grad_(t._rg).__reduce_ex__(protocol)


# -- conversions that leave the server ----------------------------------------------------


@_local(T.cpu)
def _cpu(t, memory_format=None):
    return t._value()


@_local(T.to)
def _to(t, *args, **kwargs):
    """``.to(dtype)`` is a server op; ``.to('cpu')`` (any real device) is a local copy; ``.to(t.device)`` is t."""
    device, dtype = _parse_to(args, kwargs)
    if device is not None and device.type != "meta":
        value = t._value()
        return value.to(device=device, dtype=dtype or value.dtype)
    bools = [a for a in args if isinstance(a, bool)]
    if (dtype is None or dtype == t._dtype) and not kwargs.get("copy", len(bools) > 1 and bools[1]):
        return t
    route = t._session._routes.lookup(T.to)
    if route is None:
        raise NotImplementedError("torch.Tensor.to(dtype) is not in the server's op table")
    from ._dispatch import apply_route

    bools = [a for a in args if isinstance(a, bool)]  # to(dtype, non_blocking, copy)
    copy = kwargs.get("copy", bools[1] if len(bools) > 1 else False)
    extra = {"copy": True} if copy else {}
    return apply_route(t._session, T.to, route, (t, dtype or t._dtype), extra)


def _parse_to(args: tuple, kwargs: dict) -> tuple[torch.device | None, torch.dtype | None]:
    """(device, dtype) from ``Tensor.to``'s overloads: dtype, device[, dtype], or another tensor."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, torch.Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, (str, torch.device)) or (type(a) is int):
            device = a
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    return device, dtype


# -- autograd -------------------------------------------------------------------------------


@_local(T.requires_grad.__set__)
def _set_requires_grad(t, value):
    _requires_grad_(t, bool(value))


@_local(T.requires_grad_)
def _requires_grad_(t, requires_grad=True):
    requires_grad = bool(requires_grad)
    if t._grad_owner is not None:
        if requires_grad:
            raise RuntimeError("remote-autograd: a .grad handle cannot be made to require grad")
        return t
    if requires_grad == t._rg:
        return t
    if not (t._is_leaf or not t._rg):
        raise RuntimeError(
            "you can only change requires_grad flags of leaf variables. If you want to use a computed variable "
            "in a subgraph that doesn't require differentiation use var_no_grad = var.detach()."
        )
    if requires_grad and not (t._dtype.is_floating_point or t._dtype.is_complex):
        raise RuntimeError("only Tensors of floating point and complex dtype can require gradients")
    t._session.enqueue({"kind": "set_requires_grad", "id": t._id, "requires_grad": requires_grad},
                       _Origin("requires_grad_", where()))
    t._rg, t._is_leaf = requires_grad, True
    if requires_grad:
        t._leaves = frozenset({t._id})
        t._session._grad_tracked[t._id] = t
    else:
        t._leaves = frozenset()
    return t


@_local(T.detach)
def _detach(t):
    from ._tensor import RemoteTensor

    t._check_usable()
    tid = t._session.new_id()
    out = RemoteTensor._new(t._session, tid, t._shape, t._dtype)
    t._session.enqueue({"kind": "call", "op": "detach", "args": [t._ref()], "out": [tid]},
                       _Origin("detach", where(), [weakref.ref(out)]))
    return out


@_local(T.retain_grad)
def _retain_grad(t):
    if not t._rg:
        raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
    if t._is_leaf or t._retains:
        return
    t._session.enqueue({"kind": "retain_grad", "id": t._id}, _Origin("retain_grad", where()))
    t._retains = True
    t._leaves = t._leaves | {t._id}
    t._session._grad_tracked[t._id] = t


@_local(T.retains_grad.__get__)
def _retains_grad(t):
    return t._retains


@_local(T.grad.__get__, T._grad.__get__)
def _grad_get(t):
    return t._grad_handle() if t._has_grad else None


@_local(T.grad.__set__, T._grad.__set__)
def _grad_set(t, value):
    from ._tensor import RemoteTensor

    if value is None:
        ref = None
    else:
        if tuple(value.shape) != t._shape:
            raise RuntimeError("assigned grad has data of a different size")
        if value.dtype != t._dtype:
            raise RuntimeError("assigned grad has data of a different type")
        ref = Encoder(t._session).value(value if isinstance(value, (RemoteTensor, torch.Tensor)) else value)
    t._session.enqueue({"kind": "set_grad", "id": t._id, "grad": ref}, _Origin("set_grad", where()))
    t._has_grad = value is not None
    t._grad_cache = None
    t._custom_grad = None


@_local(T.grad.__delete__)
def _grad_del(t):
    _grad_set(t, None)


@_local(T.backward)
def _backward(t, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    queue_backward([t], [gradient], retain_graph, create_graph, inputs)


@_local(torch.autograd.backward)
def _autograd_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                       inputs=None):
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = grad_variables
    if grad_tensors is None or isinstance(grad_tensors, torch.Tensor):
        grad_tensors = [grad_tensors] * len(tensors) if grad_tensors is None else [grad_tensors]
    queue_backward(tensors, list(grad_tensors), retain_graph, create_graph, inputs)


def queue_backward(tensors: list, grads: list, retain_graph, create_graph: bool, inputs) -> None:
    """Queue a backward step and predict which leaves get a ``.grad`` from it."""
    from ._tensor import RemoteTensor

    session = tensors[0]._session
    enc = Encoder(session)
    for t in tensors:
        if not isinstance(t, RemoteTensor):
            raise TypeError("backward() of a mix of RemoteTensors and local tensors")
        enc.value(t)
    step: dict[str, Any] = {"kind": "backward", "tensors": [t._id for t in tensors]}
    if any(g is not None for g in grads):
        step["grad_tensors"] = [None if g is None else enc.value(g) for g in grads]
    if retain_graph is not None:
        step["retain_graph"] = bool(retain_graph)
    if create_graph:
        step["create_graph"] = True
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        step["inputs"] = [i._id for i in inputs]
        reached = [i for i in inputs]
    else:
        ids: frozenset = frozenset()
        for t in tensors:
            if t._rg:
                ids = ids | t._leaves
        reached = [session._grad_tracked.get(i) for i in ids]
    newly = [leaf for leaf in reached if leaf is not None and not leaf._has_grad]
    for leaf in reached:
        if leaf is not None:
            leaf._has_grad = True
            leaf._custom_grad = None

    def undo() -> None:
        for leaf in newly:
            leaf._has_grad = False

    def correct(result) -> None:
        for tid in (result or {}).get("no_grad") or ():
            leaf = session._grad_tracked.get(tid)
            if leaf is not None and leaf in newly:
                leaf._has_grad = False
                leaf._grad_cache = None

    session.enqueue(step, _Origin("backward", where(), undo=undo, on_result=correct), enc.nbytes)


@_local(torch.autograd.grad)
def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
                   allow_unused=None, is_grads_batched=False, materialize_grads=False):
    from ._tensor import RemoteTensor

    single_input = isinstance(inputs, torch.Tensor)
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    inputs = [inputs] if single_input else list(inputs)
    session = outputs[0]._session
    enc = Encoder(session)
    for t in (*outputs, *inputs):
        enc.value(t)
    step: dict[str, Any] = {"kind": "grad", "outputs": [o._id for o in outputs], "inputs": [i._id for i in inputs]}
    if grad_outputs is not None:
        grad_outputs = [grad_outputs] if isinstance(grad_outputs, torch.Tensor) else list(grad_outputs)
        step["grad_outputs"] = [None if g is None else enc.value(g) for g in grad_outputs]
    if retain_graph is not None:
        step["retain_graph"] = bool(retain_graph)
    if create_graph:
        step["create_graph"] = True
    if allow_unused or materialize_grads:
        step["allow_unused"] = True
    ids = [session.new_id() for _ in inputs]
    step["out"] = ids
    leaves: frozenset = frozenset()
    if create_graph:
        for t in (*outputs, *inputs):
            leaves = leaves | t._leaves
    if allow_unused or materialize_grads:  # which grads are None only the server knows
        index = session.enqueue(step, _Origin("grad", where()), enc.nbytes)
        metas = meta_from_result(session.take_result(index))
        grads = []
        for m, inp in zip(metas, inputs):
            if m is None:
                grads.append(torch.zeros_like(inp) if materialize_grads else None)
            else:
                grads.append(RemoteTensor._new(session, m[0], m[1], m[2], requires_grad=m[3],
                                               leaves=leaves if m[3] else frozenset(), is_leaf=not m[3]))
        return tuple(grads)
    grads = tuple(RemoteTensor._new(session, tid, i._shape, i._dtype, requires_grad=create_graph,
                                    leaves=leaves, is_leaf=not create_graph) for tid, i in zip(ids, inputs))
    session.enqueue(step, _Origin("grad", where(), [weakref.ref(g) for g in grads]), enc.nbytes)
    return grads

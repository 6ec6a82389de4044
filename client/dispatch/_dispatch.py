"""The SDK's one verb for an op, ``call_op``, and the one builder of its step.

``call_op`` takes a torch callable (from ``RemoteTensor.__torch_function__`` and the handlers)
or an op name of the server's table (factories, session ops, ``sess.ops.X``), encodes the
arguments (RemoteTensors become refs, Python values pass through), infers the outputs'
metadata locally, gives them ids and queues the step. Nothing waits unless metadata depends on
values (or only the server knows it: autocast's dtypes, a named op without a cheap rule).

Local tensors follow torch's device rule (``_device_rule``): a 0-d CPU tensor is a constant
(uploaded in the same program), any other raises torch's error at the user's line, except
where torch itself takes CPU tensors beside another device's: those are uploaded on purpose.
"""

from __future__ import annotations

import numbers
import weakref
from typing import Any, Callable, Iterable

import torch
from torch.utils._pytree import tree_leaves

from remote_autograd.proto import dtype_name
from remote_autograd.proto.op_contract import FACTORIES, autocast_applies

from ..device import _autocast
from ..device._device_rule import basic_index, check_local, mixed_devices
from ..session import _caller_memo
from ..session._callsite import refuse_custom_function, where
from ..session._routes import Route
from ..session._session_core import SessionCore, _Origin, meta_from_result
from ..session._unsupported import not_in_table, refuse_local_leaf, refuse_saved_tensors_hooks
from ..tensor import _views
from ..tensor._tensor import RemoteTensor, set_requires_grad_flag
from . import _meta_memo

_DROPPED_KWARGS = frozenset({"device", "memory_format", "layout", "pin_memory", "non_blocking"})
_SETITEM = torch.Tensor.__setitem__
_COPY = torch.Tensor.copy_
_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
_ANY_AUTOCAST = torch._C._is_any_autocast_enabled  # no autocast anywhere (most ops): no call into _autocast
_DEFAULT_DTYPE = torch.get_default_dtype
_SAVED_TENSORS_HOOKS = torch._C._autograd._top_saved_tensors_default_hooks  # (pack, unpack) or None


def _foreign(session: SessionCore, v: RemoteTensor) -> RuntimeError:
    """A handle of another session among an op's arguments: torch's device error, unless a Function's
    backward is being recorded (``capture/_user_functions``), which names what it was not given."""
    foreign = getattr(session, "foreign", None)
    return foreign(v) if foreign is not None else mixed_devices(session.device, v.device)


class Encoder:
    """Wire values for one step's arguments; collects the RemoteTensors it saw."""

    def __init__(self, session: SessionCore) -> None:
        self.session = session
        self.inputs: list = []
        self.nbytes = 0

    def value(self, v: Any, *, any_device: bool = False) -> Any:
        """``v`` as a wire value; ``any_device``: a local tensor here is one torch takes from the CPU."""
        if isinstance(v, RemoteTensor):
            if v._session is not self.session:
                raise _foreign(self.session, v)
            if v._error is not None:  # v._check_usable() and v._ref(), inlined: every argument of every op
                raise v._error
            self.inputs.append(v)
            return {"ref": v._id} if v._grad_owner is None else {"grad_of": v._grad_owner._id}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, torch.Tensor):
            if not any_device:
                check_local(self.session.device, v)
            return self.upload(v)
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        if isinstance(v, slice):
            return {"slice": [self.value(v.start), self.value(v.stop), self.value(v.step)]}
        if v is Ellipsis:
            return {"ellipsis": True}
        if isinstance(v, torch.dtype):
            return {"dtype": dtype_name(v)}
        if isinstance(v, numbers.Number) and hasattr(v, "item"):  # numpy scalars
            return v.item()
        raise TypeError(f"remote-autograd cannot send an argument of type {type(v).__name__}")

    def upload(self, t: torch.Tensor) -> dict:
        """A local tensor used in a remote op on purpose: a constant uploaded in the same program, freed after."""
        if t.requires_grad and torch.is_grad_enabled():
            refuse_local_leaf(t, where())
        remote = RemoteTensor._upload(self.session, t.detach(), requires_grad=False, grad=None)
        self.nbytes += t.numel() * t.element_size()
        return remote._ref()  # `remote` dies here: its id is freed at the end of the program

    def index(self, idx: Any) -> Any:
        """An index: its tensors may be local, as torch takes CPU indices for a tensor of any device."""
        idx = _normalise_index(idx)
        if isinstance(idx, tuple):
            return [self.value(i, any_device=True) for i in idx]
        return self.value(idx, any_device=True)


def _normalise_index(idx: Any) -> Any:
    """An index as torch reads it: a list of plain ints is an index tensor, any other list a tuple.

    On the server a list index always means a tuple, so the client sends advanced list
    indices (also inside tuples) as int64 tensors.
    """
    if isinstance(idx, list):
        idx = torch.tensor(idx) if all(type(i) is int for i in idx) else tuple(idx)
    if isinstance(idx, tuple):
        return tuple(_normalise_index(i) if isinstance(i, list) else i for i in idx)
    return idx


def _value_dependent_index(idx: Any) -> bool:
    """Bool masks and 0-d index tensors make getitem's output shape depend on values: ask the server."""
    items = idx if isinstance(idx, (tuple, list)) else (idx,)
    for i in items:
        if isinstance(i, torch.Tensor) and (i.dtype in (torch.bool, torch.uint8) or i.dim() == 0):
            return True
        if isinstance(i, list) and _value_dependent_index(i):
            return True
    return False


def call_op(session: SessionCore, op: Callable | str, args: tuple | list, kwargs: dict, *,
            route: Route | None = None, n_out: int | None = None) -> Any:
    """Queue ``op(*args, **kwargs)`` as a step of the server's op; returns what torch would return.

    ``op``: a torch callable (``route``: its route, when the caller has looked it up already;
    NotImplementedError naming it when the table has none) or an op name of the server's table
    (factories: metadata from the torch factory on meta; ``n_out=0``: a session op that makes
    nothing, ``manual_seed``)."""
    if route is None:
        route = session._routes.named(op) if isinstance(op, str) else _route_of(session, op)
    func = None if route.by_name else op
    args = tuple(args)
    if kwargs and kwargs.get("out") is not None:
        return _into_out(session, func, route, args, kwargs)
    origin_where = _caller_memo.where()
    grad_on = torch.is_grad_enabled()
    default_dtype = _DEFAULT_DTYPE()  # the outputs' dtypes are inferred under it, and the program runs under it
    if default_dtype is not session._queue_dtype and n_out != 0:  # the queue's first op, or it changed
        session.globals_changed(default_dtype)
    if not grad_on:  # inside a Function's forward? (its own ops, factories and session ops alike)
        refuse_custom_function(func)
    inplace = route.inplace
    if kwargs and func is not None:
        if kwargs.get("inplace") is True:
            inplace = True
        if kwargs.get("device") is not None:
            _check_same_device(session, route.torch_name, kwargs["device"])
        kwargs = {k: v for k, v in kwargs.items() if k not in _DROPPED_KWARGS and k != "inplace"}
    elif kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k not in _DROPPED_KWARGS}
    if func is _COPY and not isinstance(args[0], RemoteTensor):  # local.copy_(remote): a download into it
        return args[0].copy_(args[1].cpu())  # load_state_dict(remote state) into a local model
    wire_args_src = (args[1], args[0], *args[2:]) if route.reflected else args
    enc = Encoder(session)
    if func in _INDEXING:
        basic = basic_index(wire_args_src[1])
        wire_args = [enc.value(wire_args_src[0]), enc.index(wire_args_src[1]),
                     *(enc.value(a, any_device=basic) for a in wire_args_src[2:])]
    else:
        cpu_at = route.op.cpu_args
        if not cpu_at:  # a loop, not a comprehension: no frame of its own per op
            wire_args = []
            for a in wire_args_src:
                wire_args.append(enc.value(a))
        else:
            wire_args = [enc.value(a, any_device=i in cpu_at) for i, a in enumerate(wire_args_src)]
    step: dict[str, Any] = {"kind": "call", "op": route.wire_name, "args": wire_args}
    if kwargs:
        step["kwargs"] = {k: enc.value(v) for k, v in kwargs.items()}
    if not grad_on or (route.by_name and inplace and not route.op.differentiable):  # set_data: never recorded
        step["grad_enabled"] = False
    factory = FACTORIES.get(route.wire_name) if route.by_name else None
    # factories and session ops (n_out=0) make no floating result of other tensors: autocast has no say
    casts = _ANY_AUTOCAST() and autocast_applies(inplace) and factory is None and n_out != 0
    autocast = _autocast.server_dtype() if casts else None
    if autocast is not None:
        step["autocast"] = dtype_name(autocast)
    skip = route.op.no_grad_args
    grad_inputs = enc.inputs if not skip else _grad_inputs(wire_args_src, kwargs, skip)
    rg = False
    if grad_on and route.op.differentiable:
        for t in grad_inputs:  # a loop, not any(genexpr): no generator frame per op
            if t._rg:
                rg = True
                break
    leaves = _union_leaves(grad_inputs) if rg else frozenset()
    if rg and _SAVED_TENSORS_HOOKS(False) is not None:  # a graph is recorded on the server: its hooks are not ours
        refuse_saved_tensors_hooks(_SAVED_TENSORS_HOOKS(False), route.torch_name, origin_where)

    if n_out == 0:  # a session op: nothing made, nothing written
        step["out"] = []
        session.enqueue(step, _Origin(route.wire_name, origin_where), enc.nbytes)
        return None
    if inplace:
        target = wire_args_src[0]
        if isinstance(target, (list, tuple)):  # torch._foreach_X_(tensors, ...) writes every tensor
            return _queue_foreach_inplace(session, step, origin_where, route, target, grad_on, enc)
        if not isinstance(target, RemoteTensor):  # a 0-d local target (any other failed the device rule)
            raise TypeError(f"{route.torch_name}: in-place op on a local tensor with RemoteTensor arguments")
        step["op"] = route.wire_name if route.inplace else route.wire_name + "_"  # F.relu(x, inplace=True)
        _queue_inplace(session, step, origin_where, target, rg, leaves, enc.nbytes, wire_args_src[1:], kwargs,
                       route.op.relayout)
        if route.by_name and route.wire_name == "set_data":  # the one in-place op that may change shape and dtype
            target._adopt_metadata(args[1])
        return None if func is _SETITEM else target

    if factory is not None:
        metas, container, views = _meta_memo.answer("meta", factory, args, {**kwargs, "device": "meta"}, default_dtype)
    else:
        rule = route.op.shape_rule
        if route.by_name and rule != "elementwise":
            rule = "none"  # no torch callable to run on meta: the server says
        if func in _INDEXING:
            if _value_dependent_index(args[1]):
                rule = "none"
            args = (args[0], _normalise_index(args[1]), *args[2:])  # infer with the index as it is sent
        metas, container, views = _meta_memo.answer(rule, func, args, kwargs, default_dtype)
        if autocast is not None and not _views.is_view_call(views):
            metas = None  # the server's autocast rules decide the dtypes (a view keeps its input's)
    if metas is None:
        result = _apply_waiting(session, step, origin_where, rg, leaves, enc.nbytes)
        if func is _INDEXING[0]:
            _views.index_view(_as_list(result), args[0], args[1])
        else:
            _views.settle(_as_list(result), enc.inputs, [], route.op.maybe_view, route.op.differentiable)
        return result
    result = _queue_outputs(session, step, origin_where, metas, container, rg, leaves, enc.nbytes,
                            new_leaves=bool(kwargs.get("requires_grad")))
    # _as_list(result), inline: no call per op
    outs = result if type(result) is list else list(result) if isinstance(result, tuple) else [result]
    _views.settle(outs, enc.inputs, views, route.op.maybe_view, route.op.differentiable)
    return result


def _route_of(session: SessionCore, func: Callable) -> Route:
    route = session._routes.lookup(func)
    if route is None:
        raise not_in_table(func)
    return route


def _as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _check_same_device(session: SessionCore, name: str, device: Any) -> None:
    """``zeros_like(x, device=...)`` and friends run on the session: any other device is refused, never ignored."""
    if torch.device(device) != session.device and torch.device(device) != torch.device(session.device.type):
        raise RuntimeError(f"{name}(..., device={device}) of a remote tensor: it would be made on {session.device}; "
                           f"make it on {device} from local values instead (e.g. torch.zeros(x.shape, device=...))")


def _queue_inplace(session: SessionCore, step: dict, origin_where: str | None, target, rg: bool, leaves: frozenset,
                   nbytes: int, op_args: tuple = (), op_kwargs: dict | None = None, relayout: bool = False) -> None:
    """Queue an in-place step (no new ids) and update the local history of the target and of
    every tensor sharing its memory; a shape-changing op (``t_``) gives the target its new layout."""
    op = step["op"]
    if rg and target._storage is not None:  # only memory shared with another handle can be uncertain
        _views.check_inplace(target, op, rg, leaves)
    # the wire names torch's spelling (``Tensor.t_``): the op is known by its last part
    layout = _views.reshape_inplace_meta(op, target, tuple(op_args), op_kwargs or {}) if relayout else None
    step["out"] = []
    session.enqueue(step, _Origin(op, origin_where), nbytes)
    if layout is not None:
        _views.set_layout(target, layout, type(target))
    _views.after_inplace(target, rg, leaves)


def _into_out(session: SessionCore, func: Callable, route: Route, args: tuple, kwargs: dict) -> Any:
    """``func(..., out=t)`` (Adam's amsgrad ``torch.maximum(a, b, out=m)``): compute, then ``copy_`` into ``t``.

    As torch: out= is not differentiable, so it is refused when a graph would be recorded; a
    result of another shape is refused too (torch would resize ``t`` in place)."""
    out = kwargs["out"]
    kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                         for t in tree_leaves((args, kwargs))):
        raise RuntimeError(f"{route.torch_name}(): functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad.")
    result = call_op(session, func, args, kwargs, route=route)
    outs, results = (out, result) if isinstance(out, (tuple, list)) else ((out,), (result,))
    for o, r in zip(outs, results):
        if tuple(o.shape) != tuple(r.shape):
            raise RuntimeError(f"{route.torch_name}(): out= has shape {list(o.shape)} but the result has "
                               f"{list(r.shape)}; remote-autograd does not resize out= tensors")
        o.copy_(r)
    return out


def _queue_foreach_inplace(session: SessionCore, step: dict, origin_where: str | None, route: Route, targets,
                           grad_on: bool, enc: Encoder) -> None:
    """Queue an in-place step on a list of tensors; torch's optimizers run these under no_grad, and
    with grad on and inputs that require grad we refuse rather than drop the history."""
    if not all(isinstance(t, RemoteTensor) for t in targets):
        raise TypeError(f"{route.torch_name}: in-place op on local tensors with RemoteTensor arguments")
    if grad_on and any(t._rg for t in enc.inputs):
        raise RuntimeError(f"{route.torch_name} on RemoteTensors that require grad is not supported with grad "
                           "enabled; call it under torch.no_grad() (as torch's optimizers do)")
    step["op"] = route.wire_name
    step["out"] = []
    session.enqueue(step, _Origin(step["op"], origin_where), enc.nbytes)
    # Which arguments an op of this kind writes is not declared (GradScaler's found_inf is written
    # too), so every tensor argument's version is bumped: read-only ones then read one more than torch's.
    for t in enc.inputs:
        t._after_inplace(False, frozenset())


def _queue_outputs(session: SessionCore, step: dict, origin_where: str | None, metas: list, container, rg: bool,
                   leaves: frozenset, nbytes: int, *, new_leaves: bool = False) -> Any:
    """Give the outputs ids and local handles, queue the step, return what torch would return.

    ``new_leaves``: the op makes leaves that require grad (``zeros_like(x, requires_grad=True)``).
    """
    ids, outs, refs = [], [], []
    for meta in metas:  # one loop, not three comprehensions: no frame per comprehension per op
        shape, dtype = meta[0], meta[1]  # a third item, False: torch leaves this output without a graph
        tid = session.new_id()
        o = RemoteTensor._new(session, tid, shape, dtype) if not rg or len(meta) > 2 else RemoteTensor._new(
            session, tid, shape, dtype, requires_grad=dtype.is_floating_point or dtype.is_complex, leaves=leaves,
            is_leaf=False)
        if new_leaves:
            o._rg, o._is_leaf, o._leaves = True, True, frozenset({tid})
            set_requires_grad_flag(o, True)
            session._grad_tracked[tid] = o
        ids.append(tid)
        outs.append(o)
        refs.append(weakref.ref(o))
    step["out"] = ids
    session.enqueue(step, _Origin(step["op"], origin_where, refs), nbytes)
    return outs[0] if container is None else container(outs)


def _apply_waiting(session: SessionCore, step: dict, origin_where: str | None, rg: bool, leaves: frozenset,
                   nbytes: int) -> Any:
    """An op whose output metadata only the server knows: send now and read it from the result."""
    step["out"], step["out_many"] = [session.new_id()], True
    index = session.enqueue(step, _Origin(step["op"], origin_where), nbytes)
    result = session.take_result(index)
    outs = [RemoteTensor._new(session, tid, shape, dtype, requires_grad=req, leaves=leaves if req else frozenset(),
                              is_leaf=not req)
            for (tid, shape, dtype, req) in meta_from_result(result)]
    return tuple(outs) if result.get("tuple") else outs[0]


def _grad_inputs(args: tuple, kwargs: dict, skip: frozenset) -> list:
    """The RemoteTensors among the arguments that can receive a gradient (``skip``: positions and names)."""
    found = []
    for i, a in enumerate(args):
        if i not in skip:
            found.extend(iter_tensors([a]))
    for k, v in kwargs.items():
        if k not in skip:
            found.extend(iter_tensors([v]))
    return found


def iter_tensors(values: Iterable[Any]):
    for v in values:
        if isinstance(v, RemoteTensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from iter_tensors(v)


def _union_leaves(inputs: list) -> frozenset:
    leaves: frozenset = frozenset()
    for t in inputs:
        if t._rg and t._leaves:
            leaves = t._leaves if not leaves else leaves | t._leaves
    return leaves

"""Moves between the client and a session: ``.to(device)``, ``.cpu()``, ``module.to``, ``.data``.

Moves are **not differentiable** across the wire: an upload is a new leaf on the server
and a download is a local tensor whose history stops there. So that no gradient can
vanish silently, uploading a tensor that requires grad while grad mode is on raises
(move the leaf itself, or ``.detach()`` first), and a download of a tensor that requires
grad requires grad too (as torch's) but raises if a backward reaches it; inside ``Module.to``/``cpu`` (run under
``no_grad`` by torch) parameters move with their ``requires_grad`` and ``.grad``.

``nn.Module._apply`` keeps a Parameter's identity only when the converted tensor can be
put into the old one (``param.data = new``), which a CPU tensor and a remote handle
cannot share. So when ``_apply`` converts a parameter, the move converts *that object*
in place (``torch._C._swap_tensor_impl`` plus the Python class and ``__dict__``, what
``torch.utils.swap_tensors`` does) and hands it back; ``_apply`` then sees the same
object and keeps it. Optimizers built before or after the move hold the same Parameters.
"""

from __future__ import annotations

import functools
import sys
import weakref

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from remote_autograd.proto.messages import CallStep

from .._core import RemoteTensor, SessionCore, call_op
from ..device._device import DEVICE_TYPE
from ..session._callsite import refuse_custom_function
from ..session._steps import Origin, make_step, where
from ._addresses import share_memory, took_memory
from ._handler_table import HandlerTable

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on

_APPLY_CODE = nn.Module._apply.__code__


def _param_conversion(t: torch.Tensor):
    """The frame of ``nn.Module._apply`` if it is converting the parameter ``t`` right now (a few frames up)."""
    f = sys._getframe(2)
    for _ in range(12):
        if f is None:
            return None
        if f.f_code is _APPLY_CODE:
            return f if f.f_locals.get("param") is t else None
        f = f.f_back
    return None


# Where torch keeps a tensor's own hooks (on the Python tensor), and the call that put them there
_TENSOR_HOOKS = (("_backward_hooks", "Tensor.register_hook"),
                 ("_post_accumulate_grad_hooks", "Tensor.register_post_accumulate_grad_hook"))
_CHECKED_MOVES: weakref.WeakSet = weakref.WeakSet()  # the conversion functions (one per Module.to) already checked


def _refuse_tensor_hooks(apply_frame, device: torch.device) -> None:
    """Refuse a move that would drop a parameter's hooks, before any parameter moves.

    A parameter's hooks live on its local tensor; on the device its backward runs on the server,
    where the local tensor's hooks are not, and the converted parameter would silently stop
    calling it (a clipping hook would stop clipping). The whole module being moved (the outermost
    ``_apply``) is checked at its first parameter, once per ``Module.to`` call: a refused move
    leaves every parameter where it was."""
    convert = apply_frame.f_locals.get("fn")
    try:
        if convert in _CHECKED_MOVES:
            return
    except TypeError:  # a conversion function that cannot be weakly held: checked at every parameter
        convert = None
    root, f = apply_frame.f_locals.get("self"), apply_frame.f_back
    while f is not None:
        if f.f_code is _APPLY_CODE and f.f_locals.get("fn") is convert:
            root = f.f_locals.get("self")
        f = f.f_back
    for name, p in root.named_parameters():
        if isinstance(p, RemoteTensor):  # moved before: a remote tensor takes no hooks
            continue
        for attr, registered_by in _TENSOR_HOOKS:
            if getattr(p, attr, None):
                again = ("register it again on the moved parameter (Tensor.register_hook on a remote tensor runs "
                         "inside the server's backward), or do its work" if registered_by == "Tensor.register_hook"
                         else "do its work")
                raise RuntimeError(
                    f"{type(root).__name__}.to({device}): parameter '{name}' has a hook ({registered_by}) that the "
                    "move would drop: it lives on the local tensor, which the move replaces. Remove it before the "
                    f"move (the handle's .remove()) and {again} after backward on `.grad` (clipping: "
                    f"torch.nn.utils.clip_grad_norm_ or clip_grad_value_ after loss.backward()) ({where() or '?'})"
                )
    if convert is not None:
        _CHECKED_MOVES.add(convert)


def _swap(a: torch.Tensor, b: torch.Tensor) -> None:
    """``a`` becomes what ``b`` was and ``b`` what ``a`` was, each keeping its Python identity."""
    a.__class__, b.__class__ = b.__class__, a.__class__
    a.__dict__, b.__dict__ = b.__dict__, a.__dict__
    torch._C._swap_tensor_impl(a, b)


def _refuse_differentiable_move(t: torch.Tensor, requires_grad: bool, what: str) -> None:
    if requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            f"{what} on a tensor that requires grad: moves between the client and the remote device are not "
            f"differentiable here, so its gradient would be lost. Move the leaf itself (create it on the "
            f"device, or `t.detach().to(device).requires_grad_()`), or `.detach()` first ({where() or '?'})"
        )


def _become(src: torch.Tensor, remote: RemoteTensor, session: SessionCore) -> torch.Tensor:
    """``src`` (a module's parameter or buffer) turned into ``remote`` in place, keeping its identity."""
    remote._is_param = isinstance(src, nn.Parameter)
    _swap(src, remote)
    if src._rg:  # the weakly held map of leaves must name the object that stays
        session._grad_tracked[src._id] = src
    return src


def upload_move(src: torch.Tensor, session: SessionCore, dtype: torch.dtype | None) -> torch.Tensor:
    """``local.to(remote)``: a new remote leaf, or ``src`` itself converted when it is a module's parameter."""
    if is_lazy(src):
        return _lazy_move(src, session, dtype)
    conversion = _param_conversion(src)
    if conversion is not None:
        _refuse_tensor_hooks(conversion, session.device)
        value = src.detach() if dtype in (None, src.dtype) else src.detach().to(dtype)
        grad = None if src.grad is None else src.grad.detach().to(value.dtype)
        remote = RemoteTensor._upload(session, value, requires_grad=src.requires_grad, grad=grad)
        src.grad = None  # its grad now lives on the server; the local one would pin a use of the tensor
        return _become(src, remote, session)
    _refuse_differentiable_move(src, src.requires_grad, f"Tensor.to({session.device})")
    value = src.detach() if dtype in (None, src.dtype) else src.detach().to(dtype)
    return RemoteTensor._upload(session, value, requires_grad=False, grad=None)


# -- lazy modules: materialized on the device at their first forward ----------------------------


def _lazy_move(src: torch.Tensor, session: SessionCore, dtype: torch.dtype | None) -> torch.Tensor:
    """A lazy module's ``UninitializedParameter`` (or buffer) moved to the remote device: it stays
    uninitialized, with no shape to upload, and learns to materialize there.

    On CUDA the uninitialized tensor's empty ``data`` moves, and ``materialize`` makes the real one
    where that data is. Our device has no plain tensors to hold as ``data`` (a handle is not one),
    so the tensor keeps a local empty ``data`` of the asked dtype and an instance ``materialize``
    that makes the real tensor in the session instead: the lazy module's ``initialize_parameters``
    then runs ``reset_parameters`` on it there, as torch does on CUDA, drawing from the session's
    generator. ``Module._apply`` sets a parameter's ``data`` to what this returns (so the dtype
    follows ``.to(device, dtype)``, ``.double()``, ...) and stores a buffer as it is.
    """
    lazy = src
    if _param_conversion(src) is None:  # a buffer: _apply stores this one
        lazy = type(src)(requires_grad=src.requires_grad, dtype=dtype or src.dtype)
        lazy.__dict__.update(src.__dict__)  # persistent, _is_buffer
    lazy.materialize = functools.partial(_materialize, lazy, session)
    if lazy is not src:
        return lazy
    return torch.empty(0, dtype=dtype or src.dtype)  # _apply: `param.data = this`


def _materialize(lazy: torch.Tensor, session: SessionCore, shape, device=None, dtype=None) -> None:
    """``UninitializedTensorMixin.materialize`` for a tensor moved to ``session``'s device: ``lazy``
    becomes a tensor of that device (zeros until ``reset_parameters`` fills it), in place."""
    if device is not None and torch.device(device) != session.device:  # asked for elsewhere: torch's own
        del lazy.materialize
        return lazy.materialize(shape, device=device, dtype=dtype)
    with torch.no_grad():
        remote = torch.empty(tuple(shape), dtype=dtype or lazy.dtype, device=session.device)
    if lazy.requires_grad:
        remote.requires_grad_()
    _become(lazy, remote, session)


def _download(t, device: torch.device, dtype: torch.dtype | None, what: str) -> torch.Tensor:
    """A remote tensor brought to a local device (a parameter of a module being moved: in place)."""
    if _param_conversion(t) is not None:
        value, grad = t._fetch(value=True, grad=t._has_grad)
        local = nn.Parameter(value.to(device=device, dtype=dtype or value.dtype), requires_grad=t._rg)
        if grad is not None:
            local.grad = grad.to(device=device, dtype=local.dtype)
        t._session._grad_tracked.pop(t._id, None)
        _swap(t, local)  # `local` now holds the handle and frees the server's copy when dropped
        return t
    value = t._value()
    value = value.to(device=device, dtype=dtype or value.dtype)
    if t._rg and torch.is_grad_enabled():  # requires grad, as torch's would; backward through it refuses
        return _Downloaded.apply(_ANCHOR, value, f"{what} at {where() or '?'}")
    return value


class _Downloaded(torch.autograd.Function):
    """A downloaded value that requires grad like torch's ``.cpu()`` result, and whose backward
    raises: the gradient would have to go back to the server, which moves do not do."""

    @staticmethod
    def forward(ctx, anchor, value, what):
        ctx.what = what
        return value.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(
            f"a gradient reached {ctx.what}, a move off the remote device: moves are not differentiable, so it "
            f"cannot reach the server. Compute the loss on the remote device (keep the tensors there), or "
            f"`.detach()` before moving"
        )


_ANCHOR = torch.zeros((), requires_grad=True)  # gives _Downloaded's output a graph to hang on


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


@_answers(torch._C._nn._parse_to)
def _module_to_arguments(*args, **kwargs):
    """``Module.to(tensor)`` (botorch's ``self.to(train_X)``) asks torch's ``_parse_to`` for (device, dtype,
    non_blocking, memory_format): torch's own parsing, a remote tensor read as its dtype and device."""
    remote = next(a for a in (*args, *kwargs.values()) if isinstance(a, RemoteTensor))

    def stand_in(a):
        return torch.empty(0, dtype=a._dtype, device="meta") if isinstance(a, RemoteTensor) else a

    _, dtype, non_blocking, memory_format = torch._C._nn._parse_to(
        *map(stand_in, args), **{k: stand_in(v) for k, v in kwargs.items()})
    return remote._session.device, dtype, non_blocking, memory_format


@_answers(T.cpu)
def _cpu(t, memory_format=None):
    return _download(t, torch.device("cpu"), None, "Tensor.cpu()")


@_answers(T.to)
def _to(t, *args, **kwargs):
    """``.to(dtype)`` is a server op; ``.to('cpu')`` a download; ``.to(t.device)`` is t; other devices refuse."""
    device, dtype = _parse_to(args, kwargs)
    if not isinstance(t, RemoteTensor):  # local.to(remote_tensor): its device and dtype, an upload as any other
        return t.to(device, dtype, *[a for a in args if isinstance(a, bool)],
                    **{k: v for k, v in kwargs.items() if k not in ("device", "dtype")})
    if device is not None and device != t._session.device:
        if device.type == DEVICE_TYPE:
            raise RuntimeError(
                f"Tensor.to({device}): this tensor lives in the session on {t._session.device}; tensors do not "
                "move between sessions (bring it to the client with .cpu(), then .to(the other device))"
            )
        if device.type != "cpu":
            raise RuntimeError(f"Tensor.to({device}): a remote tensor moves only to the client ('cpu') or stays "
                               f"on {t._session.device}")
        return _download(t, device, dtype, f"Tensor.to({device})")
    bools = [a for a in args if isinstance(a, bool)]  # to(dtype, non_blocking, copy)
    copy = kwargs.get("copy", bools[1] if len(bools) > 1 else False)
    if (dtype is None or dtype == t._dtype) and not copy:
        return t
    return call_op(t._session, T.to, (t, dtype or t._dtype), {"copy": True} if copy else {})


@_answers(T.type)
def _type(t, dtype=None, non_blocking=False, **kwargs):
    """``x.type()``: the type's name, as torch names a CUDA tensor's (``torch.remote.FloatTensor``); ``x.type(T)``: a
    dtype keeps the device, a type name says the device too (``"torch.DoubleTensor"`` is a CPU one: a download)."""
    if dtype is None:
        return f"torch.{DEVICE_TYPE}." + torch.empty(0, dtype=t._dtype).type().rsplit(".", 1)[1]
    if isinstance(dtype, torch.dtype):
        return t.to(dtype)
    prefix, _, name = str(dtype).rpartition(".")
    tensor_type = getattr(torch, name, None) if prefix in ("torch", f"torch.{DEVICE_TYPE}") else None
    if not isinstance(getattr(tensor_type, "dtype", None), torch.dtype):
        raise ValueError(f"invalid type: '{dtype}'")
    return t.to(device="cpu" if prefix == "torch" else t._session.device, dtype=tensor_type.dtype)


@_answers(T.type_as)
def _type_as(t, other):
    """torch's ``self.type(other.type())``: ``other``'s dtype and device (a local ``other``: a download)."""
    return t.to(device=other.device, dtype=other.dtype)


@_answers(T.cuda)
def _cuda(t, *args, **kwargs):
    raise RuntimeError(
        f"Tensor.cuda(): this tensor lives in a remote-autograd session, on {t._session.device}; the server's GPU is "
        "reached through that device, never as 'cuda' on the client. Use `device = sess.device` where the code "
        "says 'cuda' (`.to(device)`, `model.to(device)`, `torch.zeros(..., device=device)`)"
    )


@_answers(torch._has_compatible_shallow_copy_type)
def _compatible(t, other) -> bool:
    # Module._apply asks this before `param.data = new`; a handle and itself are compatible
    # (the in-place moves above hand back the same object), two handles of one session too.
    return t is other or (type(t) is type(other) and getattr(t, "_session", None) is getattr(other, "_session", 0))


# Below autograd (inside __torch_dispatch__: the set_(storage) torch.load runs), torch asks the aten op itself
# when a handle takes another wrapper's metadata (_views.set_layout): what C++ answers for two of our wrappers.
_answers(torch.ops.aten._has_compatible_shallow_copy_type.default)(lambda t, other: type(t) is type(other))


# -- Tensor.data -----------------------------------------------------------------------------


@_answers(T.data.__get__)
def _data_get(t):
    """A new handle on the same server storage, cut from the graph, with its own version counter (so,
    unlike ``detach()``, not joined to ``t``'s storage here), laid out as ``t``. Queued: no round trip."""
    t._check_usable()
    if not torch.is_grad_enabled():  # inside a Function's forward, the handle may be its output
        refuse_custom_function(T.data.__get__)
    out = RemoteTensor._new(t._session, t._session.new_id(), t._shape, t._dtype)
    out._strides = t._strides
    share_memory(out, t)
    t._session.enqueue(make_step(CallStep, op="data", args=[t._ref()], out=[out._id]),
                       Origin("data", where(), [weakref.ref(out)]))
    return out


@_answers(T.data.__set__)
def _data_set(t, value):
    if value is t:
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Tensor.data must be set to a Tensor, not {type(value).__name__}")
    if not isinstance(value, RemoteTensor) or value._session is not t._session:
        raise RuntimeError(
            f"Tensor.data = <a tensor on {value.device}>: the target lives on {t._session.device}; assign a "
            f"tensor of the same device (`.to({t._session.device})` first)"
        )
    if t._grad_owner is not None:  # `p.grad.data = g`: the gradient itself is replaced
        t._grad_owner.grad = value
        return
    with torch.no_grad():
        call_op(t._session, "set_data", [t, value], {})  # the handle adopts value's metadata as it is queued
    took_memory(t, value)


# -- x.new_*: factories on x's device with x's dtype --------------------------------------------


def _new_factory(factory, *, with_fill: bool = False):
    def handler(t, *args, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
        fill = ()
        if with_fill:
            *args, fill_value = args
            fill = (fill_value,)
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)
        return factory(size, *fill, dtype=dtype or t._dtype, device=device or t._session.device,
                       requires_grad=requires_grad)

    return handler


_answers(T.new_zeros)(_new_factory(torch.zeros))
_answers(T.new_ones)(_new_factory(torch.ones))
_answers(T.new_empty)(_new_factory(torch.empty))
_answers(T.new_full)(_new_factory(torch.full, with_fill=True))


@_answers(T.new)
def _new(t, *args, device=None):
    """torch's legacy ``x.new(...)``: ``t``'s dtype and device; sizes give an uninitialised tensor (zeros here,
    never another session's memory), a sequence gives its values, another tensor of the same kind itself."""
    if device is not None and torch.device(device) != t._session.device:
        raise RuntimeError(f"legacy constructor expects device type: {DEVICE_TYPE} but device type: "
                           f"{torch.device(device).type} was passed")
    if len(args) == 1 and isinstance(args[0], torch.Tensor):
        other = args[0]
        if other.dtype != t._dtype or other.device != t._session.device:
            raise TypeError(f"Tensor.new(other): expected a tensor of dtype {t._dtype} on {t._session.device} "
                            f"(got dtype {other.dtype} on {other.device})")
        return other.view(other.shape)  # an alias, as torch's
    if len(args) == 1 and not isinstance(args[0], (int, torch.Size)):  # data: a (nested) sequence or an array
        return torch.tensor(args[0], dtype=t._dtype, device=t._session.device)
    size = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args if args else (0,)
    return torch.empty(tuple(size), dtype=t._dtype, device=t._session.device)


@_answers(T.new_tensor)
def _new_tensor(t, data, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    dtype, device = dtype or t._dtype, device or t._session.device
    if isinstance(data, torch.Tensor):  # torch: a copy, cut from the graph
        out = data.detach().to(device=device, dtype=dtype, copy=True)
        return out.requires_grad_(requires_grad) if requires_grad else out
    return torch.tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)

"""``RemoteTensor``: a ``torch.Tensor`` wrapper whose values live on the server.

Metadata (shape, dtype, requires_grad, whether ``.grad`` is None) is local and
answered without a round trip; every other torch call becomes a queued step via
``__torch_function__``. Values are fetched only when Python needs them.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.compiler as _compiler
from torch._C import DisableTorchFunctionSubclass

from remote_autograd.proto import decode_tensor, encode_tensor
from remote_autograd.proto.frames import FRAME_MIN_BYTES

from ..session._callsite import refuse_custom_function, where
from ..session._session_core import _Origin
from ..session._unsupported import not_in_table
from . import _func_transforms, _traced, _views
from ._factory_outputs import MADE, settle_requires_grad

if TYPE_CHECKING:  # the public Session, above this module, is what every handle holds
    from .._session import Session

SEND_NOW_BYTES = 64 << 20  # an upload this big is sent at once, straight from the caller's memory


_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass


def _not_wired(*args, **kwargs):
    raise RuntimeError("remote_autograd.client is not wired: import the package, not one of its modules alone")


# Slots the package's wiring (client/__init__.py) fills once: what fills them (the handler
# modules, dispatch) imports this module, so this module cannot import them.
LOCAL_HANDLERS: dict[Callable, Callable] = {}  # torch calls a handle answers itself (metadata, autograd, moves)
_call_op: Callable = _not_wired  # dispatch's call_op: a torch call queued as a step of the server's op


def wire(*, local_handlers: dict[Callable, Callable], call_op: Callable) -> None:
    """Fill the slots above (the package's wiring calls this once, as it is imported)."""
    global _call_op
    LOCAL_HANDLERS.update(local_handlers)
    _call_op = call_op


class RemoteTensor(torch.Tensor):
    """A handle to a tensor held by a remote-autograd session."""

    _session: Session
    _id: str | None

    # What most handles keep all their life, read through the class until a handle sets its own:
    # ``_new`` then sets only what differs per handle. Shared memory (see _views): the storage it
    # shares, the base of a view, strides (None: contiguous), and its own version counter while it
    # shares memory with nothing; where it starts in that memory, in bytes (None: only the server knows).
    _has_grad, _grad_owner, _grad_cache, _error, _retains, _meta_t = False, None, None, None, False, None
    _storage = _view_of = _strides = None
    _ver = _byte_offset = 0
    _fake = None  # while torch.compile traces: the fake stand-in of a traced wrapper (_traced.py)

    @staticmethod
    def __new__(cls, *args, **kwargs):
        raise TypeError("make RemoteTensors with Session.tensor(...) or RemoteTensor.from_torch(t, session)")

    @classmethod
    def _new(cls, session: Session, tid: str | None, shape, dtype: torch.dtype, *, requires_grad: bool = False,
             leaves: frozenset = frozenset(), is_leaf: bool = True, grad_owner: "RemoteTensor | None" = None
             ) -> "RemoteTensor":
        # torch.compile's guards read the C++ flag: it is the handle's own (set_requires_grad_flag keeps them one)
        r = _MAKE_WRAPPER(cls, shape, dtype=dtype, device=session.device, requires_grad=requires_grad)
        r._session, r._id, r._shape, r._dtype = session, tid, tuple(shape), dtype
        r._rg, r._is_leaf, r._leaves = requires_grad, is_leaf, leaves
        if grad_owner is not None:
            r._grad_owner = grad_owner
        if requires_grad and is_leaf and tid is not None:
            r._leaves = frozenset({tid})
            session._grad_tracked[tid] = r
        return r

    @classmethod
    def _upload(cls, session: Session, t: torch.Tensor, *, requires_grad: bool, grad: torch.Tensor | None
                ) -> "RemoteTensor":
        if requires_grad and not (t.is_floating_point() or t.is_complex()):
            raise RuntimeError("only Tensors of floating point and complex dtype can require gradients")
        tid = session.new_id()
        nbytes = t.numel() * t.element_size()
        send_now = nbytes >= SEND_NOW_BYTES and t.is_contiguous() and t.device.type == "cpu"
        if send_now:  # sent before we return: the caller's own bytes go out, no copy to protect them
            value = encode_tensor(t, as_view=True)
        elif nbytes >= FRAME_MIN_BYTES:  # one private copy whose bytes go out as a frame as they are
            value = encode_tensor(t, as_view=True, private=True)  # numpy's copy: see encode_tensor
        else:
            value = encode_tensor(t)
        step: dict[str, Any] = {"kind": "put", "id": tid, "value": value, "requires_grad": requires_grad}
        if grad is not None:
            step["grad"] = encode_tensor(grad.to(t.dtype))
        r = cls._new(session, tid, t.shape, t.dtype, requires_grad=requires_grad, is_leaf=True)
        if grad is not None:
            set_has_grad(r, True)
        session.enqueue(step, _Origin("put", where(), [weakref.ref(r)]), nbytes)
        if send_now and session.pipeline:
            session.flush()
        return r

    # -- the boundary with local torch: from_torch / to_torch ----------------------------------------

    @classmethod
    def from_torch(cls, t: torch.Tensor, session: Session) -> "RemoteTensor":
        """Upload ``t``: its values, ``requires_grad``, and a copy of ``t.grad`` when it has one."""
        grad = t.grad.detach().clone() if t.grad is not None else None
        return cls._upload(session, t.detach(), requires_grad=t.requires_grad, grad=grad)

    def to_torch(self) -> torch.Tensor:
        """A local leaf with this tensor's values, its ``requires_grad``, and a copy of its grad."""
        if self._grad_owner is not None:
            return self._grad_owner._fetch(value=False, grad=True)[1]
        value, grad = self._fetch(value=True, grad=self._has_grad)
        out = value.requires_grad_(self._rg)
        if grad is not None:
            out.grad = grad.to(device=out.device, dtype=out.dtype)
        return out

    def _fetch(self, *, value: bool, grad: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        self._check_usable()
        message = self._session.fetch(self._id, value=value, grad=grad)
        v = decode_tensor(message["value"], copy=False) if message.get("value") is not None else None
        g = decode_tensor(message["grad"], copy=False) if message.get("grad") is not None else None
        return v, g

    def _value(self) -> torch.Tensor:
        """The values as a local tensor without grad (one flush)."""
        if self._grad_owner is not None:
            g = self._grad_owner._fetch(value=False, grad=True)[1]
            if g is None:
                raise RuntimeError("the gradient this handle refers to is None on the server")
            return g
        return self._fetch(value=True, grad=False)[0]

    # -- local state --------------------------------------------------------------------------

    @property
    def remote_device(self) -> str:
        """Where the values live: the server's device."""
        return self._session.remote_device

    @property
    def session(self) -> Session:
        return self._session

    def _ref(self) -> dict:
        if self._grad_owner is not None:
            return {"grad_of": self._grad_owner._id}
        return {"ref": self._id}

    def _meta(self) -> torch.Tensor:
        """A meta stand-in (shape, dtype, strides), kept: a view op's meta output is known as a view by it."""
        if self._meta_t is None or tuple(self._meta_t.shape) != self._shape:
            # made apart from torch.func's transforms: a factory under grad() is a GradTrackingTensor of its
            # level, and dynamo, tracing a transform, fakeifies the stand-in of a handle it meets there
            with torch._C._DisableFuncTorch():
                self._meta_t = _views.meta_of(self)
        return self._meta_t

    def _check_usable(self) -> None:
        if self._error is not None:
            raise self._error

    def _after_inplace(self, rg: bool, leaves: frozenset) -> None:
        """Local bookkeeping after a queued in-place op: history and versions,
        for this tensor and every tensor sharing its memory (see ``_views``)."""
        _views.after_inplace(self, rg, leaves)

    def _adopt_metadata(self, value: "RemoteTensor") -> None:
        """After ``self.data = value`` on the server: the handle takes value's shape, dtype and strides
        (and C++'s own sizes and strides)."""
        self._dtype, self._strides = value._dtype, value._strides
        _views.set_layout(self, value._meta(), type(self))

    def _grad_handle(self) -> "RemoteTensor":
        if self._grad_cache is None:
            self._grad_cache = RemoteTensor._new(self._session, None, self._shape, self._dtype, grad_owner=self)
        return self._grad_cache

    def __del__(self) -> None:
        tid = getattr(self, "_id", None)
        if tid is not None and getattr(self, "_grad_owner", None) is None:
            try:
                self._session._free_later(tid)
            except Exception:  # interpreter shutdown
                pass

    # -- torch's entry point ------------------------------------------------------------------

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _compiler._is_compiling_flag and _traced.is_traced(args, kwargs):  # torch.compile traces: _traced.py
            return _traced.through(func, args, kwargs)
        if _func_transforms.active() and not _compiler._is_compiling_flag:  # torch.func.grad / vmap around the call
            raise _func_transforms.refused(func)
        if MADE.refs:  # a factory just made a tensor that torch may have marked requires_grad
            settle_requires_grad()
        local = LOCAL_HANDLERS.get(func)
        if local is not None:
            return local(*args, **kwargs)
        session = args[0]._session if args and type(args[0]) is RemoteTensor else _session_of(args, kwargs)
        route = session._routes.lookup(func)
        if route is None:
            if _compiler._is_compiling_flag:  # torch.compile reads a handle's C++ facts (_is_view, storage_offset)
                return _traced.through(func, args, kwargs)
            if not torch.is_grad_enabled():  # inside a Function's forward (module backward hooks): say so
                refuse_custom_function(func)
            raise not_in_table(func)
        if _compiler._is_compiling_flag and _func_transforms.active():  # dynamo traces a transform: facts only
            raise _func_transforms.refused(func)
        return _call_op(session, func, args, kwargs, route=route)

    # -- torch.compile (_traced.py) --------------------------------------------------------------

    @property
    def _stand_in(self) -> torch.Tensor:
        return _traced.stand_in(self)

    __tensor_flatten__ = _traced.HiddenFromApply(_traced.flatten)

    @staticmethod
    def __tensor_unflatten__(inner: dict, ctx: tuple, outer_size, outer_stride) -> "RemoteTensor":
        return _traced.unflatten(RemoteTensor, inner, ctx, outer_size, outer_stride)

    def _stable_hash_for_caching(self) -> str:
        """What AOTAutograd's cache keys a subclass by (a remote tensor never reaches it: ``_traced``)."""
        return "remote_autograd.RemoteTensor"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _compiler._is_compiling_flag and _traced.is_traced(args, kwargs):
            return _traced.dispatch(cls, func, args, kwargs or {})
        if func is torch.ops.aten.lift_fresh.default:  # torch.tensor(data, device=remote) marks its result fresh
            return args[0]
        fill = _DISPATCHED_FILLS.get(func)
        if fill is not None:  # torch.zeros_like(local, device=remote): torch's kernel fills what our empty made
            return _call_op(args[0]._session, fill, args, kwargs or {})
        method = _DISPATCHED_METHODS.get(func)
        if method is not None:  # torch's rule: a view is an inference tensor exactly when its base is one
            with torch.inference_mode(args[0].is_inference()):
                return LOCAL_HANDLERS[method](*args, **(kwargs or {}))
        local = LOCAL_HANDLERS.get(func)
        if local is not None:  # an aten call torch's Python binding sends past __torch_function__ (set_(storage))
            return local(*args, **(kwargs or {}))
        # Anything else got here under torch's functions: a torch.func transform (grad, vmap, jacrev
        # wrap tensors below __torch_function__) or a TorchDispatchMode. Loud, never ignored.
        raise RuntimeError(
            f"{func} reached a remote tensor below torch's functions: torch.func transforms (grad, vmap, jacrev, "
            "...) and TorchDispatchModes cannot run on remote tensors (their values live on the server); wrap a "
            "transform's call in torch.compile(..., backend=\"remote\") to run it on the server (with no graph "
            "break inside the transform: a print, an .item()), or use "
            "loss.backward() / torch.autograd.grad on the device instead"
        )


# A handle's own fields (those ``_new`` sets and the class defaults above): what a copy of it never
# copies; anything else in its ``__dict__`` is the user's (``copy.deepcopy`` copies those)
HANDLE_FIELDS = frozenset({"_session", "_id", "_shape", "_dtype", "_rg", "_is_leaf", "_leaves", "_has_grad",
                           "_grad_owner", "_grad_cache", "_error", "_retains", "_meta_t", "_storage", "_view_of",
                           "_strides", "_ver", "_byte_offset", "_fake", "_grad_stand_in"})

_aten = torch.ops.aten
_DISPATCHED_FILLS = {_aten.zero_.default: "zero_", _aten.fill_.Scalar: "fill_", _aten.normal_.default: "normal_",
                     _aten.uniform_.default: "uniform_"}
# aten calls torch's C++ makes on a remote tensor without its Python method: a Function returning an
# input unchanged where nothing is recorded gets ``input.detach()`` (its C++ requires_grad is the SDK's)
_DISPATCHED_METHODS = {_aten.detach.default: torch.Tensor.detach}


def _session_of(args: tuple, kwargs: dict) -> Session:
    """The session of the first RemoteTensor among the arguments (``__torch_function__`` reads the
    common case, a method of a handle, itself)."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, RemoteTensor):
            return v._session
        if isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, RemoteTensor):
                    return x._session
    raise RuntimeError("no RemoteTensor among the arguments")


# -- the C++ tensor's autograd facts, kept those of the handle ----------------------------------
# torch.compile's guards read the C++ tensor (its requires_grad, its .grad), and its epilogue
# code reads .grad back, so the wrapper's C++ fields are kept in step with the SDK's own.

_SET_REQUIRES_GRAD = torch.Tensor.requires_grad.__set__
_SET_GRAD = torch.Tensor.grad.__set__


def set_requires_grad_flag(t: RemoteTensor, value: bool) -> None:
    """The C++ ``requires_grad`` of ``t`` made its ``_rg``."""
    with DisableTorchFunctionSubclass():
        _SET_REQUIRES_GRAD(t, value)


def set_has_grad(t: RemoteTensor, value: bool) -> None:
    """Whether ``t`` has a ``.grad`` (``_has_grad``), and the C++ ``.grad`` to match: a stand-in of the
    grad's layout (the C++ grad must not hold ``t``, which holds it: no collector sees that cycle)."""
    t._has_grad = value
    with DisableTorchFunctionSubclass():
        _SET_GRAD(t, _grad_stand_in(t) if value else None)


def _grad_stand_in(t: RemoteTensor) -> RemoteTensor:
    g = t.__dict__.get("_grad_stand_in")  # kept: zero_grad and every backward set it again
    if g is not None and g._shape == t._shape and g._dtype == t._dtype:
        return g
    g = t.__dict__["_grad_stand_in"] = _MAKE_WRAPPER(RemoteTensor, t._shape, dtype=t._dtype,
                                                     device=t._session.device)
    g._session, g._id, g._shape, g._dtype, g._rg, g._is_leaf, g._leaves = t._session, None, t._shape, t._dtype, \
        False, True, frozenset()
    g._error = RuntimeError("the C++ .grad of a remote tensor stands in for its layout only; read it as `t.grad`")
    return g

"""The SDK's core: ``RemoteTensor``, the session's queue of steps (``SessionCore``), and ``call_op``,
the one builder of an op's step. One module, because the three are one idea seen from three sides:
a tensor's torch call becomes a step (``call_op``) queued on its session, the session gives ids and
sends its queue as a program, and a failed program marks the tensors its steps made failed.

    handle:   ``RemoteTensor``: a ``torch.Tensor`` wrapper whose values live on the server. Metadata
              (shape, dtype, requires_grad, whether ``.grad`` is None) is local and answered without a
              round trip; every other torch call starts in ``__torch_function__``. Values are fetched
              only when Python needs them.
    queue:    ``SessionCore``: one server session, its id counter and the steps not yet sent; a
              program goes out when a value is needed, on ``sync()``, when the queue reaches the
              session's limits, and on ``close()``. When step k fails, the outputs of steps from k on
              are marked failed: the error is raised there and again wherever a failed tensor is used.
              The public ``Session`` (``client/_session.py``) adds uploads, factories, ops by name.
    builder:  ``call_op``: a torch callable or an op name made a step: arguments encoded (handles
              become refs; ``Encoder``), outputs' metadata inferred, ids given, the step built once
              (``session/_steps.make_step``, which builds every step of the client from its
              ``proto/messages`` type) and queued. Nothing waits unless metadata depends on values
              (or only the server knows it: autocast's dtypes, a named op without a cheap rule). Local
              tensors follow torch's device rule (``device/_device_rule``). ``tensors_of`` is the
              client's one walker of nested arguments.

Everything else sits around this module: below it the pure pieces it imports (``transport/``,
``device/``, ``session/`` (routes, the step builder and ``Origin``, the user's line, torch's
settings), ``tensor/`` (views, torch.compile's traced wrapper, the C++ autograd flags)); above it
what imports it (``dispatch/`` inference and user Functions, ``handlers/``, ``capture/``, the
public ``Session``). It imports none of those above.

Two things above it are called from here, each through a table this module defines and the module
above fills as it is imported (as libraries fill torch's own override tables), never through a slot
the package wires:

- ``LOCAL_HANDLERS``: torch callable -> the function a handle answers it with (metadata, autograd,
  moves...), filled by ``handlers/``. A table, not code held here: dozens of handlers in families,
  one module each; they use the core, and the core reaches them by this look-up alone.
- ``INFERENCE["outputs"]``: what a call makes (shapes, dtypes, which outputs are views of which
  inputs), filled by ``dispatch/_meta_memo`` with its answer. Inference tells a handle from a local
  tensor by its class, so it imports this module; its rules and its memo (a speed path with its own
  switch) are not mutual with the tensor and the queue, so they sit above and register.
"""

from __future__ import annotations

import itertools
import numbers
import secrets
import weakref
from functools import partial
from typing import Any, Callable, Self

import torch
import torch.compiler as _compiler
from torch.utils._pytree import tree_leaves

from remote_autograd.proto import decode_tensor, dtype_name, encode_tensor, torch_globals
from remote_autograd.proto.codec import FRAME_MIN_BYTES
from remote_autograd.proto.messages import CallStep, ClearGradsStep, FetchStep, FreeStep, PutStep
from remote_autograd.proto.op_contract import FACTORIES, autocast_applies

from .device import _autocast
from .device._device import claim_index, release_index
from .device._device_rule import (basic_index, check_local, check_same_device, mixed_devices,
                                  normalise_index, value_dependent_index)
from .session import _checkpoint_regions, _steps
from .session._answers import lost_template, meta_from_result
from .session._banner import announce
from .session._callsite import refuse_custom_function
from .session._routes import Route, route_table
from .session._steps import OMIT, Origin, QueueGlobals, make_step, op_where, where
from .session._unsupported import not_in_table, refuse_local_leaf, refuse_saved_tensors_hooks
from .tensor import _foreach, _func_transforms, _traced, _views
from .tensor._autograd_flags import set_has_grad, set_requires_grad_flag
from .tensor._factory_outputs import MADE, settle_requires_grad
from .transport._errors import RemoteError
from .transport._protocol_advice import explain
from .transport._transport import Transport, error_from

# -- the tables the modules above fill as they are imported (see the docstring) ---------------------
LOCAL_HANDLERS: dict[Callable, Callable] = {}  # handlers/: torch calls a handle answers itself
INFERENCE: dict[str, Callable] = {}  # dispatch/_meta_memo: "outputs" -> answer(rule, func, args, kwargs, dtype)

SEND_NOW_BYTES = 64 << 20  # an upload this big is sent at once, straight from the caller's memory


_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass


class RemoteTensor(torch.Tensor):
    """A handle to a tensor held by a remote-autograd session."""

    _session: SessionCore
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
    def _new(cls, session: SessionCore, tid: str | None, shape, dtype: torch.dtype, *, requires_grad: bool = False,
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
    def _upload(cls, session: SessionCore, t: torch.Tensor, *, requires_grad: bool, grad: torch.Tensor | None
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
        put = make_step(PutStep, id=tid, value=value, requires_grad=requires_grad,
                   grad=OMIT if grad is None else encode_tensor(grad.to(t.dtype)))
        r = cls._new(session, tid, t.shape, t.dtype, requires_grad=requires_grad, is_leaf=True)
        if grad is not None:
            set_has_grad(r, True)
        session.enqueue(put, Origin("put", where(), [weakref.ref(r)]), nbytes)
        if send_now and session.pipeline:
            session.flush()
        return r

    # -- the boundary with local torch: from_torch / to_torch ----------------------------------------

    @classmethod
    def from_torch(cls, t: torch.Tensor, session: SessionCore) -> "RemoteTensor":
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
        if self._error is not None:  # self._check_usable(), inline: every read of a value
            raise self._error
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
    def session(self) -> SessionCore:
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
        # kept weakly: the grad's handle holds its owner (it names the grad by the owner's id), and a strong
        # reference back would be a cycle that only the garbage collector breaks, the owner's server memory
        # held until it ran (local torch frees a dropped parameter at once). ``p.grad is p.grad`` all the same.
        cached = self._grad_cache
        g = None if cached is None else cached()
        if g is None:
            g = RemoteTensor._new(self._session, None, self._shape, self._dtype, grad_owner=self)
            self._grad_cache = weakref.ref(g)
        return g

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
        try:  # session._routes.lookup(func)'s answer, inline: every op looks up its route
            route = session._routes.by_func[func]
        except (KeyError, TypeError):  # the callable's first call, or an unhashable one
            route = session._routes.lookup(func)
        if route is None:
            if _compiler._is_compiling_flag:  # torch.compile reads a handle's C++ facts (_is_view, storage_offset)
                return _traced.through(func, args, kwargs)
            if not torch.is_grad_enabled():  # inside a Function's forward (module backward hooks): say so
                refuse_custom_function(func)
            raise not_in_table(func)
        if _compiler._is_compiling_flag and _func_transforms.active():  # dynamo traces a transform: facts only
            raise _func_transforms.refused(func)
        return call_op(session, func, args, kwargs, route=route)

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
            return call_op(args[0]._session, fill, args, kwargs or {})
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
_foreach.take_foreach_paths(RemoteTensor)  # torch's optimizers choose for sess.device what they choose for cuda

_aten = torch.ops.aten
_DISPATCHED_FILLS = {_aten.zero_.default: "zero_", _aten.fill_.Scalar: "fill_", _aten.normal_.default: "normal_",
                     _aten.uniform_.default: "uniform_"}
# aten calls torch's C++ makes on a remote tensor without its Python method: a Function returning an
# input unchanged where nothing is recorded gets ``input.detach()`` (its C++ requires_grad is the SDK's)
_DISPATCHED_METHODS = {_aten.detach.default: torch.Tensor.detach}


def _session_of(args: tuple, kwargs: dict) -> SessionCore:
    """The session of the first RemoteTensor among the arguments (``__torch_function__`` reads the
    common case, a method of a handle, itself)."""
    found = tensors_of((args, kwargs), [])
    if not found:
        raise RuntimeError("no RemoteTensor among the arguments")
    return found[0]._session


def tensors_of(v: Any, found: list, *, local: bool = False) -> list:
    """The client's one walker of nested arguments: the RemoteTensors in ``v`` (``local``: every torch tensor),
    through lists, tuples, dict values and slices, appended to ``found`` in order, each once; ``found``.

    Its order (arguments, then keyword arguments' values, depth first) is the order the meta memo's key
    (``dispatch/_meta_memo``) meets them in, by which an answer names a view's source. ``Encoder.value``
    walks the same values into wire values as it encodes them."""
    if isinstance(v, RemoteTensor if not local else torch.Tensor):
        for seen in found:  # by identity: == on tensors is an op
            if seen is v:
                return found
        found.append(v)
    elif isinstance(v, dict):
        tensors_of(tuple(v.values()), found, local=local)
    elif isinstance(v, (list, tuple)):
        for x in v:
            tensors_of(x, found, local=local)
    elif type(v) is slice:
        tensors_of((v.start, v.stop, v.step), found, local=local)
    return found


# == the queue: one server session's steps, sent as programs =================================

_TOP_HOOKS = _checkpoint_regions.TOP_HOOKS


class SessionCore:
    """A session on a remote-autograd server: its queue of steps, flushed as programs."""

    def __init__(self, transport: Transport, *, pipeline: bool = True, run_ahead: bool = True) -> None:
        self._transport = transport
        try:
            info = transport.call("POST", "/v1/sessions", {})
        except RemoteError as exc:  # a protocol mismatch becomes one error saying what to upgrade
            error = explain(transport, exc)
            transport.close()  # no session will: its connections (or in-process app) end here
            raise error from None
        self.id: str = info["session_id"]
        self.remote_device: str = info["device"]
        self.server_version: str = info["server_version"]
        self.limits: dict[str, Any] = info["limits"]
        self.pipeline = pipeline
        self.run_ahead = run_ahead  # a compiled step's request may be answered before its backward ran (flush)
        self._routes = route_table(transport)
        self._path = f"/v1/sessions/{self.id}"
        self._program_prefix = secrets.token_hex(4)
        self._programs = itertools.count(1)
        # new_id() -> "t1", "t2", ...: the id of each tensor the session makes, a C callable (no Python frame per id)
        self.new_id: Callable[[], str] = map("t{}".format, itertools.count(1)).__next__
        self._queue: list[dict] = []
        self._origins: list[Origin | None] = []
        self._queued_bytes = 0
        self._frees: list[str] = []
        # the default dtype the queued ops were inferred under (None: no op queued), and torch's other
        # settings they run under (session/_steps' QueueGlobals)
        self._queue_dtype: torch.dtype | None = None
        self._globals = QueueGlobals()
        self._grad_tracked: weakref.WeakValueDictionary[str, RemoteTensor] = weakref.WeakValueDictionary()
        # handles with hooks (handlers/_hooks), by id(handle): recorded at each backward and grad call
        self._hooked: weakref.WeakValueDictionary[int, RemoteTensor] = weakref.WeakValueDictionary()
        self._hook_kept: dict[str, RemoteTensor] = {}  # hooked non-leaves kept as torch keeps their hooks, by id
        # hooks on the server nodes of module backward hooks (handlers/_node_hooks), by node id, while they live
        self._node_hooks: dict[str, Any] = {}
        self._templates: dict[str, dict] = {}  # template id -> its step: the templates this session has been sent
        # the last program when it was answered before all its steps ran (SPEC §3, running ahead): its id and
        # origins, for the error of one of them that the next answer may bring
        self._ahead: tuple[str, list[Origin | None]] | None = None
        self._regions = _checkpoint_regions.Regions()  # torch.utils.checkpoint(use_reentrant=False)'s, open
        self._closed = False
        self._max_steps = max(2, int(self.limits["max_steps_per_program"]) - 1)  # room for a free step
        self._max_bytes = int(self.limits["max_body_bytes"]) // 2
        self.device: torch.device = claim_index(self)  # torch.device("remote", k) while open
        announce(info, transport.base_url)  # one line on connect, in notebooks only

    # -- context manager --------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._queue)} queued"
        return f"<remote-autograd Session {self.id} on {self._transport.base_url} ({self.remote_device}), {state}>"

    def close(self) -> None:
        """Send what is queued, then delete the session on the server (freeing all its tensors)."""
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self._closed = True
            release_index(self.device)
            try:
                self._transport.request("DELETE", self._path)
            finally:
                self._transport.close()

    @property
    def requests(self) -> int:
        """HTTP requests this session's transport has sent (tests and benchmarks count these)."""
        return self._transport.requests

    def sync(self) -> None:
        """Send every queued step now and wait; raises the first error."""
        self.flush()

    def stats(self) -> dict[str, Any]:
        """The server's view of this session: tensors and bytes held (sends queued steps first)."""
        self.flush()
        return self._transport.call("GET", self._path, session=self.id)

    # -- the queue --------------------------------------------------------------------------

    def enqueue(self, step: dict, origin: Origin | None, nbytes: int = 0) -> int:
        """Queue a step; returns its index in the next program. Eager sessions send at once."""
        if self._closed:
            self._check_open()
        hooks = _TOP_HOOKS(False)  # a checkpointed function's region begins or ends here? (_checkpoint_regions)
        if hooks is None:
            if self._regions.open:
                _checkpoint_regions.sync(self, hooks)
        elif hooks[0] is not self._regions.pack:
            _checkpoint_regions.sync(self, hooks)
        queue = self._queue
        if queue and (len(queue) >= self._max_steps or self._queued_bytes + nbytes > self._max_bytes):
            self.flush()
            queue = self._queue
        queue.append(step)
        self._origins.append(origin)
        self._queued_bytes += nbytes
        index = len(queue) - 1
        if not self.pipeline:
            self._pending_results = self.flush()
        return index

    def clear_grad(self, tid: str, line: str | None) -> None:
        """``.grad = None`` of tensor ``tid``, set at ``line``: one after another from one line (an optimizer's
        ``zero_grad``), they are one ``clear_grads`` step whose ids grow (each a ``set_grad`` step, the server's
        Python around each and its decoding, cost as much again as the clearing itself)."""
        queue = self._queue
        if (queue and queue[-1]["kind"] == "clear_grads" and self._origins[-1].where == line
                and _TOP_HOOKS(False) is None and not self._regions.open):  # else enqueue's region bookkeeping
            queue[-1]["ids"].append(tid)
            return
        self.enqueue(make_step(ClearGradsStep, ids=[tid]), Origin("clear_grads", line))

    def globals_changed(self, dtype: torch.dtype) -> None:
        """An op is queued under default dtype ``dtype``, not the queue's: the queue's first op, or a
        change since its last (the ops so far are sent first: a program runs under one)."""
        if self._queue_dtype is not None:
            self.flush()
        # the queue's first op: torch's settings now (raises, at the user's line, when unreadable)
        self._globals.flags = torch_globals.read()[1:]  # all but the default dtype (read per op)
        self._queue_dtype = dtype

    def autograd_fields(self) -> dict:
        """A backward or grad step about to be built: torch's settings as for an op (a change sends what is
        queued first); the step's own fields for anomaly detection."""
        dtype = torch.get_default_dtype()
        if dtype is not self._queue_dtype:
            self.globals_changed(dtype)
        return self._globals.autograd_fields() if _ANOMALY() else {}

    def ensure_template(self, tid: str, step: dict) -> None:
        """Queue template ``tid``'s definition unless this session has been sent it (a compiled graph's
        first call here: ``capture``)."""
        if tid not in self._templates:
            self._templates[tid] = step
            # a program failing at or before it leaves the server without it: sent again at its next use
            self.enqueue(step, Origin("template", None, undo=lambda: self._templates.pop(tid, None)))

    def flush(self) -> list:
        """Send the queue as one program; the results, one per step."""
        held = _steps.HELD  # let go of the frame where() remembers: it may be the last to hold a tensor,
        held[0] = held[1] = None  # freed in this program
        frees, self._frees = self._frees, []
        steps, origins = self._queue, self._origins
        if frees:
            steps, origins = steps + [make_step(FreeStep, ids=frees)], origins + [None]
        if not steps and self._ahead is None:
            return []  # (else an empty program: the server answers once the last one's steps all ran)
        big = self._queued_bytes >= FRAME_MIN_BYTES
        self._queue, self._origins, self._queued_bytes = [], [], 0
        program_id = f"{self._program_prefix}-{next(self._programs)}"
        dtype, self._queue_dtype = self._queue_dtype, None
        fields: dict = {}
        if dtype is not None:  # a program with ops runs under the torch settings they were queued under
            try:
                fields = self._globals.fields(dtype, program_id, origins)
            except RemoteError as error:  # changed while they were queued: none of them runs
                self._frees = frees + self._frees
                self._fail_all(error, origins, 0)
        sent_origins = origins
        # A compiled step's program may be answered once the fetches at its end are known, before the steps they
        # do not wait for (its backward and optimizer) have run: the next step's Python runs meanwhile (SPEC §3,
        # running ahead). Only then: a backward run after the answer that would have told the client a grad
        # stayed None fails the next program instead, which a compiled step's optimizer would do anyway (it reads
        # every grad the client expects), where an eager program's next line could ask ``p.grad is None``.
        ahead = self.run_ahead and any(step["kind"] == "run_template" for step in steps)
        done: list = []
        for _ in range(len(self._templates) + 1):
            # The SDK names every output and infers its metadata: the server need not send it back
            # (it still answers what only it knows: fetches, out_many calls, allow_unused grads, no_grad).
            # ``fields``: the torch settings the steps were queued under (session/_steps' QueueGlobals).
            program = {"id": program_id, "steps": steps, "omit_known_meta": True, **fields}
            if ahead:
                program["answer_early"] = True
            status, body = self._transport.request("POST", self._path + "/programs", program, big=big)
            if status >= 400 and self._ahead is not None and _earlier(body) == self._ahead[0]:
                self._frees = frees + self._frees  # none of this program ran: its frees go with the next
                self._fail_ahead(status, body, origins)
            self._ahead = None
            sent = program_id, origins  # (the steps ``pending`` counts in: a template sent again comes first)
            lost = lost_template(body, steps) if status == 404 else None
            if lost not in self._templates:
                break
            # the server restarted since it was sent this template (a restart keeps none): send it again,
            # then the steps from the run that asked for it on (those before it ran)
            k = body["error"]["step"]
            done += _kept(body.get("results") or [], origins)
            steps, origins = [self._templates[lost], *steps[k:]], [_RESENT, *origins[k:]]
            program_id = f"{self._program_prefix}-{next(self._programs)}"
        if status >= 400:
            self._fail(status, body, origins)
        # the results, one per step queued (a template sent again answered one of its own: left out)
        results = done + _kept(body["results"], origins) if origins is not sent_origins else body["results"]
        origins = sent_origins
        for origin, result in zip(origins, results):
            if origin is not None and origin.on_result is not None:
                origin.on_result(result)
        if body.get("pending"):
            self._ahead = sent
        return results

    def _fail(self, status: int, body: Any, origins: list[Origin | None]) -> None:
        err = (body or {}).get("error") or {}
        k = err.get("step")
        k = 0 if k is None else min(k, len(origins))
        origin = origins[k] if k < len(origins) else None
        error = error_from(status, body, where=origin.where if origin else None, session=self.id)
        if origin is not None and not error.op:
            error.op = origin.op
        if isinstance(err.get("forward"), dict):  # a backward under anomaly detection: the call that made the node
            self._globals.name_forward(error, err["forward"])
        self._fail_all(error, origins, k)

    def _fail_ahead(self, status: int, body: Any, origins: list[Origin | None]) -> None:
        """The last program's step that ran after its answer failed: raised as that step's error, at its line,
        with the steps after it failed, and this program's too (none of them ran)."""
        ahead, self._ahead = self._ahead[1], None
        try:
            self._fail(status, body, ahead)
        except RemoteError as error:
            self._fail_all(error, origins, 0)

    def _fail_all(self, error: RemoteError, origins: list[Origin | None], k: int) -> None:
        """Raise ``error``, the steps from ``k`` on marked failed: their outputs raise it where used."""
        for o in origins[k:]:
            if o is None:
                continue
            if o.undo is not None:
                o.undo()
            for ref in o.outputs:
                t = ref()
                if t is not None:
                    t._error = error
        raise error

    def take_result(self, index: int) -> Any:
        """The result of the step queued at ``index`` (flushing if it is still queued)."""
        if self.pipeline:
            return self.flush()[index]
        return self._pending_results[index]

    def _free_later(self, tid: str) -> None:
        if not self._closed:
            self._frees.append(tid)

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteError(f"session {self.id} is closed", code="session_closed")

    # -- fetching ---------------------------------------------------------------------------

    def fetch(self, tid: str, *, value: bool = True, grad: bool = False) -> dict:
        if not torch.is_grad_enabled():  # inside a Function's forward, a value read may become a local output
            refuse_custom_function(None)
        index = self.enqueue(make_step(FetchStep, id=tid, value=value, grad=grad), _FETCH)
        # self.take_result(index), inline: every read of a value
        return (self.flush()[index] if self.pipeline else self._pending_results[index])["tensor"]


_RESENT = Origin("template", None)  # a template sent again after a restart: its result is no step's of the queue
_FETCH = Origin("fetch", None)  # every fetch step's (one Origin for all: nothing of it is per step)


def _earlier(body: Any) -> str | None:
    """The earlier program an error answer says its failing step belongs to (SPEC §3, running ahead)."""
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("program") if isinstance(error, dict) else None


def _kept(results: list, origins: list) -> list:
    return [r for r, o in zip(results, origins) if o is not _RESENT]


# == the one builder of an op's step: call_op =====================================================

_DROPPED_KWARGS = frozenset({"device", "memory_format", "layout", "pin_memory", "non_blocking"})
_SETITEM = torch.Tensor.__setitem__
_COPY = torch.Tensor.copy_
_INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)
_ANY_AUTOCAST = torch._C._is_any_autocast_enabled  # no autocast anywhere (most ops): no call into _autocast
_DEFAULT_DTYPE = torch.get_default_dtype
_SAVED_TENSORS_HOOKS = torch._C._autograd._top_saved_tensors_default_hooks  # (pack, unpack) or None
_ANOMALY = torch.is_anomaly_enabled


def _foreign(session: SessionCore, v: RemoteTensor) -> RuntimeError:
    """A handle of another session among an op's arguments: torch's device error, unless a Function's
    backward is being recorded (``capture/_user_functions``), which names what it was not given."""
    foreign = getattr(session, "foreign", None)
    return foreign(v) if foreign is not None else mixed_devices(session.device, v.device)


class Encoder:
    """Wire values for one step's arguments; collects the RemoteTensors it saw."""

    def __init__(self, session: SessionCore, inputs: list | None = None) -> None:
        self.session = session
        self.inputs: list = [] if inputs is None else inputs
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
        idx = normalise_index(idx)
        if isinstance(idx, tuple):
            return [self.value(i, any_device=True) for i in idx]
        return self.value(idx, any_device=True)


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
    origin_where = op_where()
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
            check_same_device(session.device, route.torch_name, kwargs["device"])
        kwargs = {k: v for k, v in kwargs.items() if k not in _DROPPED_KWARGS and k != "inplace"}
    elif kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k not in _DROPPED_KWARGS}
    if func is _COPY and not isinstance(args[0], RemoteTensor):  # local.copy_(remote): a download into it
        return args[0].copy_(args[1].cpu())  # load_state_dict(remote state) into a local model
    wire_args_src = (args[1], args[0], *args[2:]) if route.reflected else args
    inputs: list = []  # the RemoteTensors among the arguments, in order (Encoder.inputs)
    enc = None  # made for the first argument that is not a plain handle of this session
    if func in _INDEXING:
        enc = Encoder(session, inputs)
        basic = basic_index(wire_args_src[1])
        wire_args = [enc.value(wire_args_src[0]), enc.index(wire_args_src[1]),
                     *(enc.value(a, any_device=basic) for a in wire_args_src[2:])]
    else:
        cpu_at = route.op.cpu_args
        wire_args = []
        for a in wire_args_src:  # a loop, not a comprehension: no frame of its own per op
            if type(a) is RemoteTensor and a._session is session and a._error is None and a._grad_owner is None:
                inputs.append(a)  # Encoder.value's first case, inline: most arguments of most ops
                wire_args.append({"ref": a._id})
                continue
            if enc is None:
                enc = Encoder(session, inputs)
            wire_args.append(enc.value(a, any_device=len(wire_args) in cpu_at))
    if kwargs:
        if enc is None:
            enc = Encoder(session, inputs)
        wire_kwargs = {k: enc.value(v) for k, v in kwargs.items()}
    else:
        wire_kwargs = OMIT
    nbytes = 0 if enc is None else enc.nbytes
    # set_data: never recorded
    grad_enabled = False if not grad_on or (route.by_name and inplace and not route.op.differentiable) else OMIT
    factory = FACTORIES.get(route.wire_name) if route.by_name else None
    # factories and session ops (n_out=0) make no floating result of other tensors: autocast has no say
    casts = _ANY_AUTOCAST() and autocast_applies(inplace) and factory is None and n_out != 0
    autocast = _autocast.server_dtype() if casts else None
    # the step, but its outputs (given as each kind of call queues it): built once, by the one builder
    call = partial(make_step, CallStep, op=route.wire_name, args=wire_args, kwargs=wire_kwargs,
                   grad_enabled=grad_enabled, autocast=OMIT if autocast is None else dtype_name(autocast))
    skip = route.op.no_grad_args
    grad_inputs = inputs if not skip else _grad_inputs(wire_args_src, kwargs, skip)
    rg = False
    leaves: frozenset = frozenset()  # the leaves the outputs' history reaches: those of the inputs that require grad
    if grad_on and route.op.differentiable:
        for t in grad_inputs:  # a loop, not any(genexpr): no generator frame per op
            if t._rg:
                rg = True
                if t._leaves:
                    leaves = t._leaves if not leaves else leaves | t._leaves
    if rg and _SAVED_TENSORS_HOOKS(False) is not None:  # a graph is recorded on the server: its hooks are not ours
        refuse_saved_tensors_hooks(_SAVED_TENSORS_HOOKS(False), route.torch_name, origin_where)

    if n_out == 0:  # a session op: nothing made, nothing written
        session.enqueue(call(out=[]), Origin(route.wire_name, origin_where), nbytes)
        return None
    if inplace:
        target = wire_args_src[0]
        if isinstance(target, (list, tuple)):  # torch._foreach_X_(tensors, ...) writes every tensor
            return _queue_foreach_inplace(session, call, origin_where, route, target, grad_on, inputs, nbytes)
        if not isinstance(target, RemoteTensor):  # a 0-d local target (any other failed the device rule)
            raise TypeError(f"{route.torch_name}: in-place op on a local tensor with RemoteTensor arguments")
        op_name = route.wire_name if route.inplace else route.wire_name + "_"  # F.relu(x, inplace=True)
        _queue_inplace(session, call(op=op_name, out=[]), origin_where, target, rg, leaves, nbytes,
                       wire_args_src[1:], kwargs, route.op.relayout)
        if route.by_name and route.wire_name == "set_data":  # the one in-place op that may change shape and dtype
            target._adopt_metadata(args[1])
        return None if func is _SETITEM else target

    if factory is not None:
        metas, container, views = INFERENCE["outputs"]("meta", factory, args, {**kwargs, "device": "meta"},
                                                        default_dtype)
    else:
        rule = route.op.shape_rule
        if route.by_name and rule != "elementwise":
            rule = "none"  # no torch callable to run on meta: the server says
        if func in _INDEXING:
            if value_dependent_index(args[1]):
                rule = "none"
            args = (args[0], normalise_index(args[1]), *args[2:])  # infer with the index as it is sent
        metas, container, views = INFERENCE["outputs"](rule, func, args, kwargs, default_dtype)
        if autocast is not None and not _views.is_view_call(views):
            metas = None  # the server's autocast rules decide the dtypes (a view keeps its input's)
    if metas is None:
        result = _apply_waiting(session, call, route.wire_name, origin_where, rg, leaves, nbytes)
        if func is _INDEXING[0]:
            _views.index_view(_as_list(result), args[0], args[1])
        else:
            _views.settle(_as_list(result), inputs, [], route.op.maybe_view, route.op.differentiable)
        return result
    # The outputs: ids and local handles (a third item of a meta, False: torch leaves that output without a
    # graph); then the step is queued. One loop, not three comprehensions: no frame per comprehension per op.
    new_leaves = bool(kwargs.get("requires_grad"))  # zeros_like(x, requires_grad=True) makes leaves
    ids, outs, refs = [], [], []
    for meta in metas:
        shape, dtype = meta[0], meta[1]
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
    session.enqueue(call(out=ids), Origin(route.wire_name, origin_where, refs), nbytes)
    # _views.settle, only where there is something to settle: an input that is not contiguous or may be
    # a view, an op that may return its input, an output meta saw as a view or not contiguous
    settle = route.op.maybe_view
    for t in inputs:  # loops, not any(genexpr): no generator frame per op
        if t._strides is not None:
            settle = True
            break
    if not settle:
        for src, layout, _ in views:
            if src is not None or layout is not None:
                settle = True
                break
    if settle:
        _views.settle(outs, inputs, views, route.op.maybe_view, route.op.differentiable)
    return outs[0] if container is None else container(outs)


def _route_of(session: SessionCore, func: Callable) -> Route:
    route = session._routes.lookup(func)
    if route is None:
        raise not_in_table(func)
    return route


def _as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _queue_inplace(session: SessionCore, step: dict, origin_where: str | None, target, rg: bool, leaves: frozenset,
                   nbytes: int, op_args: tuple = (), op_kwargs: dict | None = None, relayout: bool = False) -> None:
    """Queue an in-place step (no new ids) and update the local history of the target and of
    every tensor sharing its memory; a shape-changing op (``t_``) gives the target its new layout."""
    op = step["op"]
    if rg and target._storage is not None:  # only memory shared with another handle can be uncertain
        _views.check_inplace(target, op, rg, leaves)
    # the wire names torch's spelling (``Tensor.t_``): the op is known by its last part
    layout = _views.reshape_inplace_meta(op, target, tuple(op_args), op_kwargs or {}) if relayout else None
    session.enqueue(step, Origin(op, origin_where), nbytes)
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


def _queue_foreach_inplace(session: SessionCore, call: Callable, origin_where: str | None, route: Route, targets,
                           grad_on: bool, inputs: list, nbytes: int) -> None:
    """Queue an in-place step on a list of tensors; torch's optimizers run these under no_grad, and
    with grad on and inputs that require grad we refuse rather than drop the history."""
    if not all(isinstance(t, RemoteTensor) for t in targets):
        raise TypeError(f"{route.torch_name}: in-place op on local tensors with RemoteTensor arguments")
    if grad_on and any(t._rg for t in inputs):
        raise RuntimeError(f"{route.torch_name} on RemoteTensors that require grad is not supported with grad "
                           "enabled; call it under torch.no_grad() (as torch's optimizers do)")
    session.enqueue(call(out=[]), Origin(route.wire_name, origin_where), nbytes)
    # Which arguments an op of this kind writes is not declared (GradScaler's found_inf is written
    # too), so every tensor argument's version is bumped: read-only ones then read one more than torch's.
    for t in inputs:
        t._after_inplace(False, frozenset())


def _apply_waiting(session: SessionCore, call: Callable, op: str, origin_where: str | None, rg: bool,
                   leaves: frozenset, nbytes: int) -> Any:
    """An op whose output metadata only the server knows (``call(out=[prefix], out_many=True)``): send now and
    read it from the result."""
    index = session.enqueue(call(out=[session.new_id()], out_many=True), Origin(op, origin_where), nbytes)
    result = session.take_result(index)
    outs = [RemoteTensor._new(session, tid, shape, dtype, requires_grad=req, leaves=leaves if req else frozenset(),
                              is_leaf=not req)
            for (tid, shape, dtype, req) in meta_from_result(result)]
    return tuple(outs) if result.get("tuple") else outs[0]


def _grad_inputs(args: tuple, kwargs: dict, skip: frozenset) -> list:
    """The RemoteTensors among the arguments that can receive a gradient (``skip``: positions and names)."""
    return tensors_of(([a for i, a in enumerate(args) if i not in skip],
                       [v for k, v in kwargs.items() if k not in skip]), [])

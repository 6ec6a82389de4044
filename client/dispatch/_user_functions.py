"""A user's ``torch.autograd.Function`` applied to remote tensors where torch records it: its backward
recorded into a template as ``apply`` returns, and the call made a node of the server's autograd.

``session/_callsite`` sees ``apply`` return with the caller's grad mode (``_frame_return``) and, where torch
recorded the call on remote outputs, calls ``attach``. Its forward has run already, as ordinary steps
with grad off (as torch runs it). What torch recorded on the client is the ``ctx`` the forward saw:
the C++ node of a tensor output (its saved tensors, ``needs_input_grad``, the user's attributes).

``attach`` runs ``backward`` (or ``vjp``) once, now, on handles of a ``Recorder`` (``session/_recorder``,
the capture's): one per output's grad (``g0``...), one per tensor it saved or put on ``ctx`` (``s0``...). A stand-in
``ctx`` answers those with the handles and everything else from the real one. Its steps become a
template named by a hash of its content, so the same Function on the same layouts defines it once
per session. While it records, the real session refuses every step: a backward that reads a remote
tensor it neither saved nor put on ``ctx`` fails loudly, never sending a step. A backward that reads
values on the client (``.item()``, a bool of a tensor) cannot be a template (``ReadsValues``): it runs on
the client instead, staged, at each backward that reaches it (``_client_run``). It records with grad on
(torch runs a backward under ``create_graph`` so), so double backward works where torch's does;
``once_differentiable`` turns it off itself.

Then one ``function`` step (``service/engine/user_functions.py``) makes the forward's outputs the
outputs of a server node whose backward runs that template, and the outputs' handles become
non-leaves that depend on the inputs' leaves, as torch's would. torch's reentrant checkpoint is such a
Function, with what its backward reads besides its ctx (``_checkpoint``); tensor hooks are recorded
the same way (``handlers/_hooks``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import weakref
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame

from remote_autograd.proto import dtype_name
from remote_autograd.proto.messages import TemplateStep

from .._core import RemoteTensor
from ..device._device import recording_into
from ..session import _callsite, _steps
from ..session._recorder import Recorder, Untranslatable
from ..session._steps import Origin, make_step
from ..tensor import _views
from ..tensor._autograd_flags import set_requires_grad_flag
from . import _checkpoint, _client_run
from ._closure_saved import bound, closure_saved
from ._function_step import function_step

_GRAD_FN = torch.Tensor.grad_fn.__get__


def _set_materialize_grads(self, value: bool) -> None:
    """torch's ``ctx.set_materialize_grads``, which also notes the value where Python can read it back (the
    node's own flag has a setter only): ``attach`` records a backward for each pattern of grads when it is
    off. Installed as the SDK's modules load, it changes nothing else of torch's."""
    _SET_MATERIALIZE_GRADS(self, value)
    self._remote_autograd_materialize_grads = bool(value)


_SET_MATERIALIZE_GRADS = torch.autograd.function.FunctionCtx.set_materialize_grads
torch.autograd.function.FunctionCtx.set_materialize_grads = _set_materialize_grads
_ONCE_DIFFERENTIABLE = torch.autograd.function.once_differentiable(lambda ctx: None).__code__  # its wrapper's
# torch's Function for module backward hooks: its node is named to the server, and its outputs carry under
# HOOK_NODE (in their __dict__) that id and the layouts of its inputs' and outputs' grads
_BACKWARD_HOOK = torch.nn.modules._functions.BackwardHookFunction
HOOK_NODE = "_remote_hook_node"


class BackwardRecorder(Recorder):
    """A ``Recorder`` for one Function's backward: a read of values, or of a remote tensor the backward
    was not given, is named as such."""

    # the session's hooks are registered on the server for the backward or grad step that runs this one's
    # template: a backward inside it (a checkpoint's) meets them there, as torch's would
    _hooked: dict = {}
    _node_hooks: dict = {}

    def __init__(self, session: Any, name: str, unsaved: str | None = None) -> None:
        super().__init__(session)
        self.function, self.unsaved = name, unsaved

    def template(self, inputs: list, outputs: list) -> dict:
        """The recording as a template step, named by a hash of its content (the same recording on the same
        layouts: the same template, sent once per session); ``outputs``: handles or names."""
        body = {"inputs": [{"id": h._id, "dtype": dtype_name(h._dtype), "shape": list(h._shape),
                            "requires_grad": h._rg} for h in inputs],
                "steps": self.steps, "outputs": [o if isinstance(o, str) else o._id for o in outputs]}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:32]
        return make_step(TemplateStep, id=f"fn-{digest}", **body)

    def flush(self) -> list:
        raise Untranslatable("it reads a remote tensor's values on the client (.item(), .tolist(), .cpu(), "
                             "numpy, a bool of a tensor), which the server's backward cannot do")

    def foreign(self, handle: RemoteTensor) -> RuntimeError:
        return _unsaved(self.function, self.unsaved)


class ReadsValues(RuntimeError):
    """A Function's backward cannot be recorded: it reads values on the client, or needs a step a template
    cannot hold (an upload, an answer of the server). ``attach`` runs such a backward on the client
    (``_client_run``) where it can."""


def _unsaved(name: str, message: str | None = None) -> RuntimeError:
    return RuntimeError(message or f"{name}.backward reads a remote tensor it was not given: save it with "
                        "ctx.save_for_backward (or put it on ctx) in the forward")


class _Ctx:
    """The ``ctx`` the recorded backward sees: its saved tensors and tensor attributes are the recording's
    handles; anything else is the real node's (``needs_input_grad``, the user's other attributes)."""

    def __init__(self, ctx: Any, saved: tuple, attributes: dict) -> None:
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_own", dict(attributes))
        object.__setattr__(self, "saved_tensors", saved)

    @property
    def saved_variables(self) -> tuple:
        return self.saved_tensors

    def __getattr__(self, name: str) -> Any:
        own = object.__getattribute__(self, "_own")
        if name in own:
            return own[name]
        return getattr(object.__getattribute__(self, "_ctx"), name)

    def __setattr__(self, name: str, value: Any) -> None:  # a backward's own notes stay on the recording's ctx
        self._own[name] = value


class Prepared:
    """What ``before_forward`` did as a Function's forward began, undone by ``restore`` as ``apply`` returns.

    ``state``: a checkpoint's generator state (``_checkpoint``). ``flipped``: the remote inputs that are
    no leaves for the SDK but are for torch's C++ (their history is on the server): their C++
    ``requires_grad`` is off while the forward runs, so that torch's check of an input marked dirty (a
    leaf that requires grad written in place) sees what the SDK knows; torch read what it needs of
    them (which inputs need a gradient) before the forward began."""

    __slots__ = ("state", "flipped")

    def __init__(self, state: RemoteTensor | None, flipped: list) -> None:
        self.state, self.flipped = state, flipped

    def restore(self) -> None:
        flipped, self.flipped = self.flipped, []
        for t in flipped:
            with DisableTorchFunctionSubclass():
                if _GRAD_FN(t) is None:  # (one marked dirty has the node as its history now)
                    set_requires_grad_flag(t, True)


def before_forward(cls: type, args: tuple) -> Prepared:
    """Run as the forward of ``cls.apply(*args)`` queues its first remote op (``session/_callsite``)."""
    flipped = []
    with DisableTorchFunctionSubclass():
        for a in args:  # (a Function's output has a C++ history: torch's own)
            if isinstance(a, RemoteTensor) and a._rg and not a._is_leaf and _GRAD_FN(a) is None:
                flipped.append(a)
    for t in flipped:
        set_requires_grad_flag(t, False)
    return Prepared(_checkpoint.rng_state_at_forward(cls, args), flipped)


def attach(cls: type, args: tuple, outputs: tuple, line: str | None, prepared: Prepared | None = None) -> None:
    """Make the call of ``cls.apply(*args)`` whose tensor outputs (all remote) are ``outputs`` a node of the
    server's autograd (see the module's docstring); a clear RuntimeError where it cannot be one.
    ``prepared``: what ``before_forward`` did as the forward began (restored already)."""
    state = None if prepared is None else prepared.state
    name = getattr(cls, "__name__", "a torch.autograd.Function")
    at = f" ({line})" if line else ""
    tensors = [o for o in outputs if isinstance(o, torch.Tensor)]
    with DisableTorchFunctionSubclass():
        nodes = [_GRAD_FN(o) for o in tensors]
    ctx = next((n for n in nodes if n is not None), None)
    if ctx is None:  # every output marked non-differentiable: nothing flows back
        return
    session = tensors[0]._session
    inputs = [a for a in args if isinstance(a, RemoteTensor)]
    for a in (*inputs, *tensors):
        if a._session is not session:
            raise RuntimeError(f"{name}.apply on tensors of two sessions{at}")
    saved, bindings = _saved(ctx, session, tensors, name)
    n_saved = len(saved)
    attributes = {}
    for key, value in list(vars(ctx).items()):
        if isinstance(value, RemoteTensor):
            attributes[key] = len(saved)
            saved.append(value)
            bindings.append(_binding(value, tensors))
    backward = cls.vjp if cls.vjp is not torch.autograd.Function.vjp else cls.backward  # as torch chooses
    closure = closure_saved(backward)  # torch.compile's form of a Function keeps them there
    if closure is not None:
        index = {}
        for k, value in enumerate(closure[1]):
            if isinstance(value, RemoteTensor):
                index[k] = len(saved)
                saved.append(value)
                bindings.append(_binding(value, tensors))
        closure = (*closure, index)
    extras = _checkpoint.Extras(ctx, session) if _checkpoint.is_checkpoint(cls) else None
    if state is not None:  # the generator's state at the forward: saved, for the recomputation
        saved.append(state)
        bindings.append(state._id)
    live = [] if extras is None else extras.live
    recorded = functools.partial(_record_backward, backward, ctx, session, name, args, outputs, saved, n_saved,
                                 attributes, closure, extras, state, live, at)
    try:
        recorder, grads, handles, live_handles, grad_of = recorded(None)
    except ReadsValues:  # its backward runs on the client, staged, unless it must run inside the server's
        if extras is not None or cls is _BACKWARD_HOOK or any(o is a for o in tensors for a in inputs):
            raise  # (a checkpoint's backward runs a backward; a module hook's node; an input marked dirty)
        by_id = {o._id: o for o in tensors}  # a saved output as torch saves one, without its history: detached
        own = tuple(o.detach() if (o := by_id.get(b)) is not None else s  # (so no cycle through the record)
                    for s, b in zip(saved[:n_saved], bindings[:n_saved]))
        _client_run.make(cls, backward, _Ctx(ctx, own, {}), args, outputs, tensors, nodes, session, line)
        return
    template, index = _backward_of(session, recorder, grads, handles, live_handles, grad_of)
    materialize = getattr(ctx, "_remote_autograd_materialize_grads", True) is not False  # set_materialize_grads
    variants = None if materialize else _variants(session, recorded, outputs, tensors)
    node = session.new_id() if cls is _BACKWARD_HOOK else None
    step = function_step(name, inputs, tensors, nodes, index, saved=bindings, backward=template, live=live,
                         once=getattr(backward, "__code__", None) is _ONCE_DIFFERENTIABLE, reentrant=extras is not None,
                         materialize_grads=materialize, variants=variants, node=node)
    session.enqueue(step, Origin("function", _steps.where(), [weakref.ref(o) for o in tensors]))
    _mark_outputs([*inputs, *live], tensors, nodes)
    if node is not None:  # its grad_fn takes torch's module hooks (handlers/_node_hooks): the node, and its grads
        layouts = ([(a._shape, a._dtype) for a in inputs], [(o._shape, o._dtype) for o in tensors])
        for o in tensors:
            o.__dict__[HOOK_NODE] = (node, *layouts)
            if o._rg:  # the node among the "leaves" its gradient flows to: a backward from a tensor reaches it
                o._leaves = o._leaves | {node}


def _record_backward(backward, ctx: Any, session: Any, name: str, args: tuple, outputs: tuple, saved: list,
                     n_saved: int, attributes: dict, closure: tuple | None, extras: Any, state: Any, live: list,
                     at: str, present: tuple | None) -> tuple:
    """``backward`` run once on a recording's handles: the recorder, the handles of the grads (None for
    an output that is no tensor, or not in ``present``: torch's None where no grad flows, under
    ``set_materialize_grads(False)``), of the saved and the live tensors, and the grads of the inputs."""
    recorder = BackwardRecorder(session, name, None if extras is None else _checkpoint.UNSAVED)
    tensor_k = itertools.count()
    grads = [None if not isinstance(o, torch.Tensor) or (present is not None and not present[next(tensor_k)])
             else stand_in(recorder, f"g{k}", o, False, contiguous=True) for k, o in enumerate(outputs)]
    handles = [None if s is None else s if not isinstance(s, RemoteTensor) else stand_in(recorder, f"s{k}", s, s._rg)
               for k, s in enumerate(saved)]
    live_handles = [stand_in(recorder, f"l{k}", t, t._rg) for k, t in enumerate(live)]
    proxy = _Ctx(ctx, tuple(handles[:n_saved]), {key: handles[k] for key, k in attributes.items()})
    try:
        with bound(closure, handles):
            returned = record(session, recorder, name, lambda: _own_tensors(backward(proxy, *grads)),
                              None if extras is None else extras.recording(
                                  recorder, live_handles, None if state is None else handles[-1]))
    except Untranslatable as why:
        raise ReadsValues(f"{name}.backward cannot run inside the server's backward: {why}{at}") from None
    except RuntimeError as err:
        raise RuntimeError(f"{err}{at}") from None
    except Exception as err:  # the user's backward raised: torch would raise it at backward, we record it now
        raise RuntimeError(f"{name}.backward raised {type(err).__name__} as the SDK recorded it (at apply, to run "
                           f"it inside the server's backward): {err}{at}") from err
    returned = returned if isinstance(returned, tuple) else (returned,)
    grad_of = _grads_of_inputs(name, args, returned, recorder, grads, handles, at)
    return recorder, grads, handles, live_handles, grad_of


MAX_UNMATERIALIZED_OUTPUTS = 3  # set_materialize_grads(False): every pattern of grads recorded up to 2**3


def _variants(session: Any, recorded: Any, outputs: tuple, tensors: list) -> list:
    """Under ``ctx.set_materialize_grads(False)`` torch passes None for each output no gradient reaches,
    which only the backward's walk knows: the backward recorded for every other pattern of grads (the
    server picks the one its engine meets; a pattern not recorded, or whose recording raised, fails loudly
    there)."""
    if len(tensors) > MAX_UNMATERIALIZED_OUTPUTS:
        return []
    variants = []
    for present in itertools.product((True, False), repeat=len(tensors)):
        if all(present):
            continue
        try:
            recorder, grads, handles, live_handles, grad_of = recorded(present)
        except RuntimeError:  # it cannot take None there (torch would raise at that backward): the server says so
            continue
        backward, index = _backward_of(session, recorder, grads, handles, live_handles, grad_of)
        variants.append({"present": list(present), "backward": backward, "grads": index})
    return variants


def _own_tensors(returned: Any) -> Any:
    """What a backward returned, with a handle of a ``.grad`` (a checkpoint returns its inputs' ``.grad``)
    made a tensor of the template (``detach``: the same values, no copy)."""
    def own(r: Any) -> Any:
        return r.detach() if isinstance(r, RemoteTensor) and r._grad_owner is not None else r

    return tuple(own(r) for r in returned) if isinstance(returned, tuple) else own(returned)


def _saved(ctx: Any, session: Any, outputs: list, name: str) -> tuple[list, list]:
    """The tensors ``ctx`` saved, and what each binds on the server: its id, or an output's (torch hands
    a saved output back as a new tensor each time: told by asking twice)."""
    first = ctx.saved_tensors
    saved, bindings = list(first), []
    again = None
    for k, s in enumerate(first):
        if not isinstance(s, RemoteTensor):
            if isinstance(s, torch.Tensor) and s.requires_grad:
                raise RuntimeError(f"{name}: a saved local tensor that requires grad beside remote ones")
            bindings.append(None)
            continue
        if s._session is not session:
            raise RuntimeError(f"{name}.apply saved a tensor of another session")
        output = _same_layout_output(s, outputs)
        if output is not None:
            again = again if again is not None else ctx.saved_tensors
            if again[k] is not s:  # unpacked anew: torch saved an output
                bindings.append(output._id)
                continue
        bindings.append(_binding(s, outputs))
    return saved, bindings


def _same_layout_output(s: RemoteTensor, outputs: list) -> RemoteTensor | None:
    for o in outputs:
        if (o is not s and s._storage is not None and s._storage is o._storage and s._shape == o._shape
                and _views.strides(s) == _views.strides(o) and s._byte_offset == o._byte_offset):
            return o
    return None


def _binding(t: RemoteTensor, outputs: list) -> str:
    t._check_usable()
    if t._grad_owner is not None:
        raise RuntimeError("a Function's ctx holds a remote tensor's .grad: save a clone of it instead")
    return t._id


def stand_in(recorder: Recorder, name: str, like: RemoteTensor, requires_grad: bool, contiguous: bool = False
            ) -> RemoteTensor:
    h = RemoteTensor._new(recorder, name, like._shape, like._dtype, requires_grad=requires_grad,
                          is_leaf=True, leaves=frozenset({name}) if requires_grad else frozenset())
    strides = _views.strides(like)
    if not contiguous and strides != _views.contiguous_strides(like._shape):
        h._strides = strides
    return h


def record(session: Any, recorder: BackwardRecorder, name: str, backward, around: Any = None) -> Any:
    """``backward()`` on the recording's handles, grad on, with the real session refusing every step
    (and inside the context ``around``: a checkpoint's)."""
    def refuse(*args, **kwargs):
        raise _unsaved(name, recorder.unsaved)

    # shadowed on the instance (the class's come back below): a step, or an op mixing its handles with the
    # recording's, names the tensor the backward was not given
    session.enqueue, session.flush, session.foreign = refuse, refuse, recorder.foreign
    compiling = _set_eval_frame(None)  # inside torch.compile's call, dynamo would compile the user's code here
    try:
        with _callsite.recording(), recording_into(session.device, recorder), torch.enable_grad(), \
                around if around is not None else contextlib.nullcontext():
            return backward()
    finally:
        _set_eval_frame(compiling)
        del session.enqueue, session.flush, session.foreign


def _grads_of_inputs(name: str, args: tuple, returned: tuple, recorder: BackwardRecorder, grads: list, handles: list,
                     at: str) -> list:
    """For each remote input, the recording's handle that is its grad (or None), checked as torch checks
    what a backward returns."""
    if len(returned) < len(args) or any(r is not None for r in returned[len(args):]):
        raise RuntimeError(f"function {name}Backward returned an incorrect number of gradients (expected "
                           f"{len(args)}, got {len(returned)}){at}")
    found = []
    for i, (a, r) in enumerate(zip(args, returned)):
        if not isinstance(a, torch.Tensor):
            if r is not None:
                raise RuntimeError(f"function {name}Backward returned a gradient different than None at position "
                                   f"{i + 1}, but the corresponding forward input was not a Variable{at}")
            continue
        if not isinstance(a, RemoteTensor):
            continue  # a local input needing no grad (one that needs it is refused before): torch drops its grad
        if r is not None and not (isinstance(r, RemoteTensor) and r._session is recorder):
            if isinstance(r, RemoteTensor):
                raise RuntimeError(f"{_unsaved(name, recorder.unsaved)}{at}")
            raise RuntimeError(f"{name}.backward returned a {type(r).__name__} as the gradient of a remote input{at}")
        found.append(r)
    return found


def _backward_of(session: Any, recorder: Recorder, grads: list, handles: list, live_handles: list, grad_of: list
                 ) -> tuple[str | None, list]:
    """A recording as a ``function`` step names it: its template (sent once per session; None when it
    computes nothing) and, per input, the index of its grad among the bound tensors then the template's
    outputs."""
    bound = [g for g in grads if g is not None] + [h for h in handles if isinstance(h, RemoteTensor)] + live_handles
    bound_names = [h._id for h in bound]
    outs: list[str] = []
    index = []
    for r in grad_of:
        if r is None:
            index.append(None)
        elif r._id in bound_names:
            index.append(bound_names.index(r._id))
        else:
            if r._id not in outs:
                outs.append(r._id)
            index.append(len(bound) + outs.index(r._id))
    if not recorder.steps:
        return None, index
    template = recorder.template(bound, outs)
    session.ensure_template(template["id"], template)
    return template["id"], index


def _mark_outputs(inputs: list, outputs: list, nodes: list) -> None:
    """The outputs' handles as torch's: non-leaves requiring grad, on the leaves of the inputs that need it."""
    leaves = frozenset().union(*(a._leaves for a in inputs if a._rg))
    for o, node in zip(outputs, nodes):
        if node is None:
            continue
        o._rg, o._is_leaf, o._leaves = True, False, leaves  # (torch set its C++ requires_grad, with the node)


# registered into the user's-line watch (session/_callsite), which calls them for a Function on remote tensors
_callsite.ATTACH.append(attach)  # its backward recorded on the server
_callsite.BEFORE_FORWARD.append(before_forward)  # undone as apply returns

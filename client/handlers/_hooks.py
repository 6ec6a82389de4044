"""``Tensor.register_hook`` on a RemoteTensor: the hook is kept on the handle and runs inside the
server's backward.

A hook reads Python values that change (a clipping bound, a scale, a step counter): recorded once
and replayed, it would go stale without a word. So each ``backward()`` and ``torch.autograd.grad``
call records the hooks of every hooked tensor of the session anew (``hook_steps``), each tensor's
hooks in order on a stand-in of its gradient (``dispatch/_user_functions``' recording: a ``Recorder``,
the real session refusing every step), into a template named by its content, and names them in the
step (``hooks``); the server registers them for that step alone (``service/engine/tensor_hooks.py``).
A hook therefore runs once on the client at each call, whether or not that backward reaches its
tensor: Python side effects happen then; a hook that reads a remote tensor it is not given (its
gradient is all it gets) raises at that call.

A hook that reads the gradient's values (a NaN check, a norm logged, a print) cannot be a template.
Its tensor's hooks are *observed* from then on: the step names an ``observe`` id, the server keeps
the gradient the hooks would have been given under it, and once the step has answered (the
``backward()`` call waits for it) each observed tensor's hooks run here on it, in the order torch
called them there (``run_observed``). Such hooks may only look: one that returns another gradient
raises.
Python a hook ran before its first read of a value ran once more as its recording was tried.

torch keeps a non-leaf's hooks with its graph, not with the Python tensor: ``h.register_hook(f)`` then
``h = h * 2`` still runs ``f`` in the backward. So a hooked non-leaf's handle is kept (``_hook_kept``, and
its server tensor with it) until a backward or grad step that does not retain the graph has run its
hooks (the step's answer names them, ``hooked``: after that torch could not run them again through that
graph), or past ``MAX_KEPT`` of them, the oldest let go with a warning.

``Tensor.register_post_accumulate_grad_hook`` on a remote leaf: its hooks take the parameter itself
(an optimizer step per parameter looks its optimizer up by it), which no template stand-in can be, so
they run here after the backward step, on the leaf whose ``.grad`` the step accumulated, in the order
torch would have called them: the step names a ``post_accumulate`` observe id per hooked leaf, the server
answers it among the ``observed`` as the leaf's gradient is ready (when torch's accumulation would run:
only in a ``backward``, only for a leaf it fills). So the hook sees the ``.grad`` it would have seen in
torch, except that the whole backward has run: the step also answers the order it filled every leaf in
(``accumulated``), and while a leaf's hooks run the ``.grad`` of the leaves filled after it is refused
(``NOT_ACCUMULATED``: torch's hook would have seen their old one).
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from functools import partial
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from .._core import RemoteTensor
from ..dispatch._user_functions import BackwardRecorder, record, stand_in
from ..session._steps import where
from ..session._recorder import Recorder, Untranslatable
from ._handler_table import HandlerTable

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on
_HOOKS = "_remote_hooks"  # a handle's own hooks (in its __dict__: only hooked handles carry them), by handle id
_POST_HOOKS = "_remote_post_hooks"  # its post-accumulate grad hooks, likewise
NOT_ACCUMULATED = "_remote_not_accumulated"  # while a post-accumulate hook runs: a leaf torch accumulates later
_OBSERVED = "_remote_hooks_observed"  # set in a handle's __dict__ once its hooks read values: observed from then on


class _ReadsValues(Exception):
    """A tensor's hooks read its gradient's values: they cannot be recorded, only observed."""


@_answers(T.register_hook)
def _register_hook(t: RemoteTensor, hook) -> RemovableHandle:
    return _register(t, _HOOKS, hook, "Tensor.register_hook")


@_answers(T.register_post_accumulate_grad_hook)
def _register_post_accumulate_grad_hook(t: RemoteTensor, hook) -> RemovableHandle:
    if t._rg and not t._is_leaf:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    return _register(t, _POST_HOOKS, hook, "Tensor.register_post_accumulate_grad_hook")


def _register(t: RemoteTensor, key: str, hook, name: str) -> RemovableHandle:
    """``hook`` kept on the handle in its ``__dict__[key]`` (torch's RemovableHandle removes it there)."""
    if not t._rg:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if isinstance(t._session, Recorder):  # a stand-in of a recording: nothing would ever run the hook
        raise RuntimeError(f"{name} inside a recorded backward or compiled graph, on a remote tensor: "
                           f"not supported ({where()})")
    hooks = t.__dict__.get(key)
    session = t._session
    if hooks is None:
        hooks = t.__dict__[key] = OrderedDict()
        session._hooked[id(t)] = t
    if not t._is_leaf:
        _keep(session, t)
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


MAX_KEPT = 1024  # hooked non-leaves kept past their last Python reference, per session


def _keep(session: Any, t: RemoteTensor) -> None:
    kept = session._hook_kept
    kept[t._id] = t
    if len(kept) > MAX_KEPT:
        oldest = next(iter(kept))
        del kept[oldest]
        warnings.warn(f"remote-autograd keeps the hooks of at most {MAX_KEPT} tensors no backward has reached; the "
                      f"oldest ({oldest}) is let go: if nothing refers to it, a later backward through it will not "
                      "run its hooks", RuntimeWarning, stacklevel=4)


def let_go(session: Any, result: dict | None, retained: bool) -> None:
    """After a backward or grad step answered ``result``: the hooked non-leaves whose hooks it ran are no
    longer kept for them, unless it retained the graph (another backward may run them again)."""
    if retained:
        return
    kept = session._hook_kept
    for tid in (result or {}).get("hooked") or ():
        kept.pop(tid, None)


def hook_steps(session: Any, accumulates: bool) -> tuple[list[dict], dict]:
    """The ``hooks`` of a backward or grad step about to be queued: each hooked tensor's hooks recorded now
    (their templates queued first), or observed; then, for a step that ``accumulates`` into ``.grad`` (a
    backward), the leaves' post-accumulate hooks; and the observed ones: by ``observe`` id, what runs them
    (``run_observed``)."""
    found, observed = [], {}
    hooked = [t for t in list(session._hooked.values()) if t._id is not None]
    for t in hooked:
        hooks = t.__dict__.get(_HOOKS)
        if not hooks:
            session._hook_kept.pop(t._id, None)  # its hooks removed: nothing to keep it for
            continue
        hooks = list(hooks.values())
        if not t.__dict__.get(_OBSERVED):
            try:
                tid, kept = _record_hooks(session, t, hooks)
            except _ReadsValues:
                t.__dict__[_OBSERVED] = True
            else:
                if kept is not None:  # the gradient kept as the hooks are given it: before they run there
                    oid = session.new_id()
                    found.append({"id": t._id, "observe": oid})
                    observed[oid] = lambda answer, at, ref=kept, oid=oid: rebind(session, ref, oid, answer.present)
                if tid is not None:
                    found.append({"id": t._id, "template": tid})
                elif kept is None:  # hooks that leave the gradient alone: nothing runs there, none to keep it for
                    session._hook_kept.pop(t._id, None)
                continue
        oid = session.new_id()
        found.append({"id": t._id, "observe": oid})
        observed[oid] = partial(_run_tensor_hooks, session, oid, t, hooks)
    for t in hooked if accumulates else ():  # after every tensor hook: torch calls a leaf's hooks first
        hooks = t.__dict__.get(_POST_HOOKS)
        if hooks:
            oid = session.new_id()
            found.append({"id": t._id, "observe": oid, "post_accumulate": True})
            observed[oid] = partial(_run_post_accumulate_hooks, t, list(hooks.values()))
    return found, observed


def any_hooks(session: Any) -> bool:
    """Whether a tensor of the session has tensor or post-accumulate hooks now."""
    return any(t.__dict__.get(_HOOKS) or t.__dict__.get(_POST_HOOKS) for t in list(session._hooked.values()))


class Answer:
    """What an observed hook reads of its step's answer: the ids kept or noted (``present``), and the order
    the backward accumulated its leaves in (``accumulated``: with post-accumulate hooks)."""

    def __init__(self, result: dict) -> None:
        self.order = result.get("observed") or []
        self.present = frozenset(self.order)
        self.accumulated = result.get("accumulated") or []


def run_observed(observed: dict, result: dict) -> None:
    """The observed hooks (``observed``: what runs them, by id), in the order of the step's ``observed``
    (``result``'s: the order torch called the hooks in, with the ids of what it kept; a tensor or node the
    backward did not reach is not there)."""
    at = where()  # the backward's line (inside a hook, where() names the hook's own)
    answer = Answer(result)
    for oid in answer.order:
        run = observed.get(oid)
        if run is not None:  # (not a gradient kept for a node's hooks)
            run(answer, at)


def _run_tensor_hooks(session: Any, oid: str, t: RemoteTensor, hooks: list, answer: Answer, at: str) -> None:
    grad = RemoteTensor._new(session, oid, t._shape, t._dtype)
    for hook in hooks:
        out = hook(grad)
        if out is not None and out is not grad:  # (returning the gradient it was given changes nothing)
            name = getattr(hook, "__qualname__", type(hook).__name__)
            raise RuntimeError(f"the hook {name} on a remote tensor reads the gradient's values and returns a "
                               "new gradient: a hook that changes the gradient runs inside the server's backward, "
                               f"where values cannot be read on the client ({at})")


def _run_post_accumulate_hooks(t: RemoteTensor, hooks: list, answer: Answer, at: str) -> None:
    """``t``'s hooks, with the ``.grad`` of the leaves torch would accumulate after ``t`` unreadable (torch's
    hook would see them as they were before this backward; these run after it)."""
    later = answer.accumulated[answer.accumulated.index(t._id) + 1:] if t._id in answer.accumulated else []
    pending = [leaf for leaf in (t._session._grad_tracked.get(i) for i in later) if leaf is not None]
    for leaf in pending:
        leaf.__dict__[NOT_ACCUMULATED] = t
    try:
        for hook in hooks:
            out = hook(t)
            if out is not None and out is not t:  # torch's rule (the parameter itself passes) and words
                raise RuntimeError(f"Tensor post accumulate grad hooks should return None. ({at})")
    finally:
        for leaf in pending:
            leaf.__dict__.pop(NOT_ACCUMULATED, None)


def _record_hooks(session: Any, t: RemoteTensor, hooks: list) -> tuple[str | None, weakref.ref | None]:
    """The template of ``t``'s hooks recorded on a stand-in of its gradient (None: every hook returned None),
    and that stand-in if a hook kept it (appended it to a list): to be made the gradient itself after the
    step (``rebind``)."""
    name = f"a hook on a remote tensor ({', '.join(getattr(h, '__qualname__', type(h).__name__) for h in hooks)})"
    recorder = BackwardRecorder(session, name, f"{name} reads a remote tensor it is not given (a hook gets its "
                                f"gradient only): compute it from the gradient, or after backward ({where()})")
    grad = stand_in(recorder, "g0", t, False, contiguous=True)

    def run_hooks() -> RemoteTensor:
        current = grad
        for hook in hooks:
            out = hook(current)
            if out is None:
                continue
            if not (isinstance(out, RemoteTensor) and out._session is recorder):
                raise RuntimeError(f"{name} returned a {type(out).__name__} where a gradient of the device goes")
            if out._shape != t._shape:
                raise RuntimeError(f"hook '{getattr(hook, '__name__', hook)}' has changed the size of value")
            current = out
        if current is grad and recorder.steps:  # a hook changed its gradient in place and returned it: the
            current = grad.view_as(grad)         # template's output (which may not be its input) is a view of it
        return current

    try:
        result = record(session, recorder, name, run_hooks)
    except Untranslatable:
        raise _ReadsValues() from None
    tid = None
    if result is not grad or recorder.steps:  # (else each hook returned None or its gradient, untouched: nothing
        # to run there; their side effects happened here)
        template = recorder.template([grad], [result])
        session.ensure_template(template["id"], template)
        tid = template["id"]
    ref = weakref.ref(grad)
    del grad, result
    return tid, ref if ref() is not None else None


def rebind(session: Any, ref: weakref.ref, kid: str, present: frozenset) -> None:
    """A stand-in a hook kept, made a handle of the gradient the server kept for it under ``kid`` (one the
    backward did not reach stays a stand-in: reading it raises)."""
    if kid not in present:
        return
    h = ref()
    if h is None:  # (not kept after all: the server's copy goes)
        session._free_later(kid)
    else:
        h._session, h._id = session, kid

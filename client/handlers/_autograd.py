"""Autograd calls a RemoteTensor answers itself: requires_grad, detach, retain_grad, .grad,
backward and torch.autograd.grad, each queued as its own step kind.

Whether a leaf's ``.grad`` is None is predicted from which leaves a backward reaches
(and corrected from the server's answer), so optimizers never need a round trip.
"""

from __future__ import annotations

import weakref

import torch

from remote_autograd.proto.messages import (BackwardStep, CallStep, GradStep, RetainGradStep, SetGradStep,
                                            SetRequiresGradStep)

from .._core import Encoder, RemoteTensor
from ..dispatch._client_run import MADE
from ..session._answers import meta_from_result
from ..session._callsite import refuse_custom_function
from ..session._steps import OMIT, Origin, make_step, op_where, where
from ..tensor import _views
from ..tensor._autograd_flags import set_has_grad, set_requires_grad_flag
from . import _staged
from ._handler_table import HandlerTable
from ._hooks import NOT_ACCUMULATED, hook_steps, let_go, run_observed
from ._node_hooks import forget, node_hook_steps

T = torch.Tensor
HANDLERS = HandlerTable()
_answers = HANDLERS.on


@_answers(T.requires_grad.__set__)
def _set_requires_grad(t, value):
    _requires_grad_(t, bool(value))


@_answers(T.requires_grad_)
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
    t._session.enqueue(make_step(SetRequiresGradStep, id=t._id, requires_grad=requires_grad),
                       Origin("requires_grad_", where()))
    t._rg, t._is_leaf = requires_grad, True
    set_requires_grad_flag(t, requires_grad)
    if requires_grad:
        t._leaves = frozenset({t._id})
        t._session._grad_tracked[t._id] = t
    else:
        t._leaves = frozenset()
    return t


@_answers(T.detach)
def _detach(t):
    t._check_usable()
    if not torch.is_grad_enabled():  # inside a Function's forward, the detached handle may be its output
        refuse_custom_function(T.detach)
    tid = t._session.new_id()
    out = RemoteTensor._new(t._session, tid, t._shape, t._dtype)
    t._session.enqueue(make_step(CallStep, op="detach", args=[t._ref()], out=[tid]),
                       Origin("detach", where(), [weakref.ref(out)]))
    if t._grad_owner is None:  # shares t's memory and version counter on the server, as torch's detach does
        _views.alias(out, t, differentiable=False)
    return out


@_answers(T.retain_grad)
def _retain_grad(t):
    if not t._rg:
        raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
    if t._is_leaf or t._retains:
        return
    t._session.enqueue(make_step(RetainGradStep, id=t._id), Origin("retain_grad", where()))
    t._retains = True
    t._leaves = t._leaves | {t._id}
    t._session._grad_tracked[t._id] = t


@_answers(T.retains_grad.__get__)
def _retains_grad(t):
    return t._retains


@_answers(T.grad.__get__, T._grad.__get__)
def _grad_get(t):
    _check_accumulated(t)
    return t._grad_handle() if t._has_grad else None


def _check_accumulated(t) -> None:
    """Inside a post-accumulate hook (run after the backward, ``_hooks``): the ``.grad`` of a leaf torch would
    accumulate only later in that backward is refused (torch's hook would see it as it was before)."""
    hooked = t.__dict__.get(NOT_ACCUMULATED)
    if hooked is not None:
        raise RuntimeError("a post accumulate grad hook on a remote tensor reads or sets the .grad of another leaf "
                           "that torch's backward accumulates after the hooked one (so torch's hook would see its "
                           "old .grad; the SDK runs these hooks after the whole backward, where it holds the new "
                           f"one): read only the hooked tensor's own .grad there ({where()})")


@_answers(T.grad.__set__, T._grad.__set__)
def _grad_set(t, value):
    _check_accumulated(t)
    if value is None:  # the user's line remembered per calling frame: zero_grad clears every parameter's from one
        t._session.clear_grad(t._id, op_where())
    else:
        if tuple(value.shape) != t._shape:
            raise RuntimeError("assigned grad has data of a different size")
        if value.dtype != t._dtype:
            raise RuntimeError("assigned grad has data of a different type")
        if not isinstance(value, RemoteTensor):  # torch's own rule and words (a CUDA tensor's grad on the CPU)
            raise RuntimeError("assigned grad has data located on a different device")
        ref = Encoder(t._session).value(value if isinstance(value, (RemoteTensor, torch.Tensor)) else value)
        t._session.enqueue(make_step(SetGradStep, id=t._id, grad=ref), Origin("set_grad", op_where()))
    set_has_grad(t, value is not None)
    t._grad_cache = None


@_answers(T.grad.__delete__)
def _grad_del(t):
    _grad_set(t, None)


@_answers(T.backward)
def _backward(t, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    if getattr(t, "_session", None) not in MADE:  # no client-run node in its session: nothing to stage (_staged)
        queue_backward([t], [gradient], retain_graph, create_graph, inputs)
    else:
        _staged_or_queued([t], [gradient], retain_graph, create_graph, inputs)


@_answers(torch.autograd.backward)
def _autograd_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                       inputs=None):
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = grad_variables
    if grad_tensors is None or isinstance(grad_tensors, torch.Tensor):
        grad_tensors = [grad_tensors] * len(tensors) if grad_tensors is None else [grad_tensors]
    _staged_or_queued(tensors, list(grad_tensors), retain_graph, create_graph, inputs)


def _staged_or_queued(tensors: list, grads: list, retain_graph, create_graph: bool, inputs) -> None:
    """``queue_backward``, or in stages where the roots reach Functions whose backward runs here (``_staged``)."""
    runs = _staged.reached(tensors)
    if not runs:
        queue_backward(tensors, grads, retain_graph, create_graph, inputs)
        return

    def queue(roots: list, given: list, retain: bool, capture: list) -> int:
        return queue_backward(roots, given, retain, False, inputs, capture)

    _staged.staged_backward(tensors[0]._session, runs, tensors, grads, retain_graph, create_graph, queue)


def _autograd_fields(session, backward: bool, roots: list) -> tuple[dict, dict]:
    """The fields a backward (or grad) step from ``roots`` takes from now: anomaly detection as torch's
    (first: it may send what is queued), the session's tensor hooks, recorded now, and the module backward
    hooks it reaches (``_hooks``, ``_node_hooks``); and what runs the observed ones, by id."""
    fields = session.autograd_fields()
    observed: dict = {}
    if session._hooked:
        hooks, observed = hook_steps(session, backward)
        if hooks:
            fields["hooks"] = hooks
    if session._node_hooks:
        reached = frozenset().union(*(t._leaves for t in roots if t._rg))
        node_hooks, module_hooks, more = node_hook_steps(session, reached)
        if node_hooks:
            fields["node_hooks"] = node_hooks
        if module_hooks:
            fields["module_hooks"] = module_hooks
        observed.update(more)
    return fields, observed


def _enqueue_hooked(session, step: dict, origin: Origin, nbytes: int, observed: dict) -> int:
    """Queue ``step``; with hooks, let go of the tensors kept for those it runs (``_hooks.let_go``) and forget
    the nodes it answers gone (``_node_hooks``); with observed hooks or module hooks, wait for its answer and
    run the observed ones on what it kept."""
    if not observed and "hooks" not in step and "module_hooks" not in step:
        return session.enqueue(step, origin, nbytes)
    answer: dict = {}
    correct = origin.on_result
    retained = step.get("create_graph", False) if step.get("retain_graph") is None else step["retain_graph"]

    def on_result(result) -> None:
        if correct is not None:
            correct(result)
        let_go(session, result, retained)
        forget(session, (result or {}).get("gone"))
        answer.update(result or {})

    origin.on_result = on_result
    index = session.enqueue(step, origin, nbytes)
    if observed or "module_hooks" in step:  # (module hooks may pass None on, where the prediction of which
        session.flush()                      # .grad is None did not look: its answer first)
        run_observed(observed, answer)
    return index


def _grad_step(enc: Encoder, outputs: list, inputs: list, fields: dict, grad_outputs: list | None, retain_graph,
               create_graph: bool, allow_unused: bool, out: list, capture: list | None = None) -> dict:
    """The one builder of a ``grad`` step (``torch.autograd.grad``, and each stage of a staged one): ``fields``
    from ``_autograd_fields`` (or the session's alone), the rest as torch's arguments."""
    return make_step(GradStep, outputs=[o._id for o in outputs], inputs=[i._id for i in inputs], **fields,
                     grad_outputs=OMIT if grad_outputs is None else _gradients(enc, grad_outputs),
                     retain_graph=OMIT if retain_graph is None else bool(retain_graph),
                     create_graph=True if create_graph else OMIT, allow_unused=True if allow_unused else OMIT,
                     out=out, capture=capture or OMIT)


def _gradients(enc: Encoder, grads: list) -> list:
    """The given output gradients as wire values; a local one is refused with torch's words (as for CUDA outputs)."""
    for i, g in enumerate(grads):
        if isinstance(g, torch.Tensor) and not isinstance(g, RemoteTensor):
            raise RuntimeError(f"invalid gradient at index {i} - expected device {enc.session.device} but got "
                               f"{g.device}")
    return [None if g is None else enc.value(g) for g in grads]


def queue_backward(tensors: list, grads: list, retain_graph, create_graph: bool, inputs, capture: list | None = None
                   ) -> int:
    """Queue a backward step and predict which leaves get a ``.grad`` from it; its index in the queue.
    ``capture``: the step's (``_staged``)."""
    session = tensors[0]._session
    for t in tensors:
        if not isinstance(t, RemoteTensor):
            raise TypeError("backward() of a mix of RemoteTensors and local tensors")
        if t._session is not session or t._error is not None:  # what Encoder.value raises for an op's argument
            Encoder(session).value(t)
    enc = Encoder(session) if any(g is not None for g in grads) else None  # the given gradients' wire values
    # _autograd_fields(session, True, tensors), its plain case inline: no hooks in the session
    fields, observed = (session.autograd_fields(), {}) if not session._hooked and not session._node_hooks else \
        _autograd_fields(session, True, tensors)
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    step = make_step(BackwardStep, tensors=[t._id for t in tensors], **fields,
                     grad_tensors=OMIT if enc is None else _gradients(enc, grads),
                     retain_graph=OMIT if retain_graph is None else bool(retain_graph),
                     create_graph=True if create_graph else OMIT, capture=capture or OMIT,
                     inputs=OMIT if inputs is None else [i._id for i in inputs])
    if inputs is not None:
        reached = [i for i in inputs]
    else:
        ids: frozenset = frozenset()
        for t in tensors:
            if t._rg:
                ids = ids | t._leaves
        reached = [session._grad_tracked.get(i) for i in ids]
    newly = [leaf for leaf in reached if leaf is not None and not leaf._has_grad]
    for leaf in newly:
        set_has_grad(leaf, True)

    def undo() -> None:
        for leaf in newly:
            set_has_grad(leaf, False)

    # By id, not ``leaf in newly``: a list's ``in`` falls back to ``==``, which on tensors is
    # torch.eq (here a remote op, run from inside a flush, refused for unequal shapes).
    newly_ids = {leaf._id for leaf in newly}

    def correct(result) -> None:
        for tid in (result or {}).get("no_grad") or ():
            leaf = session._grad_tracked.get(tid)
            if leaf is not None and tid in newly_ids:
                set_has_grad(leaf, False)
                leaf._grad_cache = None

    origin, nbytes = Origin("backward", where(), undo=undo, on_result=correct), 0 if enc is None else enc.nbytes
    if not observed and "hooks" not in step and "module_hooks" not in step:  # _enqueue_hooked's plain case, inline
        return session.enqueue(step, origin, nbytes)
    return _enqueue_hooked(session, step, origin, nbytes, observed)


@_answers(torch.autograd.grad)
def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
                   allow_unused=None, is_grads_batched=False, materialize_grads=False):
    if is_grads_batched:  # torch runs the backward under vmap: a torch.func transform (known-differences.md)
        raise RuntimeError("torch.autograd.grad(..., is_grads_batched=True) on remote tensors: torch runs the "
                           "backward under torch.func.vmap, which cannot run on tensors whose values live on the "
                           "server. Call torch.autograd.grad once per row of grad_outputs (retain_graph=True), "
                           "or torch.autograd.functional.jacobian without vectorize=True")
    single_input = isinstance(inputs, torch.Tensor)
    outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    inputs = [inputs] if single_input else list(inputs)
    runs = _staged.reached(outputs)
    if runs:
        return _staged_grad(runs, outputs, inputs, grad_outputs, retain_graph, create_graph, allow_unused,
                            materialize_grads)
    session = outputs[0]._session
    enc = Encoder(session)
    for t in (*outputs, *inputs):
        enc.value(t)
    fields, observed = _autograd_fields(session, False, outputs)
    if grad_outputs is not None:
        grad_outputs = [grad_outputs] if isinstance(grad_outputs, torch.Tensor) else list(grad_outputs)
    ids = [session.new_id() for _ in inputs]
    step = _grad_step(enc, outputs, inputs, fields, grad_outputs, retain_graph, create_graph,
                      allow_unused or materialize_grads, ids)
    leaves: frozenset = frozenset()
    if create_graph:
        for t in (*outputs, *inputs):
            leaves = leaves | t._leaves
    if allow_unused or materialize_grads:  # which grads are None only the server knows
        index = session.enqueue(step, Origin("grad", where()), enc.nbytes)
        result = session.take_result(index)
        metas = meta_from_result(result)
        forget(session, result.get("gone"))
        if observed:
            run_observed(observed, result)
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
    _enqueue_hooked(session, step, Origin("grad", where(), [weakref.ref(g) for g in grads]), enc.nbytes, observed)
    return grads



def _staged_grad(runs: list, outputs: list, inputs: list, grad_outputs, retain_graph, create_graph: bool,
                 allow_unused, materialize_grads: bool) -> tuple:
    """``torch.autograd.grad`` through Functions whose backward runs here (``_staged``): a ``grad`` step per
    stage, each input's gradient the sum of the stages'; an input none reached as torch answers it."""
    session = outputs[0]._session
    if grad_outputs is not None:
        grad_outputs = [grad_outputs] if isinstance(grad_outputs, torch.Tensor) else list(grad_outputs)

    def queue(roots: list, given: list, retain: bool, capture: list) -> tuple:
        enc = Encoder(session)
        for t in (*roots, *inputs):
            enc.value(t)
        ids = [session.new_id() for _ in inputs]
        step = _grad_step(enc, roots, inputs, session.autograd_fields(),
                          given if any(g is not None for g in given) else None, retain, False, True, ids,
                          capture)
        index = session.enqueue(step, Origin("grad", where()), enc.nbytes)

        def read(result: dict) -> list:
            return [None if m is None else RemoteTensor._new(session, m[0], m[1], m[2])
                    for m in meta_from_result(result)]

        return index, read

    grads = _staged.staged_grad(session, runs, outputs, inputs, grad_outputs, retain_graph, create_graph, queue)
    for g, i in zip(grads, inputs):
        if g is None and not (allow_unused or materialize_grads):  # torch's words
            raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. Set "
                               "allow_unused=True if this is the desired behavior.")
    return tuple(torch.zeros_like(i) if g is None and materialize_grads else g for g, i in zip(grads, inputs))

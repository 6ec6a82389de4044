"""The ``function`` step: a user's ``torch.autograd.Function``, applied on the client, made a node of
the server's autograd graph (``proto/SPEC.md`` §4, "function").

The client ran the Function's forward as ordinary steps (with grad off, as torch runs it) and recorded
its backward into a template (a template step before this one). This step applies one generic
``autograd.Function``, ``_UserFunction``, to the Function's inputs: its forward returns the outputs
the forward's steps made (torch gives each this node as its history, in place; an input marked dirty
has its history rebased), marks what the client marked, and saves the tensors the backward reads
with ``ctx.save_for_backward``, so they live as long as the graph and the byte ledger counts them as
it counts any node's saved tensors (``values.counting_saved``: the program's hooks see these saves too). Its
backward runs the template through ``Template.runner`` with every check a template run has.

The runner needs the ``ProgramRun`` of the ``backward`` or ``grad`` step that runs the engine:
``autograd_steps`` holds it on the session (``Session.autograd_run``) for its duration. A context
variable would not do: autograd may call a node on another thread (a CUDA device's), which is also
why ``run_bound`` sets the op context and the saved-tensor hooks again around the template.
"""

from __future__ import annotations

import functools
import itertools
import weakref

import torch

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import FunctionStep, RunTemplateStep

from ..ops._context import CURRENT, RunContext
from .templates import Execute, GradStandIn, Template
from .values import ProgramRun, counting_saved

_RUNS = itertools.count()


class _Spec:
    """What a node of ``_UserFunction`` keeps besides its saved tensors (no tensor: those are saved)."""

    __slots__ = ("name", "template", "session", "execute", "grads", "outputs", "dirty", "non_differentiable", "saved",
                 "once", "live", "reentrant", "materialize", "variants", "client")

    def __init__(self, step: FunctionStep, template: Template | None, session, execute: Execute, outputs: list,
                 variants: dict) -> None:
        self.name, self.template, self.execute = step.name, template, execute
        self.materialize = step.materialize_grads
        self.variants = variants  # materialize_grads false: {present pattern: (template, grads)}
        self.session = weakref.ref(session)  # the session holds the graph: no cycle through C++
        self.grads = step.grads
        self.outputs = outputs  # forward's only: dropped once it returns
        self.dirty, self.non_differentiable, self.once = step.dirty, step.non_differentiable, step.once_differentiable
        self.live, self.reentrant = step.live, step.reentrant
        self.saved: list = []  # (kind, k): ("input", i), ("output", j) or ("value", tensor), until forward saves them
        self.client = False  # a client_backward node's (_cut)


class _UserFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: _Spec, *inputs: torch.Tensor):
        outputs = [inputs[k] if kind == "input" else t for kind, k, t in spec.outputs]
        spec.outputs = None
        if spec.dirty:
            ctx.mark_dirty(*(inputs[i] for i in spec.dirty))
        if spec.non_differentiable:
            ctx.mark_non_differentiable(*(outputs[j] for j in spec.non_differentiable))
        if not spec.materialize:
            ctx.set_materialize_grads(False)
        saved = [inputs[k] if kind == "input" else outputs[k] if kind == "output" else k for kind, k in spec.saved]
        spec.saved = None
        ctx.save_for_backward(*saved)
        ctx.spec = spec
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        spec: _Spec = ctx.spec
        grads_of_inputs = (_once_differentiable if spec.once else _run_backward)(ctx, *grads)
        if not torch.is_grad_enabled():  # no create_graph: torch's grads carry no graph (the steps may record one)
            grads_of_inputs = [None if g is None else g.detach() for g in grads_of_inputs]
        return (None, *grads_of_inputs)


@functools.lru_cache(maxsize=1024)
def _named(name: str) -> type:
    """``_UserFunction`` under the user's Function's name, so that its node is ``{name}Backward`` as torch's
    would be, in torch's own errors about it (a gradient of the wrong shape) and in ``grad_fn``'s name."""
    return type(name, (_UserFunction,), {"__module__": __name__})


def _run_backward(ctx, *grads: torch.Tensor) -> tuple:
    """The grads of the node's inputs: its template run on its grads, saved tensors and live tensors."""
    spec: _Spec = ctx.spec
    template, index = spec.template, spec.grads
    if any(g is None for g in grads):  # materialize_grads false: torch's None where no gradient flows
        present = tuple(g is not None for g in grads)
        if present not in spec.variants:
            absent = [j for j, p in enumerate(present) if not p]
            raise RuntimeError(f"{spec.name}.backward: ctx.set_materialize_grads(False), and no gradient reaches "
                               f"output(s) {absent}, a pattern of grads its backward was not recorded for (at apply: "
                               "the SDK records each pattern for up to 3 outputs, and skips one where the backward "
                               "raises on its None grads)")
        template, index = spec.variants[present]
        grads = tuple(g for g in grads if g is not None)
    bound = [GradStandIn(t) for t in (*grads, *ctx.saved_tensors)]
    if template is None:
        return tuple(None if k is None else bound[k].value for k in index)
    session = spec.session()
    run = None if session is None else session.autograd_run
    if run is None:
        raise RuntimeError(f"{spec.name}.backward runs only inside a backward or grad step of its session")
    if spec.reentrant and session.autograd_explicit:  # torch's checkpoint asks _is_checkpoint_valid()
        raise RuntimeError("When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() or passing "
                           "an `inputs` parameter to .backward(). To resolve this error, you can either set "
                           "use_reentrant=False, or call .backward() without passing the `inputs` argument.")
    bound += [session.tensor(tid) for tid in spec.live]  # the session's own: what the template writes stays
    made = run_bound(run, template, bound, spec.execute, f"{spec.name}.backward")
    values = [ct.value for ct in bound] + made
    return tuple(None if k is None else values[k] for k in index)


def run_bound(run: ProgramRun, template: Template, bound: list, execute: Execute, what: str) -> list[torch.Tensor]:
    """``template`` run inside autograd (a node's backward, a tensor's hook) on ``bound``: its outputs,
    which autograd holds from here (the session forgets them; a grad kept is counted again)."""
    session = run.session
    names = [f"~fn{next(_RUNS)}/{j}" for j in range(len(template.outputs))]
    step = RunTemplateStep.model_construct(kind="run_template", template=template.step.id, inputs=[], scalars=[],
                                           out=names)
    template.runs += 1
    # what the runner sets around a program, set again: on a CUDA device autograd calls the node on a thread
    # of its own, where neither the session's generator nor the saved-tensor hooks would be found
    token = CURRENT.set(RunContext(session.generator, session.device, run.settings.max_tensor_elements))
    try:
        with counting_saved(session, run.settings.max_session_bytes):
            template.runner(run, template, step, bound, {}, execute)
    except ProtocolError as err:  # its code kept (a limit is a 413): autograd raises it as it is
        raise ProtocolError(err.code, f"{what}: {err.message}") from None
    finally:
        CURRENT.reset(token)
    tensors = session.tensors
    made = [tensors.pop(name) for name in names]
    session.storages.drop(made)
    return [ct.value for ct in made]


def _once_differentiable(ctx, *grads: torch.Tensor) -> tuple:
    """``_run_backward`` as torch's ``once_differentiable`` runs a backward: grad off, and where the grads
    require grad, outputs whose own backward raises torch's error. torch's ``DelayedError`` node takes
    detached copies, so only a backward that runs every node meets it; the server's runs only the nodes
    on the way to its leaves (``autograd.grad``), so the node here also takes the grads and saved tensors
    that require grad: on the way to them, it is met as torch's is."""
    with torch.no_grad():
        out = _run_backward(ctx, *grads)
    if not torch.is_grad_enabled() or not any(g is not None and g.requires_grad for g in grads):  # torch's rule
        return out
    present = [k for k, o in enumerate(out) if o is not None]
    anchors = [t for t in (*grads, *ctx.saved_tensors) if t is not None and t.requires_grad]
    err = torch._C._functions.DelayedError(_TWICE, len(present) + len(anchors))
    passed = err(*(out[k].detach().requires_grad_() for k in present), *anchors)
    passed = passed if isinstance(passed, tuple) else (passed,)
    result = list(out)
    for k, t in zip(present, passed):
        result[k] = t
    return tuple(result)


_TWICE = b"trying to differentiate twice a function that was marked with @once_differentiable"  # torch's words


def apply_function(run: ProgramRun, step: FunctionStep, execute: Execute) -> None:
    """The ``function`` step (see the module's docstring)."""
    session = run.session
    if step.client_backward:
        return _cut(session, step, execute)
    template = _held(session, step.backward)
    _check_backward(step, template, [True] * len(step.outputs), step.backward, step.grads)
    _check_step(step)
    variants = {}
    for variant in step.variants:
        held = _held(session, variant.backward)
        _check_backward(step, held, variant.present, variant.backward, variant.grads)
        variants[tuple(variant.present)] = (held, variant.grads)
    for tid in step.live:  # (bound when the backward runs: an unknown one is said now)
        session.tensor(tid)
    inputs = [session.tensor(t).value for t in step.inputs]
    position = {tid: i for i, tid in enumerate(step.inputs)}
    outputs = []
    for tid in step.outputs:
        i = position.get(tid)
        outputs.append(("input", i, None) if i is not None else ("value", None, session.tensor(tid).value))
    spec = _Spec(step, template, session, execute, outputs, variants)
    out_position = {tid: j for j, tid in enumerate(step.outputs)}
    for tid in step.saved:  # an output saved is saved as torch saves one: with this node as its history
        j = out_position.get(tid)
        spec.saved.append(("output", j) if j is not None else
                          ("input", position[tid]) if tid in position else ("value", session.tensor(tid).value))
    results = _named(step.name).apply(spec, *inputs)
    if step.node is not None:  # (for node_hooks: service.engine.tensor_hooks)
        node = next((r.grad_fn for r in results if r.grad_fn is not None), None)
        if node is not None:
            session.nodes[step.node] = node
    tensors = session.tensors
    for tid, value in zip(step.outputs, results):
        if tid not in position:
            tensors[tid].value = value  # the same tensor with its history set, or a view torch made
    return None


def _cut(session, step: FunctionStep, execute: Execute) -> None:
    """A ``client_backward`` node: the forward's outputs take a node whose only input is a leaf of its own
    (an anchor no step can name), so they require grad, no backward walks through them to anything (the
    engine never runs the node: nothing it leads to is asked for), and a ``backward`` step's ``capture``
    keeps the gradient that reaches them for the client, which runs the Function's backward itself."""
    if step.inputs or step.grads or step.backward or step.saved or step.live or step.dirty or step.variants \
            or step.reentrant or step.node is None:
        raise _bad(step, "a client_backward node names its outputs and node only (no inputs, grads, backward, "
                   "saved, live, dirty, variants or reentrant)")
    _check_step(step)
    values = [session.tensor(tid).value for tid in step.outputs]
    spec = _Spec(step, None, session, execute, [("value", None, v) for v in values], {})
    spec.grads, spec.client = [None], True  # the anchor's grad (none)
    anchor = torch.zeros((), device=values[0].device, requires_grad=True)  # (on the outputs' device: one stream)
    results = _named(step.name).apply(spec, anchor)
    node = next((r.grad_fn for r in results if r.grad_fn is not None), None)
    if node is not None:  # (for a backward step's capture)
        session.nodes[step.node] = node
    tensors = session.tensors
    for tid, value in zip(step.outputs, results):
        tensors[tid].value = value


def is_client_run(node) -> bool:
    """Whether ``node`` is a ``client_backward`` one (``_cut``)."""
    spec = getattr(node, "spec", None)
    return isinstance(spec, _Spec) and spec.client


def _held(session, template_id: str | None) -> Template | None:
    template = None if template_id is None else session.templates.get(template_id)
    if template is None and template_id is not None:
        raise ProtocolError(ErrorCode.UNKNOWN_TEMPLATE, f"unknown template {template_id!r} in this session: "
                            "send its template step first (a restart of the server keeps none)")
    return template


def _bad(step: FunctionStep, message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, f"function step ({step.name}): {message}")


def _check_backward(step: FunctionStep, template: Template | None, present: list[bool], template_id: str | None,
                    grads: list) -> None:
    """A backward of the step (its own, or a variant's: the grads ``present``) against what the step binds:
    400 naming what does not fit."""
    if len(present) != len(step.outputs):
        raise _bad(step, f"a variant's present has {len(present)} entries for {len(step.outputs)} outputs")
    bound = sum(present) + len(step.saved) + len(step.live)
    if template is not None and len(template.step.inputs) != bound:
        raise _bad(step, f"template {template_id!r} takes {len(template.step.inputs)} inputs, the step binds "
                   f"{sum(present)} grads, {len(step.saved)} saved and {len(step.live)} live tensors")
    if len(grads) != len(step.inputs):
        raise _bad(step, f"grads has {len(grads)} entries for {len(step.inputs)} inputs")
    known = bound + (0 if template is None else len(template.outputs))
    for k in grads:
        if k is not None and k >= known:
            raise _bad(step, f"grad {k} is out of range: the backward has {known} tensors (bound, then the "
                       "template's outputs)")


def _check_step(step: FunctionStep) -> None:
    """The step against itself (once, whatever its variants): 400 naming what does not fit."""
    if step.variants and step.materialize_grads:
        raise _bad(step, "variants are for materialize_grads false")
    if len(set(step.outputs)) != len(step.outputs):  # (an input may repeat: F.apply(x, x), as in torch)
        raise _bad(step, "outputs name each tensor once")
    dirty = set()
    for i in step.dirty:
        if i >= len(step.inputs) or step.inputs[i] not in step.outputs:
            raise _bad(step, f"dirty input {i} is not an input that is also an output")
        dirty.add(step.inputs[i])
    for tid in step.outputs:
        if tid in step.inputs and tid not in dirty:
            raise _bad(step, f"output {tid!r} is an input the forward did not mark dirty")
    for j in step.non_differentiable:
        if j >= len(step.outputs):
            raise _bad(step, f"non_differentiable output {j} is out of range")

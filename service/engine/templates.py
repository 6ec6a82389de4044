"""Templates: the graphs ``torch.compile(..., backend="remote")`` captured, kept by a session and run
by one small step each time (DESIGN principle 10, ``proto/SPEC.md`` §5).

A ``template`` step defines one: its inputs (names, and the layouts every run must bind), its
numbers (``scalars``, read by ``{scalar: name}`` arguments), its steps (calls, grads, backwards,
grad and requires-grad settings, naming only the template's own tensors) and its outputs. It is
validated once, when defined (``Template.build``): every op in the table, every name made before
it is read and made once, outputs made by its steps. The session keeps it (at most
``max_templates_per_session``); ``Session.clear`` frees them with the session, and the SIGTERM save
writes none, so after a restart a run answers ``unknown_template`` and the client sends it again.

A ``run_template`` step binds its inputs (a tensor of another layout than the template declares is
a 400 naming the input) and numbers, runs the template, and keeps its outputs under the step's
``out`` ids: all of them or, when a step of the template fails, none (the in-place changes of the
steps before the failing one stay done, as in a program). Its error names the template's step:
``step 7 of template T: <op>: <torch's message>``.

**How a template runs** is ``Template.runner``, one per template, chosen in one place when it is
defined (``compiled_templates.runner_for``): a runner that runs a variant's repeated runs as its graph
(eagerly, or compiled with ``REMOTE_AUTOGRAD_COMPILE``) and its first run with ``run_plainly``, which
is the whole runner for ``torch.func`` regions and with ``REMOTE_AUTOGRAD_REPLAY=off``. ``run_plainly`` runs each
step through the runner's own handlers (the ``execute`` the runner passes in), so every check
applies on every run: the meta check before each kernel (with its outputs' elements and its cost:
``step_cost``), value checks, the byte budgets (a run's outputs, and what its graph saves, are
charged on every run), the time limit between steps. A repeated run is checked by its plan
(``program_plan``: what a call's layouts answered last run, its contract and the limits held
again); a run whose bound inputs' layouts and numbers are a vouched run's skips even the plan's
per-call pattern check (``program_plan.Vouched``: checked once per run). The template's names live
in the session's tensor table under a prefix no client id can have (``~<template>/``) while it runs: its inputs as aliases of the
bound tensors, the rest as its steps make them; the temporaries go at its end. A compiled way to run
a template (inductor, CUDA graphs) is another runner with ``run_plainly``'s signature; it must keep
the outputs under ``step.out`` (``values.store_made``: counted and charged) or raise having kept nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

from remote_autograd.proto import DTYPES, ErrorCode, ProtocolError, dtype_name
from remote_autograd.proto.messages import (BackwardStep, CallStep, CheckpointEndStep, CheckpointStep, FunctionStep,
                                            FunctorchStep, GradStep, RunTemplateStep, SetGradStep,
                                            SetRequiresGradStep, TemplateStep)

from .. import ops as _ops
from ..sessions.store import CustomTensor
from . import compiled_templates, functorch_regions
from .program_plan import PLAIN, for_template, inputs_key, loose_scalars
from .values import ProgramRun, bound_scalars, check_new_ids, meta_message

# execute(run, step, index): one step through the runner's handler for its kind; a failure raised as a ProtocolError
Execute = Callable[[ProgramRun, Any, int], Any]
_PREFIX = "~"  # no client id starts with it (proto.messages.TENSOR_ID_PATTERN)
_MAX_DEPTH = 8  # lists in lists, as values.resolve_value allows


def _bad(template: str, index: int | None, message: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> ProtocolError:
    where = f"template {template!r}" if index is None else f"step {index} of template {template!r}"
    return ProtocolError(code, f"{where}: {message}")


@dataclass(eq=False)
class Template:
    """A validated template: its wire step, and its steps with every name under the template's prefix.

    ``runner`` runs it (``run_plainly``, or a compiled way set later); ``runs`` counts its runs;
    ``plans``: what its plain runs' calls answered (``program_plan``: a repeated run is checked by
    its plan, as a repeated program is)."""

    step: TemplateStep
    steps: list
    inputs: list[str]  # prefixed, in the order runs bind them
    made: list[str]  # prefixed: every name its steps make (its outputs among them)
    outputs: list[str]  # prefixed
    runner: Callable[..., None] = field(default=None)  # type: ignore[assignment]
    regions: dict = field(default_factory=dict)  # its torch.func regions: first step -> functorch_regions.Region
    runs: int = 0
    plans: OrderedDict = field(default_factory=OrderedDict)  # its runs' program_plan plans, as a session's
    loose: frozenset | None = None  # its numbers a pattern takes by type (program_plan.loose_scalars): at its first run
    wanted: list = field(init=False)  # per input, what a run must bind (``_Wanted``), from ``step``

    def __post_init__(self) -> None:
        if self.runner is None:
            self.runner = run_plainly
        self.wanted = [_Wanted.of(declared) for declared in self.step.inputs]

    @classmethod
    def build(cls, step: TemplateStep) -> "Template":
        """Validate ``step`` (400 for names, 404 for an op the table lacks) and rename its tensors."""
        tid = step.id
        prefix = f"{_PREFIX}{tid}/"
        names = [i.id for i in step.inputs]
        if len(set(names)) != len(names):
            raise _bad(tid, None, f"input names repeat: {names}")
        scalars = {s.id for s in step.scalars}
        if len(scalars) != len(step.scalars):
            raise _bad(tid, None, f"scalar names repeat: {[s.id for s in step.scalars]}")
        known, made = set(names), []
        own = []
        scopes = functorch_regions.Scopes(lambda index, message: _bad(tid, index, message))
        for index, inner in enumerate(step.steps):
            reads, writes = _names(inner, index, tid)
            scopes.step(index, inner, reads, writes)
            for name in reads:
                if name not in known:
                    raise _bad(tid, index, f"{name!r} is read before any step makes it (nor is it an input)")
            for name in _scalar_reads(inner):
                if name not in scalars:
                    raise _bad(tid, index, f"{{scalar: {name!r}}} names no scalar of the template")
            for name in writes:
                if name in known:
                    raise _bad(tid, index, f"{name!r} is made twice (or is an input): a template names a tensor once")
                known.add(name)
                made.append(name)
            own.append(renamed(inner, prefix))
        outputs = list(step.outputs)
        if len(set(outputs)) != len(outputs):
            raise _bad(tid, None, f"outputs repeat: {outputs}")
        for name in outputs:
            if name not in made:
                raise _bad(tid, None, f"output {name!r} is not made by a step of the template (an input is "
                           "returned by the client itself)")
        regions = {start: functorch_regions.Region.of(own, start, stop, [prefix + n for n in out],
                                                      [prefix + n for n in reads])
                   for start, stop, out, reads in scopes.finish(step.outputs)}
        return cls(step, own, [prefix + n for n in names], [prefix + n for n in made],
                   [prefix + n for n in outputs], regions=regions)


def _names(step, index: int, tid: str) -> tuple[list[str], list[str]]:
    """(names ``step`` reads, names it makes), as the template spells them."""
    kind = type(step)
    if kind is CallStep:
        if step.out_many:
            raise _bad(tid, index, f"{step.op}: out_many is not allowed in a template (name each output)")
        if _ops.OP_TABLE.resolve(step.op) is None:
            raise _bad(tid, index, f"unknown op {step.op!r}; GET /v1/ops lists the op table", ErrorCode.UNKNOWN_OP)
        reads = _refs(step.args, [], 0)
        if step.kwargs:
            _refs(list(step.kwargs.values()), reads, 0)
        return reads, list(step.out)
    if kind in (BackwardStep, GradStep) and step.hooks:
        raise _bad(tid, index, "hooks are not allowed in a template (a template's steps name only its tensors)")
    if kind is BackwardStep:
        reads = list(step.tensors) + list(step.inputs or ())
        return _refs(step.grad_tensors or [], reads, 0), []
    if kind is GradStep:
        reads = list(step.outputs) + list(step.inputs)
        return _refs(step.grad_outputs or [], reads, 0), list(step.out)
    if kind is SetGradStep:
        return _refs([step.grad], [step.id], 0), []
    if kind is FunctorchStep:
        return functorch_regions.reads(step), list(step.out)
    return [step.id], []  # SetRequiresGradStep


def _refs(values: list, found: list, depth: int) -> list:
    """The tensor names ``values`` read (``{ref}``, ``{grad_of}``), appended to ``found``."""
    for value in values:
        if isinstance(value, dict) and len(value) == 1:
            (tag, payload), = value.items()
            if tag in ("ref", "grad_of") and isinstance(payload, str):
                found.append(payload)
        elif isinstance(value, list) and depth < _MAX_DEPTH:
            _refs(value, found, depth + 1)
    return found


def _scalar_reads(step) -> list[str]:
    values: list = []
    if type(step) is CallStep:
        values = [*step.args, *step.kwargs.values()]
    elif type(step) is BackwardStep:
        values = list(step.grad_tensors or ())
    elif type(step) is GradStep:
        values = list(step.grad_outputs or ())
    elif type(step) is FunctorchStep and isinstance(step.batch, dict):  # vmap's batch size, traced dynamic
        values = [step.batch]
    found: list[str] = []
    _scalars_in(values, found, 0)
    return found


def _scalars_in(values: list, found: list, depth: int) -> None:
    for value in values:
        if isinstance(value, dict) and len(value) == 1 and "scalar" in value:
            found.append(value["scalar"])
        elif isinstance(value, list) and depth < _MAX_DEPTH:
            _scalars_in(value, found, depth + 1)


def renamed(step, prefix: str):
    """``step`` with every tensor name under ``prefix`` (validated models: copied without revalidation): a
    template's own steps, and those a checkpoint region runs again (``checkpoint_regions``), where a function
    step's node is named apart from the forward's, which the session keeps)."""
    kind = type(step)
    if kind is CallStep:
        update: dict = {"args": _prefixed(step.args, prefix), "out": [prefix + o for o in step.out]}
        if step.kwargs:
            update["kwargs"] = {k: _prefixed_value(v, prefix) for k, v in step.kwargs.items()}
        return step.model_copy(update=update)
    if kind is BackwardStep:
        return step.model_copy(update={
            "tensors": [prefix + t for t in step.tensors],
            "inputs": None if step.inputs is None else [prefix + t for t in step.inputs],
            "grad_tensors": None if step.grad_tensors is None else _prefixed(step.grad_tensors, prefix)})
    if kind is GradStep:
        return step.model_copy(update={
            "outputs": [prefix + t for t in step.outputs], "inputs": [prefix + t for t in step.inputs],
            "grad_outputs": None if step.grad_outputs is None else _prefixed(step.grad_outputs, prefix),
            "out": [prefix + t for t in step.out]})
    if kind is SetGradStep:
        return step.model_copy(update={"id": prefix + step.id, "grad": _prefixed_value(step.grad, prefix)})
    if kind is RunTemplateStep:
        return step.model_copy(update={"inputs": _prefixed(step.inputs, prefix), "out": [prefix + o for o in step.out]})
    if kind is FunctionStep:
        return step.model_copy(update={field: [prefix + t for t in getattr(step, field)]
                                       for field in ("inputs", "outputs", "saved", "live")}
                               | {"node": None if step.node is None else prefix + step.node})
    if kind is CheckpointStep:
        return step.model_copy(update={"inputs": [prefix + t for t in step.inputs]})
    if kind is CheckpointEndStep:
        return step
    if kind is FunctorchStep:
        return step.model_copy(update={
            "id": None if step.id is None else prefix + step.id, "out": [prefix + o for o in step.out],
            "outputs": [prefix + t for t in step.outputs], "inputs": [prefix + t for t in step.inputs],
            "grad_outputs": None if step.grad_outputs is None else [prefix + t for t in step.grad_outputs]})
    assert kind is SetRequiresGradStep
    return step.model_copy(update={"id": prefix + step.id})


def _prefixed(values: list, prefix: str) -> list:
    return [_prefixed_value(v, prefix) for v in values]


def _prefixed_value(value: Any, prefix: str) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        (tag, payload), = value.items()
        if tag in ("ref", "grad_of") and isinstance(payload, str):
            return {tag: prefix + payload}
        return value
    if isinstance(value, list):
        return _prefixed(value, prefix)
    return value


# -- the two steps --------------------------------------------------------------------------


def define_template(run: ProgramRun, step: TemplateStep) -> None:
    """The ``template`` step: validate and keep it. The same definition again is a no-op (a client
    that resends it after a restart it did not notice); another under the same id is a 409."""
    session = run.session
    existing = session.templates.get(step.id)
    if existing is not None:
        if existing.step == step:
            return None
        raise ProtocolError(ErrorCode.CONFLICT, f"template id {step.id!r} is already used for a different template")
    limit = run.settings.max_templates_per_session
    if len(session.templates) >= limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"session holds {len(session.templates)} templates: limit "
                            f"max_templates_per_session={limit}")
    template = Template.build(step)
    template.runner = compiled_templates.runner_for(run.settings, session, template, run_plainly)
    session.templates[step.id] = template
    return None


def run_template(run: ProgramRun, step: RunTemplateStep, execute: Execute) -> dict | None:
    """The ``run_template`` step: bind, run (``template.runner``), keep the outputs under ``step.out``."""
    session = run.session
    template = session.templates.get(step.template)
    if template is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TEMPLATE, f"unknown template {step.template!r} in this session: "
                            "send its template step first (a restart of the server keeps none)")
    spec = template.step
    for what, given, wanted in (("inputs", step.inputs, spec.inputs), ("scalars", step.scalars, spec.scalars),
                                ("out", step.out, spec.outputs)):
        if len(given) != len(wanted):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"template {spec.id!r} takes {len(wanted)} {what}, "
                                f"the run gives {len(given)}")
    check_new_ids(session, step.out)
    wanted = template.wanted
    bound = [_bind(session, value, k, spec, wanted[k]) for k, value in enumerate(step.inputs)]
    scalars = {s.id: _number(value, s.kind, k, spec) for k, (value, s) in enumerate(zip(step.scalars, spec.scalars))}
    template.runs += 1
    template.runner(run, template, step, bound, scalars, execute)
    if run.omit_known_meta:
        return None
    return {"tensors": [meta_message(tid, session.tensors[tid].value) for tid in step.out]}


def _bind(session, value: Any, k: int, spec: TemplateStep, wanted: "_Wanted") -> CustomTensor:
    """Input ``k`` of a run: the session's tensor (``{ref}``) or a tensor's grad (``{grad_of}``, held by a
    stand-in whose value is that grad), of the layout the template declares (``wanted``: its ``_Wanted``)."""
    if not (isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("ref", "grad_of")):
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"input {k} of template {spec.id!r}: expected {{ref: id}} or "
                            f"{{grad_of: id}}")
    (tag, tid), = value.items()
    ct = session.tensor(tid)
    if tag == "grad_of":
        if ct.grad is None:
            raise ProtocolError(ErrorCode.OP_ERROR, f"input {k} of template {spec.id!r}: tensor {tid!r} has no grad "
                                "(it is None)")
        ct = GradStandIn(ct.grad)
    t = ct.value
    if t.dtype is not wanted.dtype or t.requires_grad is not wanted.requires_grad or not wanted.fits(t.shape):
        declared = spec.inputs[k]
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"input {k} ({declared.id!r}) of template {spec.id!r}: the "
                            f"template takes {declared.dtype} {declared.shape} requires_grad={declared.requires_grad}, "
                            f"the run gives {dtype_name(t.dtype)} {list(t.shape)} requires_grad={t.requires_grad}")
    return ct


class _Wanted(NamedTuple):
    """What a template's input takes, read once from its declaration (a run binds every input each step):
    its dtype, its shape where every dim is given (``exact``), else the declared dims (``None``: any size)."""

    dtype: torch.dtype
    requires_grad: bool
    exact: tuple | None
    dims: tuple

    @classmethod
    def of(cls, declared) -> "_Wanted":
        dims = tuple(declared.shape)
        return cls(DTYPES[declared.dtype], declared.requires_grad, None if None in dims else dims, dims)

    def fits(self, shape) -> bool:
        if self.exact is not None:
            return shape == self.exact
        return len(shape) == len(self.dims) and all(d is None or d == n for n, d in zip(shape, self.dims))


class GradStandIn(CustomTensor):
    """A grad bound as a run's input: its tensor is the grad itself (an in-place step changes the grad),
    counted by the ledger only while a step has measured it, and forgotten at the run's end. (A user
    Function's backward binds its grads and saved tensors so too: ``user_functions``.)"""

    __slots__ = ()


def _number(value: Any, kind: str, k: int, spec: TemplateStep) -> Any:
    ok = (type(value) is bool) if kind == "bool" else (type(value) is int if kind == "int"
                                                       else type(value) in (int, float))
    if not ok:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"scalar {k} ({spec.scalars[k].id!r}) of template {spec.id!r}: "
                            f"expected a {kind}, got {value!r}")
    return float(value) if kind == "float" else value


# -- the plain way to run one -----------------------------------------------------------------


def run_plainly(run: ProgramRun, template: Template, step: RunTemplateStep, bound: list[CustomTensor],
                scalars: dict, execute: Execute) -> None:
    """Each step of the template through the runner's handlers, its names aliased in the session's
    table for the run; the outputs kept under ``step.out``, the rest freed (all of them on a failure)."""
    session = run.session
    tensors = session.tensors
    # a plan vouches for each call of a run by its index: a torch.func region's calls are checked as one (on meta)
    replay = run.settings.replay == "on" and not template.regions
    check = PLAIN
    if replay:  # its bound inputs and numbers, once per run: equal to a vouched run's, no pattern checked
        if template.loose is None:
            template.loose = loose_scalars(template.steps)
        check = for_template(template.plans, template.steps, run.torch_state,
                             inputs_key(bound, scalars, template.loose))
    inner = ProgramRun(session, run.settings, run.as_json, omit_known_meta=True, check=check,
                       torch_state=run.torch_state, watch=run.watch, untimed=run.untimed)
    stand_ins = [ct for ct in bound if type(ct) is GradStandIn]
    tensors.update(zip(template.inputs, bound))
    tid = template.step.id
    regions = template.regions
    try:
        with bound_scalars(scalars):
            index, steps = 0, template.steps
            while index < len(steps):
                inner_step = regions.get(index) or steps[index] if regions else steps[index]
                try:
                    execute(inner, inner_step, index)
                except ProtocolError as err:
                    op = inner_step.op if type(inner_step) is CallStep else inner_step.kind
                    said = err.message if err.message.startswith(f"{op}: ") else f"{op}: {err.message}"  # (once)
                    raise ProtocolError(err.code, f"step {index} of template {tid!r}: {said}") from None
                index += len(inner_step.steps) if type(inner_step) is functorch_regions.Region else 1
        run.flops += inner.flops  # the run's work, counted where its program's is (a graph run holds it again)
        outputs = [tensors.pop(name) for name in template.outputs]
        tensors.update(zip(step.out, outputs))
        check.finish()
    finally:
        for name in template.inputs:
            tensors.pop(name, None)
        gone = [ct for ct in (tensors.pop(name, None) for name in template.made) if ct is not None]
        gone += stand_ins
        if gone:
            session.storages.drop(gone)

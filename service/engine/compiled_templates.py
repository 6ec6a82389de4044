"""A template run as one graph: the way to run a template that stands in for the plain one
(``templates.run_plainly``: each step through the runner's handlers) once a plain run has vouched for
its variant; eagerly (the graph's own module), or compiled by inductor (``REMOTE_AUTOGRAD_COMPILE``).
A speed path: ``python -m bench compile``, ``wan`` and ``gpu`` show what it saves.

``runner_for`` gives each template defined in a session its runner (``Template.runner``, the seam
``templates.py`` documents): a ``VariantRunner`` (a template with ``torch.func`` regions, and every
template with ``REMOTE_AUTOGRAD_REPLAY=off``: the plain one). For each run it keys the *variant*: the template's steps (its names canonical, so two sessions
of one token with the same template share it), the layouts of the tensors the run binds and of
their grads, its numbers by value (a graph bakes Python numbers in: a variant is only ever run with
the numbers it was built for), the device and the program's torch settings. A variant's first run
goes the plain way: every check on every step. When it succeeds, the variant's graph is built at
once (``template_compile.Compiler.graph``: a graph cannot hold random calls, data-dependent ones and
a few more, which stay plain for good) and from its next run on the variant runs as that graph:
torch's own calls in the steps' order, without the runner's Python around each step, so the answers
are the plain way's bit for bit (``tests/service/engine/test_template_graph.py``). With
``REMOTE_AUTOGRAD_COMPILE`` ``on`` (after the first run) or ``auto`` (after ``AUTO_RUNS`` runs in a row
with the same key) the graph is compiled in the background (on a host where inductor cannot build
kernels, ``template_compile.compiler_missing``, said once in the log, nothing compiles), and runs
compiled once ready. A template whose numbers keep changing (a learning rate set by a scheduler every
step) builds at most ``VARIANTS_PER_TEMPLATE`` variants: then it stays on the runner, which the log says once.

A run as a graph keeps what the plain run keeps: the argument contracts of its calls run first on the
real inputs (``template_graph.Check``); what every step of the graph makes (``made_bytes``, from the
fake tensors of the variant: a bound on the run's peak) is reserved in the session's budget before the
graph runs, and its work (the plain run's FLOPs) held to the time the program has left; the outputs
and the grads it gives are kept like a step's outputs (``values.store_made``: the element and tensor
limits, the byte ledger), what its autograd graph saves is counted as the runner counts it
(``values.counting_saved``); the time limit is asked first. Where anything of that refuses, the run
goes the plain way, which answers the refusal exactly as a plain run does, at its step. A program
sent with ``detect_anomaly`` runs its templates plainly (the runner marks each call's node). A run
that fails in its kernels runs plainly again when its graph writes into nothing it was given (its
error is then the runner's); one whose graph writes into its inputs cannot be run twice, and answers
the error: as a plain run that failed at a step, what the template changed in place before may be done.

Compiled, the answers agree with the plain way's within torch's own compile tolerance, as
``torch.compile`` agrees with eager torch (inductor reorders and fuses floating-point arithmetic):
``tests/service/engine/test_compiled_templates.py`` compares them with ``torch.testing.assert_close``'s
default tolerances for the dtype (float32: rtol 1.3e-6, atol 1e-5), as inductor's own tests do.
Version counters of the tensors a compiled run writes move once per run, where the plain run (and
the graph run eagerly) moves them once per write: either way a graph that saved the old value
refuses to use it.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Callable

import torch

from remote_autograd.proto import ErrorCode, ProtocolError

from ..sessions.store import CustomTensor, tenant_tag
from ..settings import Settings
from . import step_cost
from .template_compile import COMPILER, Variant, compiler_missing, unfit
from .template_graph import Layout
from .values import store_made

AUTO_RUNS = 3  # auto: runs in a row with the same key before its variant compiles
VARIANTS_PER_TEMPLATE = 4  # variants one template may compile (its numbers keep changing beyond that)
log = logging.getLogger("remote_autograd.service.engine.compiled_templates")
_told_missing = False


def available(settings: Settings) -> bool:
    """Whether templates compile here: the setting (a misspelt one raises) and a C++ compiler for
    inductor (its absence logged once, as the server starts)."""
    mode = settings.compile_mode()
    if mode == "off":
        return False
    missing = compiler_missing()
    if missing is not None:
        global _told_missing
        if not _told_missing:
            _told_missing = True
            log.warning("REMOTE_AUTOGRAD_COMPILE=%s, but %s: templates run uncompiled", mode, missing)
        return False
    return True


def compile_state(settings: Settings) -> str:
    """What ``/healthz`` says: the setting, or ``off`` where templates cannot compile here."""
    return settings.compile_mode() if available(settings) else "off"


def runner_for(settings: Settings, session, template, plain: Callable) -> Callable:
    """The runner of ``template`` in ``session``: ``plain`` (``templates.run_plainly``) or one that runs
    its vouched variants as graphs (see the module's docstring)."""
    if template.regions or not settings.replays():  # torch.func regions run plainly (functorch_regions)
        return plain
    mode = settings.compile_mode() if available(settings) else "off"
    cuda_graphs = settings.cuda_graphs == "on" and session.device.type == "cuda"
    return VariantRunner(plain, mode, tenant_tag(session.owner), session.device, settings.compile_budget_seconds,
                         cuda_graphs)


class VariantRunner:
    """A template's runner: as a graph where its variant has one (compiled once ready), plain otherwise
    (and then building the variant's graph)."""

    def __init__(self, plain: Callable, mode: str, tenant: str, device: torch.device, budget: float,
                 cuda_graphs: bool) -> None:
        self.plain, self.mode, self.tenant, self.device = plain, mode, tenant, device
        self.budget, self.cuda_graphs = budget, cuda_graphs
        self.static: str | None = None  # a digest of the template's steps, canonical (made at its first run)
        self.last: tuple | None = None  # the last run's key, and how many runs in a row had it
        self.streak = 0
        self.built: set[tuple] = set()  # the keys whose graphs this template built
        self.submitted: set[tuple] = set()  # and whose compiles it asked for
        self.told = False

    def __call__(self, run, template, step, bound: list[CustomTensor], scalars: dict, execute) -> None:
        if self.static is None:  # a digest: the steps themselves would be hashed on every run
            self.static = hashlib.blake2b(repr(canonical(template)).encode(), digest_size=16).hexdigest()
        layouts = _layouts(bound)
        key = None if layouts is None else (self.static, layouts, _numbers(scalars), self.device, run.torch_state)
        variant = COMPILER.get(self.tenant, key) if key is not None else None
        ran = _run_graph(run, variant, step, bound) if variant is not None and variant.fn is not None else None
        if ran != RAN:
            flops = run.flops
            self.plain(run, template, step, bound, scalars, execute)  # raises when a step fails: nothing counts
            if ran == CHECK_REFUSED:  # yet the plain run passed: the contract read what the template computes
                unfit(variant, "an argument contract reads a tensor the template computes", self.tenant, template)
            if key is not None and variant is None:
                variant = self._build(key, template, layouts, scalars, run.flops - flops)
        if key is not None:
            self._count(key, template, layouts, scalars, variant)

    def _build(self, key: tuple, template, layouts: tuple, scalars: dict, flops: float):
        """The graph of this key's variant, unless the template has built too many (its numbers keep changing)."""
        if len(self.built) >= VARIANTS_PER_TEMPLATE:
            if not self.told:
                self.told = True
                log.info("template %s (tenant %s): its numbers keep changing (%d variants); it stays on the "
                         "runner", getattr(template.step, "id", "?"), self.tenant, len(self.built))
            return None
        self.built.add(key)
        return COMPILER.graph(self.tenant, key, template, layouts, scalars, self.device, flops)

    def _count(self, key: tuple, template, layouts: tuple, scalars: dict, variant) -> None:
        """A run with ``key``: its variant's compile asked for after enough of them in a row."""
        self.streak = self.streak + 1 if key == self.last else 1
        self.last = key
        if (self.mode == "off" or variant is None or variant.state != "graph" or key in self.submitted
                or self.streak < (1 if self.mode == "on" else AUTO_RUNS)):
            return
        self.submitted.add(key)
        COMPILER.submit(self.tenant, key, template, layouts, scalars, self.device, budget=self.budget,
                        cuda_graphs=self.cuda_graphs)


def canonical(template) -> tuple:
    """The template's steps with each tensor name replaced by its number (inputs first, then in the
    order the steps make them): what two sessions' definitions of one graph have in common."""
    names: dict[str, int] = {name: n for n, name in enumerate(template.inputs)}

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return ("t", names[value]) if value in names else value
        if isinstance(value, dict):
            return tuple((k, walk(v)) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            return tuple(walk(v) for v in value)
        return (type(value).__name__, value) if isinstance(value, (float, bool)) else value

    steps = []
    for step in template.steps:
        made = getattr(step, "out", None) or []
        for name in made:
            names.setdefault(name, len(names))
        steps.append(walk(step.model_dump()))
    return tuple(steps), tuple(walk(list(template.outputs)))


def _layouts(bound: list[CustomTensor]) -> tuple | None:
    """Each bound tensor's ``Layout``; None when two of them share memory (or two grads do): a compiled
    graph assumes its arguments apart, so such a run goes the plain way. A grad that is also bound as
    an input's value (``{grad_of: p}`` beside ``p``) is said in the layout (``grad_bound``)."""
    values: dict[int, int] = {}
    for k, ct in enumerate(bound):
        if ct.value.numel():
            where = ct.value.untyped_storage().data_ptr()
            if where in values:
                return None
            values[where] = k
    grads: set[int] = set()
    out = []
    of = Layout.of
    for ct in bound:
        grad, bound_as = ct.grad, None
        if grad is not None and grad.numel():
            where = grad.untyped_storage().data_ptr()
            bound_as = values.get(where)
            if where in grads:
                return None
            grads.add(where)
        out.append(of(ct.value, grad, bound_as))
    return tuple(out)


def _numbers(scalars: dict) -> tuple:
    """The numbers by value and type (1, 1.0 and True are three variants)."""
    return tuple((name, type(v).__name__, v) for name, v in sorted(scalars.items()))


RAN, REFUSED, CHECK_REFUSED = "ran", "refused", "check"


def _run_graph(run, variant: Variant, step, bound: list[CustomTensor]) -> str:
    """Run ``variant``'s graph (``fn``: eager or compiled) for ``step``: ``RAN``, or where the plain way
    must run instead, ``REFUSED`` (a limit, anomaly detection, or kernels that failed before writing
    anything) or ``CHECK_REFUSED``."""
    session, settings, graph, fn = run.session, run.settings, variant.graph, variant.fn
    watch = run.watch
    if watch is not None:
        watch.check()  # its own error, before anything ran: as the plain run's first step
        if variant.flops > run.untimed and not step_cost.in_time(run, variant.flops):
            return REFUSED  # the plain run stops at the step the time left cannot hold (step_cost.hold)
    if run.forward is not None or len(session.tensors) + len(step.out) > settings.max_tensors_per_session:
        return REFUSED
    values = [ct.value for ct in bound]
    try:
        for check in graph.checks:
            check.run(values)
    except Exception:  # the plain run answers it at its step, with the steps before it done
        return CHECK_REFUSED
    try:
        session.storages.reserve(graph.made_bytes, settings.max_session_bytes)
    except ProtocolError:
        return REFUSED
    try:
        args = values + [bound[k].grad for k in graph.effects.grads_read]
        try:
            with torch.enable_grad():
                results = fn(*args)
        except Exception as exc:
            if not graph.mutates:
                log.info("a run as a graph failed before writing anything; it runs plainly: %s", exc)
                return REFUSED
            way = "as a graph" if fn is graph.module else "compiled"
            raise ProtocolError(ErrorCode.OP_ERROR, f"template {getattr(step, 'template', '?')!r} ({way}): "
                                f"{type(exc).__name__}: {str(exc).strip()[:2000]}") from None
        run.flops += variant.flops
        variant.runs += 1
        outputs = results[:graph.outputs]
        store_made(session, settings, [(tid, CustomTensor(t)) for tid, t in zip(step.out, outputs)])
        _give_grads(session, graph, bound, values, results)
    finally:
        session.storages.unreserve()
    return RAN


def _give_grads(session, graph, bound: list[CustomTensor], values: list, results) -> None:
    """The grads the run gives its inputs, and those it clears (``template_graph.Effects``)."""
    effects = graph.effects
    if not effects.given and not effects.cleared:
        return
    held = {t.untyped_storage().data_ptr() for t in (*values, *(ct.grad for ct in bound if ct.grad is not None))}
    changed = []
    for k, i, fresh in effects.given:
        grad = results[i]
        where = grad.untyped_storage().data_ptr()
        if fresh and where in held:  # autograd_steps._accumulate: never a grad something else holds
            grad = grad.clone(memory_format=torch.contiguous_format)
        held.add(where)
        bound[k].grad = grad
        changed.append(bound[k])
    for k in effects.cleared:
        bound[k].grad = None
        changed.append(bound[k])
    session.storages.remeasure(changed)

"""A template's variants: its graph built at once (run eagerly), then compiled in the background by
inductor through ``compile_fx``; cached per tenant, compiles within a budget of compile seconds per
tenant (``compiled_templates``, ``REMOTE_AUTOGRAD_COMPILE``).

``Compiler.graph`` builds a variant's graph (``template_graph.build``) in the caller's thread, right
after the variant's first plain run: its steps on fake tensors, as long as that run's meta checks
took. From then on the variant runs as that graph, eagerly (``fn`` is the graph's own module).

``compile_fx`` (``torch._inductor.compile_fx``) is what ``torch.compile`` calls with the graph dynamo
captured: AOT autograd traces it (functionalized: writes into inputs become copies back at the
end), inductor generates the kernels (C++ on the CPU, built with the host's compiler; Triton on a
GPU) and, with ``REMOTE_AUTOGRAD_CUDA_GRAPHS=on`` on a CUDA device, launches them as CUDA graphs
(its ``reduce-overhead``: cudagraph trees). It is given example inputs of the variant's layouts
(``template_graph.example_inputs``), never a session's tensors.

One thread per process compiles, one variant at a time (a compile takes seconds to a minute of
CPU): ``Compiler.submit`` never waits, and a run never waits for a compile (the variant runs its
graph eagerly, or the plain way, until its compiled form is ``ready``). The thread touches no
session: it reads the template's steps (fixed once defined) and the variant's layouts and numbers,
and writes only the variant. A tenant's compiles stop once they have taken ``compile_budget_seconds``
in all (the compile that crosses it finishes); a tenant keeps at most ``VARIANTS_PER_TENANT``
variants (the least recently used goes), shared by its sessions: two sessions of one token with the
same template and layouts run one compile.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

import torch

from .template_graph import Layout, TemplateGraph, Unfit, build, example_inputs

VARIANTS_PER_TENANT = 64
log = logging.getLogger("remote_autograd.service.engine.template_compile")


@functools.cache
def compiler_missing() -> str | None:
    """Why inductor cannot build kernels on this host (no C++ compiler, no inductor), or None."""
    try:
        from torch._inductor import cpp_builder

        cpp_builder.get_cpp_compiler()
    except Exception as exc:  # torch's own search raises when none of its candidates runs
        return f"no C++ compiler for inductor ({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]})"
    return None


def compile_graph(graph: TemplateGraph, examples: Sequence[torch.Tensor], *, cuda_graphs: bool) -> Callable:
    """``compile_fx`` of ``graph`` for inputs like ``examples``: a callable taking the same arguments."""
    from torch._inductor.compile_fx import compile_fx  # imports inductor: only where a template compiles

    from torch._functorch import config as aot_config

    patches = {"triton.cudagraphs": True} if cuda_graphs else {}
    module = copy.deepcopy(graph.module)  # compile_fx takes its module over and may change it
    # outputs that require grad: AOT autograd compiles their backward now, here, not at the first backward
    # step through them (which it would make wait for a compile)
    with torch.enable_grad(), aot_config.patch(force_non_lazy_backward_lowering=True):
        return compile_fx(module, list(examples), config_patches=patches)


STATES = ("graph", "compiling", "ready", "failed", "unfit")  # a variant's, in the order of its life


class Variant:
    """One template's graph and compiled form for one set of layouts and numbers. ``state``: ``graph``
    (built; ``fn`` its module, run eagerly), ``compiling`` (``fn`` as it was), ``ready`` (``fn``
    inductor's), ``failed`` (the compile, ``reason``: ``fn`` stays as it was) or ``unfit`` (it runs
    plainly for good, ``reason``). A variant with an ``fn`` runs it; ``flops``: the work of its calls (its plain run's)."""

    __slots__ = ("state", "fn", "graph", "reason", "seconds", "runs", "flops")

    def __init__(self, state: str = "compiling") -> None:
        self.state = state
        self.fn: Callable | None = None
        self.graph: TemplateGraph | None = None
        self.reason = ""
        self.seconds = 0.0
        self.runs = 0  # runs of its fn
        self.flops = 0.0


class _Tenant:
    __slots__ = ("variants", "seconds", "told")

    def __init__(self) -> None:
        self.variants: OrderedDict[tuple, Variant] = OrderedDict()
        self.seconds = 0.0  # compile time spent
        self.told = False  # the log said once that the budget is spent


class Compiler:
    """The process's compiled variants by tenant, and the thread that compiles them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, _Tenant] = {}
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def get(self, tenant: str, key: tuple) -> Variant | None:
        with self._lock:
            found = self._tenants.get(tenant)
            variant = found.variants.get(key) if found is not None else None
            if variant is not None:
                found.variants.move_to_end(key)
            return variant

    def graph(self, tenant: str, key: tuple, template: Any, layouts: Sequence[Layout], scalars: dict,
              device: torch.device, flops: float) -> Variant:
        """The variant's graph, built now in this thread (``graph``, or ``unfit``), kept for the tenant;
        ``flops``: the work its plain run did."""
        variant = Variant("graph")
        try:
            variant.graph = build(template, layouts, scalars, device)
            variant.fn, variant.flops = variant.graph.module, flops
        except Unfit as exc:
            unfit(variant, str(exc), tenant, template)
        except Exception as exc:  # a bug of ours: never the run's error (it succeeded), the runner's way for good
            log.exception("template %s (tenant %s): building its graph raised", _name(template), tenant)
            unfit(variant, f"{type(exc).__name__}: {exc}", tenant, template)
        with self._lock:
            self._keep(self._tenants.setdefault(tenant, _Tenant()), key, variant)
        return variant

    def submit(self, tenant: str, key: tuple, template: Any, layouts: Sequence[Layout], scalars: dict,
               device: torch.device, *, budget: float, cuda_graphs: bool) -> Variant | None:
        """Compile this variant on the compile thread unless it is compiled or under way already (a
        variant that is only a ``graph`` compiles) or the tenant's budget is spent; the variant
        (compiling, or as it was), or None when the budget refuses it."""
        with self._lock:
            found = self._tenants.setdefault(tenant, _Tenant())
            variant = found.variants.get(key)
            if variant is not None and variant.state != "graph":
                return variant
            if found.seconds >= budget:
                if not found.told:
                    found.told = True
                    log.warning("tenant %s: its compile budget (compile_budget_seconds=%s) is spent; its new "
                                "templates run uncompiled", tenant, budget)
                return None
            if variant is None:
                variant = self._keep(found, key, Variant())
            variant.state = "compiling"
            if self._thread is None:
                # a daemon: neither a compile under way nor those queued hold up the process's exit (each may
                # take a minute; a pool's worker would run every queued one first, each failing at shutdown)
                self._thread = threading.Thread(target=self._work, name="remote-autograd-compile", daemon=True)
                self._thread.start()
        # in a copy of the caller's context: inductor's config overrides are context variables
        self._jobs.put(functools.partial(contextvars.copy_context().run, self._compile, found, variant, tenant,
                                         template, tuple(layouts), dict(scalars), device, cuda_graphs))
        return variant

    @staticmethod
    def _keep(found: "_Tenant", key: tuple, variant: Variant) -> Variant:
        found.variants[key] = variant
        found.variants.move_to_end(key)
        while len(found.variants) > VARIANTS_PER_TENANT:
            found.variants.popitem(last=False)
        return variant

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:  # _compile keeps its own failures; anything else must not end the thread
                log.exception("a template's compile raised")

    def _compile(self, found: _Tenant, variant: Variant, tenant: str, template: Any, layouts: tuple,
                 scalars: dict, device: torch.device, cuda_graphs: bool) -> None:
        began = time.perf_counter()
        name = _name(template)
        graph = variant.graph
        if graph is None:
            try:
                graph = build(template, layouts, scalars, device)
            except Unfit as exc:
                unfit(variant, str(exc), tenant, template)
                return
        try:
            fn = compile_graph(graph, example_inputs(layouts, graph.effects.grads_read, device),
                               cuda_graphs=cuda_graphs)
        except Exception as exc:  # inductor's own failure (a compiler missing, a lowering it lacks)
            variant.reason, variant.state = f"{type(exc).__name__}: {exc}", "failed"
            log.warning("template %s (tenant %s): compiling it failed; it runs uncompiled: %s", name, tenant,
                        variant.reason[:2000])
            return
        finally:
            seconds = time.perf_counter() - began
            with self._lock:
                found.seconds += seconds
            variant.seconds = seconds
        if variant.state != "compiling":  # a run found it unfit meanwhile (compiled_templates)
            return
        variant.graph = graph
        variant.fn = fn  # after graph: a run that finds an fn finds its graph
        variant.state = "ready"
        log.info("template %s (tenant %s) compiled in %.1f s", name, tenant, seconds)

    def figures(self) -> dict:
        """What this process's variants came to: their number by state, the runs of their graphs (eager
        or compiled), the compile seconds spent."""
        with self._lock:
            states: dict[str, int] = {}
            runs = 0
            for found in self._tenants.values():
                for variant in found.variants.values():
                    states[variant.state] = states.get(variant.state, 0) + 1
                    runs += variant.runs
            return {"variants": states, "runs": runs,
                    "seconds": round(sum(t.seconds for t in self._tenants.values()), 1)}

    def wait(self, timeout: float | None = None) -> None:
        """Until every compile submitted so far has ended (tests, the bench)."""
        if self._thread is not None:
            done = threading.Event()
            self._jobs.put(done.set)
            if not done.wait(timeout):
                raise TimeoutError(f"the compiles submitted did not end in {timeout} s")


def unfit(variant: Variant, reason: str, tenant: str, template: Any) -> None:
    """``variant`` runs on the runner for good (its graph and compiled form let go), and the log says why."""
    variant.fn, variant.reason, variant.state = None, reason, "unfit"
    log.info("template %s (tenant %s) runs on the runner: %s", _name(template), tenant, reason)


def _name(template: Any) -> str:
    return getattr(getattr(template, "step", None), "id", "?")


COMPILER = Compiler()

"""Prometheus metrics of one app, in a registry of its own (tests run several apps per process).

Counters and histograms are updated as requests and steps finish; the gauges
(programs in flight, sessions, tensors, bytes held, device memory) are read from the store when
``/metrics`` is scraped, so keeping them costs nothing between scrapes. Labels are
bounded: route templates (not paths), standard methods, and op names that ran
(a step that failed, e.g. an unknown op, is not observed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import torch
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..engine import template_compile
from ..step_histogram import OP_BUCKETS, StepHistogram

if TYPE_CHECKING:
    from ..engine.guards import ProgramSlots
    from ..sessions.store import SessionStore

CONTENT_TYPE = CONTENT_TYPE_LATEST
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_PROGRAM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """The app's metrics; ``op_seconds`` (a ``StepHistogram``) is where the runner puts each step's time.

    ``render()`` is everything, for the operator; ``render(owner)`` what one tenant may see: its own
    sessions, tensors, bytes and programs in flight, nothing of another token's (no server totals,
    no op names, no request counts: each would show other tenants' work).
    """

    def __init__(self, store: "SessionStore | None", slots: "ProgramSlots | None" = None,
                 figures: "StoreFigures | None" = None) -> None:
        in_flight: Callable[[], int] = (lambda: slots.busy) if slots is not None else (lambda: 0)
        self._figures = figures or StoreFigures(store)  # where the gauges come from (a process per tenant: its own)
        self._slots = slots
        self.registry = CollectorRegistry()
        self._requests = Counter("remote_autograd_requests", "HTTP requests by route template, method and status",
                                 ("route", "method", "status"), registry=self.registry)
        self.program_seconds = Histogram("remote_autograd_program_seconds", "time to run one program (in a worker)",
                                         buckets=_PROGRAM_BUCKETS, registry=self.registry)
        op_seconds = StepHistogram("remote_autograd_op_seconds", "time of one successful step, by op or step kind",
                                  OP_BUCKETS)
        self.registry.register(op_seconds)
        self.op_seconds = op_seconds
        self.registry.register(_StoreCollector(self._figures, in_flight))

    def request_counter(self, route: str, method: str, status: int):
        """The requests counter of these labels (``method``: one of ``METHODS``, or ``OTHER``), to ``inc()``
        per request; the ``Gatekeeper`` keeps the ones it has used."""
        return self._requests.labels(route, method, str(status))

    async def refresh(self) -> None:
        """Before a scrape: the figures that live in other processes (a process per tenant) fetched."""
        await self._figures.refresh(self)

    def render(self, owner: str | None = None, *, everything: bool = True) -> bytes:
        if everything:
            return generate_latest(self.registry)
        registry = CollectorRegistry()  # a few gauges, made per scrape: a tenant's scrapes are rare
        registry.register(_TenantCollector(self._figures, self._slots, owner))
        return generate_latest(registry)


class StoreFigures:
    """What the gauges read, from a store at scrape time (a Ray front holds none: no figures)."""

    def __init__(self, store: "SessionStore | None") -> None:
        self._store = store

    async def refresh(self, metrics: Metrics) -> None:
        pass  # read live at scrape time

    def totals(self) -> dict | None:
        """Sessions, tensors, bytes held and device memory of the whole server, with ``max_total_bytes``,
        and what its templates' variants came to (``compile``: ``Compiler.figures``)."""
        if self._store is None:
            return None
        sessions, device = self._store.sessions(), self._store.device
        return {"sessions": len(sessions), "tensors": sum(len(s.tensors) for s in sessions),
                "bytes": self._store.budget.held, "limit": self._store.budget.limit,
                "device_memory": torch.cuda.memory_allocated(device) if device.type == "cuda" else 0,
                "compile": template_compile.COMPILER.figures()}

    def of(self, owner: str | None) -> dict | None:
        """The same for ``owner``'s sessions, with ``max_bytes_per_token``."""
        if self._store is None:
            return None
        sessions = [s for s in self._store.sessions() if s.owner == owner]
        budget = self._store.token_budgets.get(owner)
        return {"sessions": len(sessions), "tensors": sum(len(s.tensors) for s in sessions),
                "bytes": budget.held if budget is not None else 0, "limit": self._store.settings.max_bytes_per_token}


class _StoreCollector(Collector):
    """The server's gauges at scrape time (a Ray front: only programs in flight)."""

    def __init__(self, figures: StoreFigures, in_flight: Callable[[], int]) -> None:
        self._figures, self._in_flight = figures, in_flight

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("remote_autograd_programs_in_flight", "programs admitted and not yet answered",
                                value=self._in_flight())
        totals = self._figures.totals()
        if totals is None:
            return
        yield GaugeMetricFamily("remote_autograd_sessions", "live sessions", value=totals["sessions"])
        yield GaugeMetricFamily("remote_autograd_tensors", "tensors held by all sessions", value=totals["tensors"])
        yield GaugeMetricFamily("remote_autograd_bytes_held",
                                "bytes held by all sessions (the storages of their values, grads and saved graphs)",
                                value=totals["bytes"])
        yield GaugeMetricFamily("remote_autograd_max_total_bytes", "limit max_total_bytes", value=totals["limit"])
        yield GaugeMetricFamily("remote_autograd_device_memory_allocated_bytes",
                                "torch.cuda.memory_allocated on the server's device (0 on cpu)",
                                value=totals["device_memory"])
        yield from _compile_families(totals["compile"])


def _compile_families(figures: dict) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    """The templates' variants by state (``template_compile.STATES``; REMOTE_AUTOGRAD_COMPILE) and the compile
    time they took: whether a compiled step runs compiled yet, and what compiling cost."""
    variants = GaugeMetricFamily("remote_autograd_template_variants", "variants of the sessions' templates by state: "
                                 "graph (run as their graph), compiling, ready (compiled), failed, unfit (plain)",
                                 labels=["state"])
    for state in template_compile.STATES:
        variants.add_metric([state], figures["variants"].get(state, 0))
    yield variants
    yield CounterMetricFamily("remote_autograd_template_compile_seconds", "time spent compiling templates (inductor)",
                              value=figures["seconds"])


class _TenantCollector(Collector):
    """One token's own figures (none but programs in flight on a Ray front, which holds no sessions)."""

    def __init__(self, figures: StoreFigures, slots: "ProgramSlots | None", owner: str | None) -> None:
        self._figures, self._slots, self._owner = figures, slots, owner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held = self._slots.held_by(self._owner) if self._slots is not None else 0
        yield GaugeMetricFamily("remote_autograd_token_programs_in_flight",
                                "this token's programs admitted and not yet answered", value=held)
        mine = self._figures.of(self._owner)
        if mine is None:
            return
        yield GaugeMetricFamily("remote_autograd_token_sessions", "this token's live sessions", value=mine["sessions"])
        yield GaugeMetricFamily("remote_autograd_token_tensors", "tensors held by this token's sessions",
                                value=mine["tensors"])
        yield GaugeMetricFamily("remote_autograd_token_bytes_held", "bytes held by this token's sessions",
                                value=mine["bytes"])
        yield GaugeMetricFamily("remote_autograd_max_bytes_per_token", "limit max_bytes_per_token",
                                value=mine["limit"])

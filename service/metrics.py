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
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .step_histogram import StepHistogram

if TYPE_CHECKING:
    from .guards import ProgramSlots
    from .store import SessionStore

CONTENT_TYPE = CONTENT_TYPE_LATEST
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_PROGRAM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_OP_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5)


class Metrics:
    """The app's metrics; ``observe_step(op, seconds)`` is the runner's per-step hook.

    ``render()`` is everything, for the operator; ``render(owner)`` what one tenant may see: its own
    sessions, tensors, bytes and programs in flight, nothing of another token's (no server totals,
    no op names, no request counts: each would show other tenants' work).
    """

    def __init__(self, store: "SessionStore | None", slots: "ProgramSlots | None" = None) -> None:
        in_flight: Callable[[], int] = (lambda: slots.busy) if slots is not None else (lambda: 0)
        self._store, self._slots = store, slots
        self.registry = CollectorRegistry()
        self._requests = Counter("remote_autograd_requests", "HTTP requests by route template, method and status",
                                 ("route", "method", "status"), registry=self.registry)
        self.program_seconds = Histogram("remote_autograd_program_seconds", "time to run one program (in a worker)",
                                         buckets=_PROGRAM_BUCKETS, registry=self.registry)
        op_seconds = StepHistogram("remote_autograd_op_seconds", "time of one successful step, by op or step kind",
                                  _OP_BUCKETS)
        self.registry.register(op_seconds)
        self.observe_step = op_seconds.observe  # bound directly: it runs once per step of every program
        self.registry.register(_StoreCollector(store, in_flight))
        self._request_children: dict = {}

    def count_request(self, route: str, method: str, status: int) -> None:
        key = (route, method if method in _METHODS else "OTHER", status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self._requests.labels(key[0], key[1], str(status))
        child.inc()

    def render(self, owner: str | None = None, *, everything: bool = True) -> bytes:
        if everything:
            return generate_latest(self.registry)
        registry = CollectorRegistry()  # a few gauges, made per scrape: a tenant's scrapes are rare
        registry.register(_TenantCollector(self._store, self._slots, owner))
        return generate_latest(registry)


class _StoreCollector(Collector):
    """Gauges read from the store at scrape time (a Ray front holds no store: only programs in flight)."""

    def __init__(self, store: "SessionStore | None", in_flight: Callable[[], int]) -> None:
        self._store, self._in_flight = store, in_flight

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("remote_autograd_programs_in_flight", "programs admitted and not yet answered",
                                value=self._in_flight())
        if self._store is None:
            return
        sessions = self._store.sessions()
        yield GaugeMetricFamily("remote_autograd_sessions", "live sessions", value=len(sessions))
        yield GaugeMetricFamily("remote_autograd_tensors", "tensors held by all sessions",
                                value=sum(len(s.tensors) for s in sessions))
        yield GaugeMetricFamily("remote_autograd_bytes_held", "bytes of values and grads held by all sessions",
                                value=self._store.budget.held)
        yield GaugeMetricFamily("remote_autograd_max_total_bytes", "limit max_total_bytes",
                                value=self._store.budget.limit)
        device = self._store.device
        used = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        yield GaugeMetricFamily("remote_autograd_device_memory_allocated_bytes",
                                "torch.cuda.memory_allocated on the server's device (0 on cpu)", value=used)


class _TenantCollector(Collector):
    """One token's own figures (the store's part is absent on a Ray front, which holds no sessions)."""

    def __init__(self, store: "SessionStore | None", slots: "ProgramSlots | None", owner: str | None) -> None:
        self._store, self._slots, self._owner = store, slots, owner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held = self._slots.held_by(self._owner) if self._slots is not None else 0
        yield GaugeMetricFamily("remote_autograd_token_programs_in_flight",
                                "this token's programs admitted and not yet answered", value=held)
        if self._store is None:
            return
        sessions = [s for s in self._store.sessions() if s.owner == self._owner]
        budget = self._store.token_budgets.get(self._owner)
        yield GaugeMetricFamily("remote_autograd_token_sessions", "this token's live sessions", value=len(sessions))
        yield GaugeMetricFamily("remote_autograd_token_tensors", "tensors held by this token's sessions",
                                value=sum(len(s.tensors) for s in sessions))
        yield GaugeMetricFamily("remote_autograd_token_bytes_held", "bytes held by this token's sessions",
                                value=budget.held if budget is not None else 0)
        yield GaugeMetricFamily("remote_autograd_max_bytes_per_token", "limit max_bytes_per_token",
                                value=self._store.settings.max_bytes_per_token)

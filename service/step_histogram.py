"""``StepHistogram``: the histogram of step times by op, as plain counts under one lock.

A speed path. The plain path it stands in for is a prometheus_client ``Histogram`` with an
``op`` label (``Histogram(...).labels(op).observe(seconds)``), which takes two locked
counters and a loop over the buckets per observation. Here a step's time costs the runner one
``list.append`` of ``(op, seconds)`` to ``pending`` (atomic: no lock, no call of ours on the step's
path); ``fold`` counts them into their buckets under one lock with a bisect each, when a scrape
reads the counts and whenever ``FOLD_AT`` wait (the runner asks after each program: the list stays
bounded on a server nobody scrapes). It shows in ``make bench``'s ``[latency]`` line "SDK pipelined:
x + y amortised over a chain of ..." (many steps per request).
``tests/service/engine/test_fast_paths.py`` (``test_step_histogram_renders_like_prometheus_histogram``)
checks it renders what that ``Histogram`` renders for the same observations.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from typing import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# Step times run from a few microseconds (an elementwise op) to seconds (a big matmul on CPU).
OP_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5)
FOLD_AT = 4096  # step times waiting in ``pending`` before the runner has them folded in


class StepHistogram(Collector):
    """Step times by op, rendered as a prometheus_client ``Histogram`` with an ``op`` label would be."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self._name, self._doc = name, doc
        self._bounds = tuple(float(b) for b in buckets)
        self._lock = threading.Lock()
        self._rows: dict[str, list] = {}  # op -> [count per bucket (the last one +Inf)..., sum, created]
        # (op, seconds) of each step that succeeded, appended by the runner (any thread) and not counted yet
        self.pending: list[tuple[str, float]] = []

    def fold(self) -> None:
        """Count the ``pending`` step times into their rows (those appended meanwhile wait for the next fold)."""
        with self._lock:
            pending = self.pending
            count = len(pending)  # the first ``count`` only: a runner may append while this runs
            batch = pending[:count]
            del pending[:count]
            bounds, rows, now = self._bounds, self._rows, time.time()
            for op, seconds in batch:
                row = rows.get(op)
                if row is None:
                    row = rows[op] = [0] * (len(bounds) + 1) + [0.0, now]
                row[bisect.bisect_left(bounds, seconds)] += 1  # the first bucket whose bound is >= seconds ("le")
                row[-2] += seconds

    def rows(self) -> dict[str, list]:
        """Each op's counts by bucket, sum and creation time (a tenant's worker process hands them to its front)."""
        self.fold()
        with self._lock:
            return {op: list(row) for op, row in self._rows.items()}

    def absorb(self, rows: dict[str, list]) -> None:
        """Add the counts and sums of ``rows`` (another histogram's, over the same buckets) to these."""
        with self._lock:
            for op, row in rows.items():
                mine = self._rows.get(op)
                if mine is None:
                    mine = self._rows[op] = [0] * (len(self._bounds) + 1) + [0.0, row[-1]]
                for i, value in enumerate(row[:-1]):
                    mine[i] += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        rows = self.rows()
        family = HistogramMetricFamily(self._name, self._doc, labels=("op",))
        bounds = [floatToGoString(b) for b in (*self._bounds, math.inf)]
        for op, row in rows.items():
            counts, total, created = row[:-2], row[-2], row[-1]
            family.add_metric([op], list(zip(bounds, itertools.accumulate(counts))), total)
            family.add_sample(f"{self._name}_created", {"op": op}, created)
        yield family

"""Where a pipelined training step's time goes, read off real steps: the client, the request, the worker.

The client's part of a step is its wall time less the time its requests wait for their answers'
heads (``_hot.Tap.spent``): building and queueing the steps, encoding the program, reading the
answer. Divided by the number of steps the training step queued (counted in the programs it sent),
that is the client's cost per queued step. The server's part comes from each answer's
``Server-Timing`` (the worker's time, and the steps' time within it). The steps are timed with
``sess.run_ahead`` off: a compiled step's answer would otherwise come before its backward and
optimizer ran, which no answer's timing holds then (the next request waits for them, and its wait
would read as HTTP time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from . import _hot
from ._util import summary


@dataclass
class StepParts:
    """The median of ``repeat`` steps (seconds), and the client's part per queued step of each step."""

    total: float
    request: float
    worker: float
    steps: float
    queued: float  # steps per training step, as sent
    client_per_queued: list[float]

    @property
    def client(self) -> float:
        return self.total - self.request


def queued_steps(tap: _hot.Tap, step: Callable[[], object], repeat: int = 3) -> float:
    """Steps the SDK sends per call of ``step`` (every program's steps, the frees included)."""
    with _hot.recording(tap) as programs:
        for _ in range(repeat):
            step()
        return sum(len(p["steps"]) for p in programs()) / repeat


def step_parts(sess, tap: _hot.Tap, step: Callable[[], object], repeat: int = 20) -> StepParts:
    """Time ``repeat`` calls of ``step`` on a session whose transport is ``tap``."""
    queued = queued_steps(tap, step)  # counted on steps of their own: recording costs the client time
    timed = []
    ahead, sess.run_ahead = sess.run_ahead, False
    try:
        step()  # (the last step run ahead is waited for here, not in the first timed one)
        for _ in range(repeat):
            t0, spent_before = time.perf_counter(), tap.spent
            step()
            timed.append((time.perf_counter() - t0, tap.spent - spent_before, sess._transport.last_server_timing))
    finally:
        sess.run_ahead = ahead
    per_queued = [(total - request) / queued for total, request, _ in timed]
    timed.sort(key=lambda t: t[0])
    total, request, timing = timed[len(timed) // 2]  # the server's timing of that same step
    return StepParts(total, request, timing.get("worker", 0.0) / 1e3, timing.get("steps", 0.0) / 1e3,
                     queued, per_queued)


def print_breakdown(parts: StepParts) -> None:
    request_us, worker_us = parts.request * 1e6, parts.worker * 1e6
    print(f"  {'breakdown (median step)':<48} client building {parts.client * 1e6:6.0f} us | request "
          f"{request_us:6.0f} us = HTTP+event loop {request_us - worker_us:6.0f} us + worker {worker_us:6.0f} us "
          f"(steps {parts.steps * 1e6:6.0f} us)")


def print_client_cost(parts: StepParts) -> None:
    med, p90 = summary(parts.client_per_queued)
    print(f"  {'client us per queued step, median':<48} median {med:9.1f} us   p90 {p90:9.1f} us  "
          f"({parts.queued:.0f} steps queued per training step; target <= 10 us)")


def breakdown(sess, tap: _hot.Tap, step: Callable[[], object]) -> StepParts:
    """Print where a median step's time goes; return the parts."""
    parts = step_parts(sess, tap, step)
    print_breakdown(parts)
    return parts

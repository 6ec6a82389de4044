"""``WorkerThreads``: the threads that run torch work, each fed by its own queue.

A session's programs always run on the same thread: autograd orders the nodes of a
backward by per-thread sequence numbers, so a session whose programs ran on
different threads could sum gradients in another order (eager != pipelined bitwise).
One queue and one future per hop (``run_in_executor`` over one-thread executors adds a
second future and its callbacks), and an eager op pays a hop.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from typing import Any, Callable, Iterable

_STOP = None


class WorkerThreads:
    """``await workers.run(i, fn, *args)`` calls ``fn(*args)`` on thread ``i``, with the caller's context.

    ``run`` is a plain function that returns the future to await, not a coroutine: a coroutine
    would be one more frame suspended on the hop, resumed when the answer comes."""

    def __init__(self, count: int, name: str = "remote-autograd") -> None:
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count)]
        self._threads = [threading.Thread(target=_serve, args=(q,), name=f"{name}-{i}", daemon=True)
                         for i, q in enumerate(self._queues)]
        for thread in self._threads:
            thread.start()

    def __len__(self) -> int:
        return len(self._queues)

    def least_loaded(self, assigned: Iterable[int]) -> int:
        """The thread with the fewest of the ``assigned`` (one index per live session); the lowest on ties.

        Sessions that come one after another then share one thread. Each thread that runs
        torch gets an OpenMP team of its own, and once the teams hold more threads than
        there are cores, libgomp stops spinning between parallel ops and every op wakes
        sleeping threads: a training step took 1.7x longer on 2 cores with two teams.
        """
        counts = [0] * len(self._queues)
        for index in assigned:
            counts[index] += 1
        return counts.index(min(counts))

    def run(self, index: int, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """A future of the result of ``fn(*args)`` run on thread ``index`` (awaiting it raises its exception)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queues[index].put((loop, future, contextvars.copy_context(), fn, args))
        return future

    def shutdown(self) -> None:
        """Let each thread finish what it was given, then stop it."""
        for q in self._queues:
            q.put(_STOP)
        for thread in self._threads:
            thread.join()


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not _STOP:
        _run_job(*job)
        job = None  # the wait for the next job must not keep this one's objects alive


def _run_job(loop: asyncio.AbstractEventLoop, future: asyncio.Future, context: contextvars.Context,
             fn: Callable[..., Any], args: tuple) -> None:
    try:
        setter, value = _set_result, context.run(fn, *args)
    except BaseException as exc:  # handed to the awaiting coroutine, which raises it
        setter, value = _set_exception, exc
    try:
        loop.call_soon_threadsafe(setter, future, value)
    except RuntimeError:  # the loop closed while the job ran: nobody waits for it any more
        pass


def _set_result(future: asyncio.Future, result: Any) -> None:
    if not future.cancelled():
        future.set_result(result)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.cancelled():
        future.set_exception(exc)

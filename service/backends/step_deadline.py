"""``StepDeadline``: a step that runs too long, or past its client's leaving, is stopped by ending its tenant's worker.

The time limit (``max_program_seconds``, ``engine/program_watch.py``) and a client's
disconnect stop a program between steps; nothing can stop a kernel midway (a 497 s
``conv2d`` of two expanded tensors held its thread and session to its end). The cost
check refuses most such steps before they run; this is the backstop. The front arms one
timer per program call: at ``max_program_seconds + step_grace_seconds`` after the call,
and ``step_grace_seconds`` after its client leaves. When it fires, the front asks the
worker where the program is (``where``: ``ProgramWatch.position``):

- done (its answer is on its way), or still waiting behind its session's other programs
  (a client gone: the worker drops it when it would start): nothing, or the timer again;
- running a step, and the program started less than the limit and the grace ago (and its
  client is there): the timer again, for what is left;
- running a step past that, or no answer within ``step_grace_seconds`` (a step that
  holds the interpreter also stops the worker's event loop): the worker is killed
  (SIGKILL). Its sessions, all of them, answer ``410 session_lost``, the program's own
  answer names the step (``error.step``, ``error.op``), so the SDK raises at the user's
  line of that op, and the token's next session gets a new worker.

Nothing is asked of a program answered before its deadline: one timer, armed and cancelled.
"""

from __future__ import annotations

import asyncio

from remote_autograd.proto import ErrorCode, ProtocolError

from ..engine.program_watch import ProgramWatch
from ..settings import Settings
from .tenant_channel import ChannelClosed
from .tenant_spawn import WorkerProcess


class StepDeadline:
    """The deadline of one program call ``tag`` to ``worker``; ``error`` once it ended the worker."""

    __slots__ = ("worker", "tag", "limit", "grace", "left_at", "error", "_timer", "_asking")

    def __init__(self, worker: WorkerProcess, tag: int, settings: Settings, watch: ProgramWatch | None) -> None:
        self.worker, self.tag = worker, tag
        self.limit, self.grace = settings.max_program_seconds, settings.step_grace_seconds
        self.left_at: float | None = None  # when its client left (the loop's clock)
        self.error: ProtocolError | None = None
        self._asking: asyncio.Task | None = None
        self._timer = asyncio.get_running_loop().call_later(self.limit + self.grace, self._fire)
        if watch is not None:
            watch.on_cancel(self._client_left)

    def close(self) -> None:
        """The call ended (answered, failed or cancelled): nothing more to watch."""
        self._timer.cancel()
        if self._asking is not None:
            self._asking.cancel()

    def _client_left(self) -> None:
        loop = asyncio.get_running_loop()
        self.left_at = loop.time()
        self._timer.cancel()
        self._timer = loop.call_later(self.grace, self._fire)

    def _fire(self) -> None:
        self._asking = asyncio.ensure_future(self._ask())

    def _again(self, seconds: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(max(seconds, 0.05), self._fire)

    async def _ask(self) -> None:
        try:
            where, _ = await asyncio.wait_for(self.worker.channel.call("where", {"tag": self.tag}),
                                              max(self.grace, 1.0))
        except ChannelClosed:
            return  # it ended on its own: the call sees that
        except (asyncio.TimeoutError, ProtocolError):
            where = {"running": True}  # no answer: its event loop is held (a step that keeps the interpreter)
        if where.get("done"):
            return
        if not where.get("running"):  # queued: a client gone never starts it; the limit counts from its start
            self._again(self.grace if self.left_at is not None else self.limit + self.grace)
            return
        seconds = where.get("seconds")
        if self.left_at is None and isinstance(seconds, (int, float)) and seconds < self.limit + self.grace:
            self._again(self.limit + self.grace - seconds)
            return
        self._end(where, seconds)

    def _end(self, where: dict, seconds) -> None:
        step, op = where.get("step"), where.get("op")
        step = step if isinstance(step, int) and step >= 0 else None
        named = f"step {step} ({op})" if step is not None and isinstance(op, str) else "a step (its worker did not say which)"
        if self.left_at is not None:
            why = (f"{named} was still running {self.grace:g} s after its client disconnected "
                   f"(limit step_grace_seconds={self.grace:g})")
        else:
            into = f", {seconds:.0f} s into its program," if isinstance(seconds, (int, float)) else ""
            why = (f"{named} was still running{into} past the time limit max_program_seconds={self.limit:g} "
                   f"and step_grace_seconds={self.grace:g}")
        reason = f"was ended (SIGKILL) because {why}: a step cannot be stopped midway"
        self.error = ProtocolError(ErrorCode.SESSION_LOST, "", step=step, op=op if step is not None else None)
        self.worker.end(reason)

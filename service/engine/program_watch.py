"""``ProgramWatch``: whether a running program must stop, checked by the runner between steps.

A program stops at the next step boundary once it has run ``max_program_seconds``
(``time_limit``; a call whose cost, known before it runs, is more than the time left is worth
does not start either: ``step_cost.hold``) or once its client has gone (``cancelled``: the
program route hears ASGI's ``http.disconnect`` while it runs). A step is never interrupted: the steps before
the boundary stay done and the answer says where it stopped, as for any failing step
(DESIGN principle 3). That answer is kept by program id like any other, so a retry of
the same program is answered from it and never runs the done steps twice.

``cancel`` is called on the event loop and ``check`` on a worker thread; a bool set once
and only ever read is all they share. The runner starts the clock as the steps begin, and its step
loop asks ``check`` only when it must (cancelled, or past the limit: tested in the loop itself),
keeping ``index`` and ``op`` itself: a watch costs a program's steps no call. ``position`` (read on
the event loop) says which step is running and for how long: a tenant's worker tells its front, which
ends the worker when one step outlives the limit (``service/backends/step_deadline.py``): a step itself
cannot be stopped.
"""

from __future__ import annotations

from time import perf_counter
from typing import Callable

from remote_autograd.proto import ErrorCode, ProtocolError


class ProgramWatch:
    """The time limit and the cancel flag of one program; its clock starts at its first step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cancelled = False
        self.started: float | None = None  # when its steps began (set by the runner, or by ``check``)
        self._on_cancel: list[Callable[[], None]] = []
        self.index: int | None = None  # the step running now (set before it runs), and its op (or kind)
        self.op: str | None = None
        self.finished = False  # its steps are over (set by the runner, on the thread that ran them)

    def cancel(self) -> None:
        """Stop the program at its next step boundary (and tell whoever asked: ``on_cancel``)."""
        if self.cancelled:
            return
        self.cancelled = True
        for callback in self._on_cancel:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when cancelled (at once if it already is): a backend whose program runs
        elsewhere (a Ray worker) passes the cancel on."""
        if self.cancelled:
            callback()
        else:
            self._on_cancel.append(callback)

    def left(self) -> float:
        """Seconds the program has left (all of them before its first step)."""
        if self.started is None:
            return self.seconds
        return self.seconds - (perf_counter() - self.started)

    def check(self, index: int | None = None, step=None) -> None:
        """Before step ``index``: ``cancelled`` or ``time_limit`` if the program must stop here. (Only the
        step's name is kept: the step itself may hold a big body's bytes.)"""
        self.index = index
        self.op = None if step is None else step.op if step.kind == "call" else step.kind
        now = perf_counter()
        if self.started is None:
            self.started = now
        if self.cancelled:
            raise ProtocolError(ErrorCode.CANCELLED, "the client disconnected while the program ran: it stopped "
                                "before this step; the steps before it stay done")
        if now - self.started > self.seconds:
            raise ProtocolError(ErrorCode.TIME_LIMIT, f"the program ran {now - self.started:.3g} s: limit "
                                f"max_program_seconds={self.seconds}; it stopped before this step, the steps "
                                "before it stay done")

    @property
    def running(self) -> bool:
        """On its thread: started and not finished (a caller that stops waiting does not stop it)."""
        return self.started is not None and not self.finished

    def position(self) -> dict:
        """Where the program is: ``done``; or not ``running`` while it waits behind its session's other
        programs; else ``seconds`` since its first step, the step running (``step``, ``op``: its op, or
        its kind)."""
        if self.finished:
            return {"done": True}
        if self.started is None:
            return {"running": False}
        return {"running": True, "seconds": perf_counter() - self.started, "step": self.index, "op": self.op}

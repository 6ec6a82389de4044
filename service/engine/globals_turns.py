"""``TURNS``: each program runs under its client's process-global torch settings (``Program.torch_globals``).

torch keeps the default dtype, deterministic algorithms, the float32 matmul precision and cuDNN's
flags per process (``proto/torch_globals.py``), and the server runs many sessions' programs at once
on its worker threads: setting them around one program would change them under the others. So
programs take *turns*: those that ask for the state the process holds run together; one that asks
for another waits until the running ones are done, and once one waits, later programs queue
behind it (none waits for ever). Then the state is switched for it and for every waiting program
that asks for the same, and switched back once the last of them is done.

A server whose clients keep torch's defaults never switches: each program takes and gives back
one uncontended lock, and reads the process's state when it is the only one running (nothing
per step). Reading it then, not once at start, keeps the app exact inside a client's own process
(``InProcessTransport``), whose user may change the settings between programs: their own are what
a switch gives back.

The meta check's memo answers by the state it ran under (an integer tensor's ``sqrt`` holds 4 or
8 bytes an element): each state has its own (``meta_check.use_memo``), and a session's plans are
keyed by the state too (``runner.run_steps``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto import torch_globals

from . import meta_check

log = logging.getLogger("remote_autograd.service.engine.globals_turns")


class _Waiter:
    __slots__ = ("state", "event", "error")

    def __init__(self, state: tuple) -> None:
        self.state, self.event, self.error = state, threading.Event(), None


class GlobalsTurns:
    """``enter(state)`` before a program's first step, ``leave()`` after its last (always, in a ``finally``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._state: tuple | None = None  # what the running programs run under
        self._own: tuple | None = None  # what the process held before this turn switched it (None: not switched)
        self._waiting: deque[_Waiter] = deque()

    def enter(self, state: tuple) -> None:
        with self._lock:
            if not self._waiting:
                if not self._running:
                    self._begin(state)  # raises, running nothing, when torch refuses the state
                    self._running = 1
                    return
                if state == self._state:
                    self._running += 1
                    return
            waiter = _Waiter(state)
            self._waiting.append(waiter)
        waiter.event.wait()  # admitted: counted as running, the state switched (or refused)
        if waiter.error is not None:
            raise waiter.error

    def leave(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running:
                return
            self._end()
            while self._waiting:
                state = self._waiting[0].state
                admitted = [w for w in self._waiting if w.state == state]
                self._waiting = deque(w for w in self._waiting if w.state != state)
                try:
                    self._begin(state)
                except ProtocolError as exc:
                    for waiter in admitted:
                        waiter.error = exc
                        waiter.event.set()
                    continue
                self._running = len(admitted)
                for waiter in admitted:
                    waiter.event.set()
                return

    def _begin(self, state: tuple) -> None:
        """A turn begins (nothing runs): the process is made to hold ``state``."""
        own = torch_globals.read()
        self._state = state
        meta_check.use_memo(state)
        if own == state:
            return
        self._own = own
        try:
            torch_globals.apply(state)
        except (RuntimeError, TypeError, ValueError) as exc:
            self._end()
            raise ProtocolError(ErrorCode.OP_ERROR, f"torch_globals: the server's torch refused them: {exc}") from None

    def _end(self) -> None:
        """The last program of a turn is done: the process gets back what it held before."""
        if self._own is not None:
            own, self._own = self._own, None
            torch_globals.apply(own)
        self._state = None


TURNS = GlobalsTurns()

"""``max_total_bytes`` across tenant worker processes: the front's ``BytePool`` and each worker's ``GrantedBudget``.

With a worker process per tenant, no process sees every session's bytes, yet the
server-wide limit must hold exactly. The front owns the limit as a pool; each worker
holds a grant from it and charges its sessions' bytes against the grant as a single
server charges them against the limit (``store.Budget``). A worker whose grant runs
short asks the front for more (``grant_bytes``, one round trip, blocking only the
worker thread whose step needs the bytes); the front gives it at least what it needs
or nothing. So the sum of the grants never passes ``max_total_bytes`` and no worker
holds more than its grant: the bound is exact, not eventually consistent.

Asks are rare: a grant comes in chunks (``grant_chunk``: a 64th of the limit, at
least 16 MiB), and a worker keeps up to two chunks of slack before it returns the
rest (``return_bytes``, without waiting). When the pool is short the front first
takes back every other worker's slack (``return_slack``), so a refusal means the
tenants really hold the bytes. ``max_bytes_per_token`` is the worker's own limit (its
sessions are one token's). A worker that dies gives its whole grant back (its memory
went with it).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from remote_autograd.proto import ErrorCode, ProtocolError

from ..sessions.store import Budget

_MIN_CHUNK = 16 << 20
_ASK_SECONDS = 30.0


def grant_chunk(total: int) -> int:
    return min(total, max(_MIN_CHUNK, total // 64))


class BytePool:
    """The front's side: what each worker (by key) was granted of ``total``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.grants: dict[str, int] = {}

    @property
    def free(self) -> int:
        return self.total - sum(self.grants.values())

    def grant(self, key: str, need: int, want: int) -> int:
        """At least ``need`` bytes (up to ``want``) for worker ``key``, or 0 when the pool is short."""
        free = self.free
        if need <= 0 or free < need:
            return 0
        given = min(want, free)
        self.grants[key] = self.grants.get(key, 0) + given
        return given

    def give_back(self, key: str, nbytes: int) -> None:
        held = self.grants.get(key, 0)
        self.grants[key] = max(0, held - max(0, nbytes))

    def forget(self, key: str) -> None:
        """Worker ``key`` is gone: its grant is free again."""
        self.grants.pop(key, None)


class GrantedBudget(Budget):
    """A worker's share of ``max_total_bytes``: a ``Budget`` whose limit is the front's grant, grown on demand.

    ``ask(need, want)`` asks the front for more and answers what it granted (it blocks: it is
    called from the worker thread running the step); ``give_back(n)`` returns bytes without waiting.
    """

    def __init__(self, total: int, ask: Callable[[int, int], int], give_back: Callable[[int], None]) -> None:
        super().__init__(0)
        self.total, self.chunk = total, grant_chunk(total)
        self._ask, self._give_back = ask, give_back
        self._asking = threading.Lock()  # one ask at a time: a second thread short of bytes waits, then retries

    def take(self, nbytes: int, anyway: bool = False) -> None:
        try:
            return super().take(nbytes)
        except ProtocolError:
            pass
        with self._asking:
            with self._lock:
                need = self.held + nbytes - self.limit
            if need > 0:
                granted = self._ask(need, max(need, self.chunk))
                with self._lock:
                    self.limit += granted
        try:
            return super().take(nbytes)
        except ProtocolError:
            if anyway:  # bytes that exist already (a grown storage): counted past the grant, never lost
                return super().take(nbytes, anyway=True)
            raise ProtocolError(ErrorCode.TOO_LARGE, f"the server would hold {self.held + nbytes} bytes or more "
                                f"across every tenant's sessions: limit max_total_bytes={self.total}") from None

    def give(self, nbytes: int) -> None:
        super().give(nbytes)
        with self._lock:
            surplus = self.limit - self.held - self.chunk
            if surplus < self.chunk:  # keep up to two chunks of slack: the next steps need no ask
                return
            self.limit -= surplus  # lowered before the front hears of it: the sum stays within the pool
        self._give_back(surplus)

    def release_slack(self) -> int:
        """Every byte granted and not held, handed back now (the front reclaims it for another worker)."""
        with self._lock:
            slack = max(0, self.limit - self.held)
            self.limit -= slack
        return slack


def asker(loop: asyncio.AbstractEventLoop, ask: Callable[[int, int], "asyncio.Future"]) -> Callable[[int, int], int]:
    """A blocking ``ask`` for ``GrantedBudget`` from the coroutine ``ask(need, want)`` run on ``loop``.

    Called on the loop's own thread it cannot wait for the loop, so it grants nothing there
    (charges happen on worker threads: steps run there)."""
    def blocking(need: int, want: int) -> int:
        if loop.is_closed() or _on_loop_thread(loop):
            return 0
        try:
            return asyncio.run_coroutine_threadsafe(ask(need, want), loop).result(_ASK_SECONDS)
        except Exception:  # the front is gone or slow: refuse this charge, the next one asks again
            return 0

    return blocking


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False

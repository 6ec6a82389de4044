"""``TokenLedger``: what each token holds on each Ray worker, so ``max_bytes_per_token`` holds cluster-wide.

One named detached actor per cluster. Every worker reports the bytes each token holds on
it (after a program that changed them, at most every ``REPORT_GAP_SECONDS``, and every
``REPORT_SECONDS`` anyway) and gets back
what those tokens hold on the other workers; it charges new bytes against the limit minus
that (``Budget.elsewhere``). A worker that stops reporting for ``STALE_SECONDS`` is taken
for dead and its bytes stop counting (its sessions are lost with it).

The view is as fresh as the last report: two workers growing one token's sessions at the
same moment can together pass the limit by what they add before they hear of each other
(one report round trip). Checking every byte against one actor would put a cluster-wide
round trip into every op; this keeps ops local.

If the ledger's node dies, the next report makes a new ledger (``get_if_exists``), which
the workers' reports fill again within ``REPORT_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError

if TYPE_CHECKING:
    from ..sessions.store import SessionStore

log = logging.getLogger("remote_autograd.service")

LEDGER_NAME = "token-ledger"
REPORT_SECONDS = 1.0
REPORT_GAP_SECONDS = 0.2  # reports after programs are at least this far apart: eager ops stay local
STALE_SECONDS = 10.0


class TokenLedger:
    """Bytes by token, by worker, as last reported."""

    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, dict[Any, int]]] = {}  # worker key -> (when, {token: bytes})

    def report(self, worker: str, held: dict[Any, int]) -> dict[Any, int]:
        """Record ``worker``'s bytes by token; answer what every token holds on the other live workers."""
        now = time.monotonic()
        self._reports[worker] = (now, held)
        elsewhere: dict[Any, int] = {}
        for key, (when, theirs) in list(self._reports.items()):
            if now - when > STALE_SECONDS:
                del self._reports[key]
            elif key != worker:
                for token, nbytes in theirs.items():
                    elsewhere[token] = elsewhere.get(token, 0) + nbytes
        return elsewhere


class LedgerReports:
    """A worker's side: reports its tokens' bytes and sets each token budget's ``elsewhere``."""

    def __init__(self, worker: str, store: "SessionStore") -> None:
        self.worker, self.store = worker, store
        self._ledger: Any = None
        self._last: tuple | None = None
        self._reported_at = 0.0
        self._pending: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None

    def start(self) -> None:
        """Report every ``REPORT_SECONDS`` (from the worker's running event loop)."""
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._every())

    def soon(self) -> None:
        """Report if the bytes changed since the last report: at once, or ``REPORT_GAP_SECONDS`` after
        the last one (one report at a time)."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.create_task(self._report_after_gap())

    async def _report_after_gap(self) -> None:
        await asyncio.sleep(max(0.0, self._reported_at + REPORT_GAP_SECONDS - time.monotonic()))
        await self.report(only_if_changed=True)

    async def report(self, only_if_changed: bool = False) -> None:
        budgets = list(self.store.token_budgets.items())
        held = {token: budget.held for token, budget in budgets if budget.held}
        state = (held, len(budgets))  # a token new here needs to hear what it holds elsewhere too
        if only_if_changed and state == self._last:
            return
        try:
            if self._ledger is None:
                self._ledger = await asyncio.to_thread(_ledger_actor)
            elsewhere = await self._ledger.report.remote(self.worker, held)
        except RayActorError:  # the ledger's node died: the next report makes a new one
            self._ledger = None
            return
        self._last, self._reported_at = state, time.monotonic()
        for token, budget in list(self.store.token_budgets.items()):
            budget.elsewhere = elsewhere.get(token, 0)

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            try:
                await self.report()
            except Exception:  # never let the heartbeat die: the next round tries again
                log.exception("token ledger report failed")


def _ledger_actor() -> Any:
    return ray.remote(TokenLedger).options(name=LEDGER_NAME, lifetime="detached", get_if_exists=True,
                                           num_cpus=0).remote()

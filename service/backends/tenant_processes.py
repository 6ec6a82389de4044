"""``TenantProcesses``: the backend with a worker process per tenant (a token), so tenants never share an address space.

The routes speak to it as to ``LocalSessions`` (ids and bytes). This front holds no
tensors: each token's sessions live in a ``tenant_worker`` process of their own (the
default for every server, one token or none too), started on the token's first session
(on a server of one tenant, at once) and stopped once the token has had no session for
``tenant_idle_seconds``. Calls go over ``tenant_channel``'s protocol; a program's
body crosses as the bytes that arrived, and its answer comes back encoded by the worker.

Routing is by the caller, never by the id: a token's calls reach only its own worker,
whatever session id they name, so another token's ids are unknown (404) there as on a
single server. A session id starts with its worker's prefix (``<prefix>.``): an id of a
worker of this token that died answers ``410 session_lost``; the token's next session
gets a new worker. A crash (a kernel's SIGSEGV, an abort) ends only that process: every
other tenant goes on as if nothing happened. So does a step that outlives the time limit
or its client: the front ends its worker (``step_deadline``).

Server-wide limits hold across the workers: programs are admitted here
(``max_concurrent_programs``, one ``ProgramSlots`` for all), sessions are counted here
(``max_sessions``: an upper bound of what the workers hold, refreshed from them before a
refusal), and bytes are granted from ``max_total_bytes`` (``byte_grants``). Per-token
limits are each worker's own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from contextlib import asynccontextmanager
from pathlib import Path
from time import perf_counter
from typing import AsyncIterator

import msgpack

from remote_autograd.proto import ErrorCode, ProtocolError

from ..engine import compiled_templates
from ..engine.guards import ProgramSlots
from ..engine.program_watch import ProgramWatch
from ..logs import LIFECYCLE
from ..settings import Settings
from .byte_grants import BytePool
from .protocol import EncodedAnswer
from .state_volume import tenant_dir  # the state volume's layout: one directory per tenant
from .step_deadline import StepDeadline
from .tenant_channel import ChannelClosed
from .tenant_spawn import WorkerProcess

log = logging.getLogger("remote_autograd.service")
lifecycle = logging.getLogger(LIFECYCLE)

_ASK_ABOVE_BYTES = 1 << 20  # a smaller body costs less to read than a round trip to its worker
_LOST_REMEMBERED = 64  # per token: prefixes of its dead workers, answered 410 rather than 404


class Tenant:
    """One token: its live worker (or None) and what its dead workers held."""

    def __init__(self, label: str, state_dir: Path | None) -> None:
        self.label, self.state_dir = label, state_dir
        self.worker: WorkerProcess | None = None
        self.starting: asyncio.Task | None = None
        self.lost: OrderedDict[str, WorkerProcess] = OrderedDict()  # id prefix -> the dead worker that held it

    def lose(self, worker: WorkerProcess) -> None:
        if self.worker is worker:
            self.worker = None
        for prefix in worker.prefixes:
            self.lost[prefix] = worker
        while len(self.lost) > _LOST_REMEMBERED:
            self.lost.popitem(last=False)

    def has_saved_state(self) -> bool:
        return self.state_dir is not None and self.state_dir.is_dir()


class TenantProcesses:
    """Sessions in one worker process per token; this front routes, admits and counts."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slots = ProgramSlots.of(settings)
        self.pool = BytePool(settings.max_total_bytes)
        self.observe_program = lambda seconds: None
        root = Path(settings.state_dir) if settings.state_dir else None
        owners = settings.tokens or (None,)
        # labels name a token by its place in the settings: the token itself appears in no process list or log
        self._tenants = {owner: Tenant(f"tenant-{i}" if owner is not None else "tenant-open",
                                       tenant_dir(root, owner) if root else None)
                         for i, owner in enumerate(owners)}
        self._reaper: asyncio.Task | None = None
        self._tags = itertools.count()  # each program call's, for the worker to say where it is (step_deadline)

    # -- life of the backend ---------------------------------------------------------------

    def start(self) -> None:
        """Reap idle workers from now on. A server of one tenant (one token, or none) starts its worker
        now: its first session would otherwise wait for a process to import torch."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever())
            if len(self._tenants) == 1:
                asyncio.ensure_future(self._start_early(next(iter(self._tenants.values()))))

    async def _start_early(self, tenant: Tenant) -> None:
        try:
            await self._worker(tenant)
        except ProtocolError as exc:  # its first session tries again, and says why if it fails too
            log.error("%s", exc.message)

    async def close(self) -> None:
        """After the last request: each worker saves its sessions (with a state directory), then stops
        (one still starting first finishes its start)."""
        if self._reaper is not None:
            self._reaper.cancel()
        starting = [t.starting for t in self._tenants.values() if t.starting is not None]
        await asyncio.gather(*starting, return_exceptions=True)
        workers = [t.worker for t in self._tenants.values() if t.worker is not None]
        await asyncio.gather(*(self._stop(w, save=self.settings.state_dir != "") for w in workers))

    def health(self) -> dict:
        return {"device": str(self.settings.resolved_device()), "cuda_graphs": self.settings.cuda_graphs,
                "compile": compiled_templates.compile_state(self.settings)}

    async def readiness(self) -> tuple[bool, dict]:
        """Ready with the device a live worker checks; with none live, ready (a worker checks its device when it starts)."""
        live = [t.worker for t in self._tenants.values() if t.worker is not None]
        base = {"device": str(self.settings.resolved_device()), "tenant_workers": len(live)}
        if not live:
            return True, {"status": "ready", **base}
        try:
            fields, _ = await live[0].channel.call("readiness")  # (a probe is not the tenant's activity)
        except (ChannelClosed, ProtocolError) as exc:
            return False, {"status": "unavailable", **base, "detail": str(exc)}
        return bool(fields.get("ready")), {**fields.get("body", {}), **base}

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, owner: str | None) -> dict:
        tenant = self._tenant(owner)
        await self._check_session_room()
        for _ in range(2):  # a worker that dies while making the session: once more, on a new one
            worker = await self._worker(tenant)
            worker.creating += 1
            try:
                fields, _ = await worker.call("create_session")
            except ChannelClosed:
                continue
            finally:
                worker.creating -= 1
            worker.sessions += 1
            return fields
        raise ProtocolError(ErrorCode.TOO_MANY, "this token's worker process ended while making the session: retry")

    async def describe_session(self, sid: str, owner: str | None) -> dict:
        fields, _ = await self._ask(sid, owner, "describe_session", {"sid": sid})
        return fields

    async def delete_session(self, sid: str, owner: str | None) -> None:
        worker = await self._route(sid, owner)
        await self._call(worker, sid, "delete_session", {"sid": sid})
        worker.sessions = max(0, worker.sessions - 1)

    async def read_tensor(self, sid: str, owner: str | None, tid: str, *, value: bool, grad: bool,
                          as_json: bool) -> dict:
        _, message = await self._ask(sid, owner, "read_tensor",
                                     {"sid": sid, "tid": tid, "value": value, "grad": grad, "as_json": as_json})
        return msgpack.unpackb(message, raw=False)

    # -- work ------------------------------------------------------------------------------

    async def check_session(self, sid: str, owner: str | None, body_bytes: int | None) -> None:
        """404/410 before the body is read: an id of none of the caller's workers; for a body bigger than
        ``_ASK_ABOVE_BYTES`` (or of unknown length), whether the worker holds the session."""
        worker = await self._route(sid, owner)
        if body_bytes is None or body_bytes > _ASK_ABOVE_BYTES:
            await self._call(worker, sid, "describe_session", {"sid": sid})

    @asynccontextmanager
    async def answer_program(self, sid: str, owner: str | None, body, ctype: str | None, accept: str | None,
                             watch: ProgramWatch | None = None, found: None = None) -> AsyncIterator[EncodedAnswer]:
        """The body goes to the worker as it came; its answer comes back encoded, as bytes of its own
        (nothing of the session's is held while the caller sends it). A cancelled ``watch`` (the
        client went away) or caller cancels the program's task in the worker: it stops at its next
        step there (the worker's own watch keeps the time limit). A step still running past the
        limit, or past its client's leaving, ends the worker (``step_deadline``)."""
        worker = await self._route(sid, owner)
        self.slots.take(sid, owner)
        try:
            start = perf_counter()
            fields, answer = await self._run(worker, sid, {"sid": sid, "ctype": ctype, "accept": accept}, body, watch)
            hop = perf_counter() - start
            self.observe_program(hop)
        finally:
            self.slots.give(sid, owner)
        yield EncodedAnswer(fields["status"], fields["media_type"], [answer], len(answer), fields["steps"], hop)

    async def _run(self, worker: WorkerProcess, sid: str, fields: dict, body, watch: ProgramWatch | None):
        """The ``program`` call, its deadline watched (``step_deadline``): 410 naming the step if it ended the worker."""
        fields["tag"] = tag = next(self._tags)
        deadline = StepDeadline(worker, tag, self.settings, watch)
        watching = False
        try:
            return await worker.call("program", fields, body, watch=watch)
        except ChannelClosed:
            await worker.ended()
            raise _lost(sid, worker, deadline.error) from None
        except ProtocolError as exc:
            watching = exc.code is ErrorCode.CANCELLED  # the worker stopped waiting: its step may run on
            raise
        finally:
            if not watching:
                deadline.close()

    # -- routing ---------------------------------------------------------------------------

    def _tenant(self, owner: str | None) -> Tenant:
        tenant = self._tenants.get(owner)
        if tenant is None:  # the Gatekeeper lets only configured tokens (or None without tokens) through
            raise ProtocolError(ErrorCode.UNAUTHORIZED, "missing or invalid bearer token")
        return tenant

    async def _route(self, sid: str, owner: str | None) -> WorkerProcess:
        """The caller's worker, if it holds ``sid``; 410 if a dead worker of the caller's held it; else 404."""
        tenant = self._tenant(owner)
        prefix = sid.partition(".")[0]
        if prefix in tenant.lost:
            dead = tenant.lost[prefix]
            await dead.ended()
            raise _lost(sid, dead)
        worker = tenant.worker
        # sessions saved by the last run: restore them first. A worker already starting may have restored
        # them (and removed the directory) before its hello's answer names them: wait for that answer too
        if worker is None and (tenant.starting is not None or tenant.has_saved_state()):
            worker = await self._worker(tenant)
        if worker is None or prefix not in worker.prefixes:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {sid!r}")
        return worker

    async def _ask(self, sid: str, owner: str | None, name: str, fields: dict) -> tuple[dict, bytes]:
        return await self._call(await self._route(sid, owner), sid, name, fields)

    async def _call(self, worker: WorkerProcess, sid: str, name: str, fields: dict, body=b"",
                    watch: ProgramWatch | None = None) -> tuple[dict, bytes]:
        try:
            return await worker.call(name, fields, body, watch=watch)
        except ChannelClosed:
            await worker.ended()
            raise _lost(sid, worker) from None

    async def _worker(self, tenant: Tenant) -> WorkerProcess:
        """The tenant's live worker, started (and its saved sessions restored) if it has none."""
        if tenant.worker is not None and not tenant.worker.gone:
            return tenant.worker
        if tenant.starting is None:
            tenant.starting = asyncio.ensure_future(self._start(tenant))
        try:
            return await asyncio.shield(tenant.starting)
        finally:
            if tenant.starting is not None and tenant.starting.done():
                tenant.starting = None

    async def _start(self, tenant: Tenant) -> WorkerProcess:
        owner = next(o for o, t in self._tenants.items() if t is tenant)
        worker = await WorkerProcess.start(owner, tenant.label, self.settings, tenant.state_dir,
                                           handlers_for=self._handlers_for, on_end=self._ended)
        tenant.worker = worker
        return worker

    def _ended(self, worker: WorkerProcess) -> None:
        """A worker's channel closed: its bytes are free; unless it was stopped on purpose, its sessions are lost."""
        self.pool.forget(worker.key)
        tenant = self._tenants[worker.owner]
        if worker.stopped:  # (idle: its sessions all expired or were deleted; or saved, the front stopping)
            if tenant.worker is worker:
                tenant.worker = None
            return
        tenant.lose(worker)
        asyncio.ensure_future(_log_loss(worker))

    async def figures(self) -> list[tuple[str | None, str, dict]]:
        """``(owner, worker key, figures)`` of each live worker, for /metrics (not the tenant's activity)."""
        live = [(owner, t.worker) for owner, t in self._tenants.items() if t.worker is not None]
        answers = await asyncio.gather(*(w.channel.call("figures") for _, w in live), return_exceptions=True)
        return [(owner, w.key, answer[0]) for (owner, w), answer in zip(live, answers)
                if not isinstance(answer, BaseException)]

    # -- the workers' calls to the front ---------------------------------------------------

    def _handlers_for(self, worker: WorkerProcess) -> dict:
        async def grant_bytes(call) -> None:
            need, want = int(call.fields["need"]), int(call.fields["want"])
            granted = self.pool.grant(worker.key, need, want)
            if not granted and need > 0:  # short: take back the slack of the others, then try again
                await self._reclaim(worker)
                granted = self.pool.grant(worker.key, need, want)
            await call.answer({"bytes": granted})

        async def return_bytes(call) -> None:
            self.pool.give_back(worker.key, int(call.fields["bytes"]))

        return {"grant_bytes": grant_bytes, "return_bytes": return_bytes}

    async def _reclaim(self, asking: WorkerProcess) -> None:
        others = [t.worker for t in self._tenants.values() if t.worker is not None and t.worker is not asking]
        answers = await asyncio.gather(*(w.call("return_slack") for w in others), return_exceptions=True)
        for worker, answer in zip(others, answers):
            if not isinstance(answer, BaseException):
                self.pool.give_back(worker.key, int(answer[0].get("bytes", 0)))

    # -- limits and idle workers -----------------------------------------------------------

    async def _check_session_room(self) -> None:
        """429 at ``max_sessions`` across every worker (counted here; refreshed from the workers before refusing)."""
        limit = self.settings.max_sessions
        if self._sessions_held() >= limit:
            await self._refresh_loads()
            if self._sessions_held() >= limit:
                raise ProtocolError(ErrorCode.TOO_MANY, f"too many sessions: limit max_sessions={limit}")

    def _sessions_held(self) -> int:
        return sum(t.worker.sessions + t.worker.creating for t in self._tenants.values() if t.worker is not None)

    async def _refresh_loads(self) -> None:
        workers = [t.worker for t in self._tenants.values() if t.worker is not None]
        # on the channel itself: asking is not the tenant's activity (WorkerProcess.call marks it busy)
        answers = await asyncio.gather(*(w.channel.call("load") for w in workers), return_exceptions=True)
        for worker, answer in zip(workers, answers):
            if not isinstance(answer, BaseException):
                # An absolute count: the creates and deletes answered before it are in it (one ordered
                # socket), those answered after it adjust it as they arrive.
                worker.sessions = int(answer[0]["sessions"])

    async def _reap_forever(self) -> None:
        """Stop each worker whose token has had no session for ``tenant_idle_seconds``."""
        idle = self.settings.tenant_idle_seconds
        while True:
            await asyncio.sleep(min(self.settings.sweep_interval_seconds, max(idle / 2, 0.05)))
            try:
                await self._refresh_loads()
                now = time.monotonic()
                for tenant in self._tenants.values():
                    worker = tenant.worker
                    if worker is None or worker.sessions or worker.creating or worker.channel.in_flight:
                        if worker is not None:
                            worker.last_busy = now
                        continue
                    if now - worker.last_busy >= idle:
                        tenant.worker = None  # from here on, a new session starts a new worker
                        asyncio.ensure_future(self._stop(worker, save=False))
            except Exception:  # never let the reaper die: the next round tries again
                log.exception("tenant worker reaping failed")

    async def _stop(self, worker: WorkerProcess, *, save: bool) -> None:
        try:
            if save:
                fields, _ = await worker.call("save_state")
                lifecycle.info("%s: %s session(s) saved for the next start", self._tenants[worker.owner].label,
                               fields.get("sessions"))
        except (ChannelClosed, ProtocolError) as exc:
            log.error("%s: its sessions could not be saved: %s", self._tenants[worker.owner].label, exc)
        await worker.stop()


async def _log_loss(worker: WorkerProcess) -> None:
    await worker.ended()
    log.error("%s's worker process %s: its sessions are lost; other tenants go on", worker.label,
              worker.how_it_ended())


def _lost(sid: str, worker: WorkerProcess, at: ProtocolError | None = None) -> ProtocolError:
    """410 for ``sid`` of a dead ``worker``; ``at``: the step (and op) of this program that ended it."""
    return ProtocolError(ErrorCode.SESSION_LOST,
                         f"session {sid} is lost: its tenant's worker process {worker.how_it_ended()}; other tenants' "
                         "sessions go on. Open a new session and upload your tensors again (from your last checkpoint)",
                         step=at.step if at else None, op=at.op if at else None)

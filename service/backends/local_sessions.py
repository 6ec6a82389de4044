"""``LocalSessions``: the in-process backend of the ``SessionBackend`` seam (the default).

The routes speak to a backend in ids and bytes: create a session, describe it, delete
it, answer a program's body, read a tensor. This one keeps the sessions in this
process (``SessionStore``) and runs their torch work on ``WorkerThreads``; the Ray
backend (``ray_sessions``) places sessions in worker actors, and each worker actor
runs one of these. So both backends run programs with the same code, and keep the
same per-session guarantees: one program of a session at a time (its ``gate`` and
``lock``), its generator, its limits, atomic steps and idempotent program ids.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from contextlib import asynccontextmanager
from functools import partial
from time import perf_counter
from typing import AsyncIterator

import torch

from remote_autograd.proto import PROTOCOL_VERSION

from remote_autograd.proto.codec import wants_msgpack

from .. import __version__
from ..engine import compiled_templates
from ..engine.answers import encode_answer
from ..engine.guards import ProgramSlots, admit_program
from ..engine.program_watch import ProgramWatch
from ..engine.runner import read_tensor, run_pending, run_program
from ..sessions.store import Session, SessionStore
from ..settings import Settings
from ..step_histogram import StepHistogram
from .protocol import EncodedAnswer
from .workers import WorkerThreads

log = logging.getLogger("remote_autograd.service")


class LocalSessions:
    """Sessions of this process. ``name`` and ``node`` say where they live (``GET /v1/sessions/{id}``)."""

    def __init__(self, settings: Settings, *, id_prefix: str = "", name: str = "in-process",
                 node: str | None = None) -> None:
        self.settings = settings
        self.store = SessionStore(settings, id_prefix=id_prefix)
        self.workers = WorkerThreads(settings.resolved_workers())  # each session always on the same one
        self.slots = ProgramSlots.of(settings)
        self.name, self.node = name, node or socket.gethostname()
        self.observe_program = lambda seconds: None  # the front's program-time histogram, when it has one
        self.on_step: StepHistogram | None = None  # the step-time histogram, when there is one
        self._sweeper: asyncio.Task | None = None

    # -- life of the backend ---------------------------------------------------------------

    def start(self) -> None:
        """Free idle sessions every ``sweep_interval_seconds`` (from a running event loop)."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(_sweep_forever(self.store, self.settings.sweep_interval_seconds))

    async def close(self) -> None:
        """After the last request: stop the sweeper and let the worker threads finish."""
        self.shutdown()

    def shutdown(self) -> None:
        """``close`` from outside an event loop (a worker process's last act, tests)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.workers.shutdown()

    def health(self) -> dict:
        return {"device": str(self.store.device), "cuda_graphs": self.settings.cuda_graphs,
                "compile": compiled_templates.compile_state(self.settings)}

    async def readiness(self) -> tuple[bool, dict]:
        try:
            torch.ones(1, device=self.store.device).add_(1)
        except Exception as exc:  # the device is not usable: say so, do not crash
            return False, {"status": "unavailable", "detail": str(exc)}
        return True, {"status": "ready", "device": str(self.store.device)}

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, owner: str | None) -> dict:
        session = self.store.create(owner)
        session.worker = self.workers.least_loaded(s.worker for s in self.store.sessions() if s is not session)
        device = self.store.device
        cuda = device.type == "cuda"
        return {
            "session_id": session.id,
            "protocol": PROTOCOL_VERSION,
            "device": str(device),
            "server_version": __version__,
            "gpu_name": torch.cuda.get_device_name(device) if cuda else None,
            "gpu_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
            "limits": self.settings.limits(),
        }

    async def describe_session(self, sid: str, owner: str | None) -> dict:
        session = self.store.get(sid, owner)
        return {"session_id": sid, "tensors": len(session.tensors), "bytes": session.bytes_held,
                "worker": self.name, "node": self.node}

    async def delete_session(self, sid: str, owner: str | None) -> None:
        session = self.store.get(sid, owner)
        await self.workers.run(session.worker, self.store.delete, sid, owner)

    async def load(self, owner: str | None) -> dict:
        return self.store.load(owner)

    # -- work ------------------------------------------------------------------------------

    async def check_session(self, sid: str, owner: str | None, body_bytes: int | None) -> Session:
        """404/410 for an id ``owner`` holds no session under, before a byte of its body is read; the
        session, for ``answer_program``'s ``found``."""
        return self.store.get(sid, owner)

    @asynccontextmanager
    async def answer_program(self, sid: str, owner: str | None, body, ctype: str | None, accept: str | None,
                             watch: ProgramWatch | None = None, found: Session | None = None
                             ) -> AsyncIterator[EncodedAnswer]:
        """Decode, check and run one program's ``body`` in session ``sid``; its answer, encoded, for
        the caller to send inside the ``async with``. Until then the session runs no other program:
        a big fetched tensor goes out as a view of the session's own memory, which the next
        program could write. ``watch`` stops it between steps (the route cancels it when its
        client disconnects); without one, the time limit still holds, and a cancelled
        ``async with`` (the Ray front's ``ray.cancel``) stops it too. ``found``: the session
        ``check_session`` returned for this request (one deleted or expired since is found closed
        when the program runs: 404, or 410 once expired), else it is looked up here."""
        session = found if found is not None else self.store.get(sid, owner)
        program, key = await admit_program(body, ctype, self.settings)  # key: what identifies it for retries
        watch = watch or ProgramWatch(self.settings.max_program_seconds)
        as_msgpack = wants_msgpack(accept, ctype)
        self.slots.take(session.id, owner)  # admitted: queued behind the session's earlier programs, then running
        try:
            await session.gate.acquire()  # this session's programs queue here, not in the workers
            try:
                start = perf_counter()
                outcome = await self.workers.run(session.worker, partial(
                    run_program, session, program, key, not as_msgpack, self.settings, observe=self.on_step,
                    watch=watch))
            except BaseException:
                watch.cancel()  # cancelled while it runs: it stops at its next step
                session.gate.release()
                raise
            worker = perf_counter() - start
            self.observe_program(worker)
        finally:
            self.slots.give(session.id, owner)
        try:  # the slot is free (the program ran); the gate is held until the answer is sent
            media_type, parts, total = encode_answer(outcome.body, as_msgpack, accept)
            yield EncodedAnswer(outcome.status, media_type, parts, total, outcome.seconds, worker)
        finally:
            try:
                if session.pending is not None:  # answered early: the rest runs now, before any other program
                    await self.workers.run(session.worker, run_pending, session)
            finally:
                session.gate.release()

    async def read_tensor(self, sid: str, owner: str | None, tid: str, *, value: bool, grad: bool,
                          as_json: bool) -> dict:
        session = self.store.get(sid, owner)
        return await self.workers.run(session.worker, lambda: read_tensor(
            session, tid, value=value, grad=grad, as_json=as_json))


async def _sweep_forever(store: SessionStore, interval: float) -> None:
    """Free idle sessions every ``interval`` seconds, so their memory returns even if nobody calls."""
    while True:
        await asyncio.sleep(interval)
        try:
            store.sweep()
        except Exception:  # never let the sweeper die: the next round tries again
            log.exception("session sweep failed")

"""``SessionWorker``: the Ray actor that holds one tenant's sessions on one device slot (a GPU, or a worker slot).

It runs the in-process backend (``LocalSessions``): the same store, runner, op table,
worker threads and per-session guarantees as a single server. It is an async actor, so
many sessions' programs wait on its event loop while torch runs on its threads, and a
session's programs keep running on one thread (see ``service.backends.workers``).

What crosses to the front is plain data: ids, request bodies as bytes (Ray moves big
arguments and results through its object store, not through our codec), encoded
answers as bytes. A ``ProtocolError`` comes back as ``("error", wire dict)`` rather than
raised: the front re-raises it as the same 4xx the in-process server answers.

Session ids start with ``<key>.<incarnation>.``: any front finds the worker from the
``key`` (the device slot, then the tenant's tag; the actor is named ``worker-<key>``), and an id from an earlier actor of the
same name (its process died and the front made a new one) is answered ``session_lost``.
"""

from __future__ import annotations

import secrets
from typing import Any, Awaitable, Callable

import ray

from remote_autograd.proto import ErrorCode, ProtocolError

from ..gc_freeze import freeze_startup_objects
from ..ops import load_configured_ops
from ..settings import Settings
from .local_sessions import LocalSessions
from .token_ledger import LedgerReports

WORKER_PREFIX = "worker-"


def worker_name(key: str) -> str:
    return WORKER_PREFIX + key


class SessionWorker:
    """One tenant's sessions on one device slot; every method answers ``("ok", value)`` or ``("error", wire error)``."""

    def __init__(self, settings: Settings, key: str) -> None:
        load_configured_ops(settings.op_modules, test_ops=settings.test_ops)
        self.prefix = f"{key}.{secrets.token_hex(3)}."
        self.sessions = LocalSessions(settings, id_prefix=self.prefix, name=worker_name(key),
                                      node=ray.get_runtime_context().get_node_id())
        self.reports = LedgerReports(key, self.sessions.store)  # max_bytes_per_token across workers
        freeze_startup_objects()  # the actor's process serves this tenant's sessions from here on

    async def ping(self) -> str:
        return self.sessions.name

    async def load(self, owner: str | None) -> tuple:
        return await self._answer(lambda: self.sessions.load(owner))

    async def create_session(self, owner: str | None) -> tuple:
        return await self._answer(lambda: self.sessions.create_session(owner))

    async def describe_session(self, sid: str, owner: str | None) -> tuple:
        return await self._answer(lambda: self.sessions.describe_session(self._own(sid), owner))

    async def delete_session(self, sid: str, owner: str | None) -> tuple:
        return await self._answer(lambda: self.sessions.delete_session(self._own(sid), owner))

    async def answer_program(self, sid: str, owner: str | None, body: bytes, ctype: str | None,
                             accept: str | None) -> tuple:
        """The program's answer as ``(status, media type, body bytes, steps seconds, worker seconds)``."""
        async def joined() -> tuple:  # the answer's bytes copied out while the session is still held
            async with self.sessions.answer_program(self._own(sid), owner, body, ctype, accept) as answer:
                return (answer.status, answer.media_type, b"".join(answer.parts), answer.steps_seconds,
                        answer.worker_seconds)

        return await self._answer(joined)

    async def read_tensor(self, sid: str, owner: str | None, tid: str, value: bool, grad: bool,
                          as_json: bool) -> tuple:
        return await self._answer(
            lambda: self.sessions.read_tensor(self._own(sid), owner, tid, value=value, grad=grad, as_json=as_json))

    def _own(self, sid: str) -> str:
        """``sid`` if this actor made it; ``session_lost`` if an earlier actor of this name did."""
        if not sid.startswith(self.prefix):
            raise ProtocolError(ErrorCode.SESSION_LOST,
                                f"session {sid} was held by an earlier run of {self.sessions.name}, which died: "
                                "its tensors are lost")
        return sid

    async def _answer(self, work: Callable[[], Awaitable[Any]]) -> tuple:
        self.sessions.start()  # the sweeper needs the actor's running loop: started on the first call
        self.reports.start()
        try:
            return "ok", await work()
        except ProtocolError as exc:
            return "error", exc.to_wire()
        finally:
            self.reports.soon()

"""``SessionBackend``: what the HTTP layer asks of wherever sessions live; ``EncodedAnswer``, what it gets.

Three backends implement it: ``LocalSessions`` (this process), ``TenantProcesses`` (a worker
process per token, each running a ``LocalSessions``) and ``RaySessions`` (worker actors, each
running a ``LocalSessions``). The routes see only this; ``tests/service/backends/test_backends.py``
checks that each backend's methods have these names, parameters and kinds (async or not).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Callable, NamedTuple, Protocol

from ..engine.guards import ProgramSlots
from ..engine.program_watch import ProgramWatch


class EncodedAnswer(NamedTuple):
    """A program's answer (``sessions.store.ProgramAnswer``) as a backend hands it to the route, encoded:
    status, media type, body parts and where the time went. A named tuple, made once per program
    without an ``__init__`` of ours to run."""

    status: int
    media_type: str
    parts: list
    total: int
    steps_seconds: float  # in the program's steps
    worker_seconds: float  # queued behind the session and running, as the backend saw it


class SessionBackend(Protocol):
    slots: ProgramSlots  # program slots in all, per session and per token (admission's last check)
    observe_program: Callable[[float], None]  # the front's program-time histogram

    def start(self) -> None:
        """From the running event loop, before the first request (sweepers, reapers)."""

    async def close(self) -> None:
        """After the last request (workers save their sessions where a state volume is set)."""

    def health(self) -> dict:
        """What ``/healthz`` adds to its body (the device)."""

    async def readiness(self) -> tuple[bool, dict]:
        """Whether ``/readyz`` answers ready, and its body."""

    async def create_session(self, owner: str | None) -> dict:
        """A new session of ``owner``'s (429 past the token's or the server's sessions); its description."""

    async def describe_session(self, sid: str, owner: str | None) -> dict:
        """``GET /v1/sessions/{sid}``; 404 for an id ``owner`` holds no session under."""

    async def delete_session(self, sid: str, owner: str | None) -> None:
        """Free the session and every byte it holds."""

    async def check_session(self, sid: str, owner: str | None, body_bytes: int | None) -> Any:
        """404/410 before a byte of a program's body is read; what ``answer_program`` takes as ``found``."""

    def answer_program(self, sid: str, owner: str | None, body, ctype: str | None, accept: str | None,
                       watch: ProgramWatch | None = None,
                       found: Any = None) -> AbstractAsyncContextManager[EncodedAnswer]:
        """Admit and run one program; its encoded answer, to send inside the ``async with``. ``found``:
        what ``check_session`` returned for this request, if it was asked (``LocalSessions``: the
        session, not looked up again; the other backends return and take None)."""

    async def read_tensor(self, sid: str, owner: str | None, tid: str, *, value: bool, grad: bool,
                          as_json: bool) -> dict:
        """One tensor's message (``GET /v1/sessions/{sid}/tensors/{tid}``)."""

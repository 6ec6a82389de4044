"""Sessions and where they live: ``SessionStore`` with ``create/get/delete/run_program``.

A session owns its tensors, its ``torch.Generator`` and a lock; programs of one
session run one at a time. The store is the seam where a Ray-backed store
could replace this in-process one without touching routes, runner or op table.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from proto import ErrorCode, ProtocolError
from proto.messages import Program

from .custom_tensor import CustomTensor
from .settings import Settings


@dataclass
class Session:
    """One tenant: tensors by client-chosen id, a generator, a lock, recent program answers."""

    id: str
    owner: str | None
    device: torch.device
    generator: torch.Generator
    tensors: dict[str, CustomTensor] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    bytes_held: int = 0
    programs: OrderedDict = field(default_factory=OrderedDict)

    def tensor(self, tid: str) -> CustomTensor:
        try:
            return self.tensors[tid]
        except (KeyError, TypeError):
            raise ProtocolError(ErrorCode.UNKNOWN_TENSOR, f"unknown tensor id {tid!r} in this session") from None


@dataclass(frozen=True)
class Outcome:
    """What a program answered: HTTP status and the body (``results`` and maybe ``error``)."""

    status: int
    body: dict


class SessionStore:
    """The in-process store. Thread-safe: routes call it from the event loop and from workers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.device = settings.resolved_device()
        self._sessions: dict[str, Session] = {}
        self._expired: set[str] = set()
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    def create(self, owner: str | None = None) -> Session:
        with self._lock:
            self._expire_idle()
            if len(self._sessions) >= self.settings.max_sessions:
                raise ProtocolError(
                    ErrorCode.TOO_MANY, f"too many sessions: limit max_sessions={self.settings.max_sessions}"
                )
            sid = secrets.token_urlsafe(16)
            gen = torch.Generator(device=self.device)
            gen.manual_seed(secrets.randbits(63))
            session = Session(id=sid, owner=owner, device=self.device, generator=gen)
            self._sessions[sid] = session
            return session

    def get(self, sid: str, owner: str | None = None) -> Session:
        """The session ``sid`` of ``owner``; 404 for unknown or foreign ids, 410 once expired."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None and self._is_idle(session):
                self._drop(session)
                session = None
            if session is None or session.owner != owner:
                if sid in self._expired:
                    raise ProtocolError(ErrorCode.SESSION_EXPIRED, f"session {sid} expired after being idle")
                raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {sid!r}")
            session.last_used = time.monotonic()
            return session

    def delete(self, sid: str, owner: str | None = None) -> None:
        session = self.get(sid, owner)
        with self._lock:
            self._sessions.pop(session.id, None)
        with session.lock:
            session.tensors.clear()
            session.bytes_held = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def _is_idle(self, session: Session) -> bool:
        return time.monotonic() - session.last_used > self.settings.session_ttl_seconds and not session.lock.locked()

    def _expire_idle(self) -> None:
        for session in [s for s in self._sessions.values() if self._is_idle(s)]:
            self._drop(session)

    def _drop(self, session: Session) -> None:
        self._sessions.pop(session.id, None)
        self._expired.add(session.id)
        session.tensors.clear()

    # -- programs --------------------------------------------------------------------------

    def run_program(self, session: Session, program: Program, body: bytes, as_json: bool) -> Outcome:
        """Run ``program`` under the session's lock; a retried program id gets its first answer."""
        from .runner import reencode, run_program  # the runner imports the op table; keep store light

        digest = hashlib.blake2b(body, digest_size=16).digest()
        with session.lock:
            session.last_used = time.monotonic()
            cached = session.programs.get(program.id)
            if cached is not None:
                if cached[0] != digest:
                    raise ProtocolError(
                        ErrorCode.CONFLICT, f"program id {program.id!r} was already used for a different program"
                    )
                return cached[1] if cached[2] == as_json else reencode(cached[1], as_json)
            outcome = run_program(session, program, self.settings, as_json=as_json)
            session.programs[program.id] = (digest, outcome, as_json)
            while len(session.programs) > self.settings.program_cache_size:
                session.programs.popitem(last=False)
            session.last_used = time.monotonic()
            return outcome

    def read_tensor(self, session: Session, tid: str, *, value: bool, grad: bool, as_json: bool) -> dict:
        from .runner import tensor_message

        with session.lock:
            return tensor_message(tid, session.tensor(tid), value=value, grad=grad, as_json=as_json)

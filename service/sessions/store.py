"""Sessions and where they live: ``SessionStore`` with ``create/get/delete/sweep``; what a session
holds for each tensor id, ``CustomTensor``.

A session owns its tensors, its ``torch.Generator`` and a lock; programs of one
session run one at a time. The store is used in this process by
``LocalSessions``, and by each Ray worker actor through its own ``LocalSessions``.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from remote_autograd.proto import ErrorCode, ProtocolError

from ..settings import Settings
from .storage_ledger import Budget, StorageLedger


class CustomTensor:
    """``value`` (the live torch tensor, in the autograd graph) and ``grad`` (the leaf's ``.grad``, or
    ``None``), named as the wire names them; the original design called them ``_custom_data`` and
    ``_custom_grad``.

    Its boundary (``from_torch``, ``to_torch``) never hands out a reference to a value or a grad
    (``detach().clone()``), and a missing grad is ``None``, never zeros. Inside the server the
    step handlers use ``value`` and ``grad`` themselves: that is how ops see the graph.
    """

    __slots__ = ("value", "grad", "retains_grad", "held")

    def __init__(self, value: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        self.value = value
        self.grad = grad
        self.retains_grad = False
        self.held: tuple = ()  # the storage keys its session counts it under (``storage_ledger``)

    @classmethod
    def from_torch(
        cls,
        t: torch.Tensor,
        *,
        device: torch.device | str | None = None,
        requires_grad: bool | None = None,
    ) -> "CustomTensor":
        """A new leaf holding copies of ``t``'s values and grad; later changes to ``t`` never reach it."""
        rg = t.requires_grad if requires_grad is None else requires_grad
        value = t.detach().to(device=device or t.device, copy=True)
        if rg:
            value.requires_grad_(True)
        grad = None
        if t.grad is not None:
            grad = t.grad.detach().to(device=value.device, dtype=value.dtype, copy=True)
        return cls(value, grad)

    def to_torch(self, device: torch.device | str | None = None) -> torch.Tensor:
        """A new leaf with this tensor's values, ``requires_grad`` as recorded, and a copy of the grad."""
        out = self.value.detach().to(device=device or self.device, copy=True)
        out.requires_grad_(self.requires_grad)
        if self.grad is not None:
            out.grad = self.grad.detach().to(device=out.device, dtype=out.dtype, copy=True)
        return out

    @property
    def requires_grad(self) -> bool:
        return self.value.requires_grad

    @property
    def is_leaf(self) -> bool:
        return self.value.is_leaf

    @property
    def dtype(self) -> torch.dtype:
        return self.value.dtype

    @property
    def device(self) -> torch.device:
        return self.value.device

    @property
    def shape(self) -> torch.Size:
        return self.value.shape

    def __repr__(self) -> str:
        return f"CustomTensor(shape={list(self.shape)}, dtype={self.dtype}, requires_grad={self.requires_grad})"


@dataclass
class Session:
    """One tenant: tensors by client-chosen id, a generator, locks, recent program answers.

    ``lock`` serialises the session's torch work (worker threads); ``gate`` queues its
    programs on the event loop, so one busy session waits there instead of holding
    every worker. ``storages`` (the byte ledger, the one owner of the count) counts the
    storages its values, grads and autograd graph hold, by storage, never by view, and the
    bytes a step reserved before its kernel runs, charged against the session's limit and
    the ``budgets`` (the store's, then its token's): ``bytes_held``.
    """

    id: str
    owner: str | None
    device: torch.device
    generator: torch.Generator
    budgets: tuple[Budget, ...]
    tensors: dict[str, CustomTensor] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    storages: StorageLedger = field(init=False)
    programs: OrderedDict = field(default_factory=OrderedDict)
    caches: Any = None  # its speed paths' plans and captures (service.engine.speed_caches), dropped with it
    templates: dict = field(default_factory=dict)  # by id: the graphs torch.compile sent (service.engine.templates)
    worker: int = 0  # which worker thread runs this session's programs (set by the app)
    closed: bool = False  # deleted or expired: a program that was waiting for it must not run
    expired_after: float | None = None  # expired (not deleted): its idle limit, which a late request's 410 names
    # the GraphLost nodes of its tensors restored without their graph (tensor_snapshot), while any graph holds one
    lost_graphs: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    # the ProgramRun of the backward or grad step running autograd now: a user Function's node runs its
    # backward template with it (service.engine.user_functions), maybe on autograd's own thread
    autograd_run: Any = None
    autograd_explicit: bool = False  # that step names its inputs (a grad, a backward with inputs)
    # the autograd nodes function steps named, by that id, while a graph holds them (service.engine.tensor_hooks)
    nodes: weakref.WeakValueDictionary = field(default_factory=weakref.WeakValueDictionary)
    # the torch.utils.checkpoint(use_reentrant=False) regions open, outermost first (service.engine.checkpoint_regions)
    checkpoints: list = field(default_factory=list)
    # a program answered early (service.engine.run_ahead): its steps still to run, and the error one of them
    # left for the next program
    pending: Any = None
    late_failure: dict | None = None

    def tensor(self, tid: str) -> CustomTensor:
        try:
            return self.tensors[tid]
        except (KeyError, TypeError):
            raise ProtocolError(ErrorCode.UNKNOWN_TENSOR, f"unknown tensor id {tid!r} in this session") from None

    def __post_init__(self) -> None:
        self.storages = StorageLedger(self.budgets)

    @property
    def bytes_held(self) -> int:
        return self.storages.held

    def clear(self) -> None:
        """Forget every tensor and give its bytes back, for good (the caller holds ``lock``)."""
        self.closed = True
        self.tensors.clear()
        self.programs.clear()
        self.caches = None  # plans, and captures: a capture's memory goes with its last tensor
        self.templates.clear()
        self.checkpoints.clear()
        self.pending = self.late_failure = None
        self.storages.close()  # every byte given back


@dataclass(frozen=True)
class ProgramAnswer:
    """What a program answered: HTTP status and the body (``results`` and maybe ``error``), as the runner
    makes it and a session keeps it for a retry (the wire's ``ProgramResult``; the route sends it
    encoded: ``backends.protocol.EncodedAnswer``)."""

    status: int
    body: dict
    seconds: float = 0.0  # spent in the program's steps (the Server-Timing header reports it)


class SessionStore:
    """The in-process store. Thread-safe: routes call it from the event loop and from workers."""

    _EXPIRED_REMEMBERED = 65536  # ids answered 410 rather than 404; bounded so it cannot grow forever

    def __init__(self, settings: Settings, id_prefix: str = "") -> None:
        self.settings = settings
        self.device = settings.resolved_device()
        self.id_prefix = id_prefix  # the Ray backend's worker key: any front finds the worker from the id
        self.budget = Budget(settings.max_total_bytes)
        self.token_budgets: dict[str | None, Budget] = {}  # bounded by the number of tokens
        self._sessions: dict[str, Session] = {}
        self._expired: OrderedDict[str, str | None] = OrderedDict()  # id -> owner
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    def create(self, owner: str | None = None, sid: str | None = None) -> Session:
        """A new session of ``owner`` (``sid``: the id it had before a restart, ``service.backends.state_volume``)."""
        with self._lock:
            self._expire_idle()
            if len(self._sessions) >= self.settings.max_sessions:
                raise ProtocolError(
                    ErrorCode.TOO_MANY, f"too many sessions: limit max_sessions={self.settings.max_sessions}"
                )
            check_token_sessions(self._sessions_of(owner), self.settings)
            sid = sid or self.id_prefix + secrets.token_urlsafe(16)
            gen = torch.Generator(device=self.device)
            gen.manual_seed(secrets.randbits(63))
            session = Session(id=sid, owner=owner, device=self.device, generator=gen,
                              budgets=(self.budget, self._token_budget(owner)))
            self._sessions[sid] = session
            return session

    def get(self, sid: str, owner: str | None = None) -> Session:
        """The session ``sid`` of ``owner``; 404 for unknown or foreign ids, 410 once expired."""
        with self._lock:
            session = self._sessions.get(sid)
            now = time.monotonic()
            if (session is not None and now - session.last_used > self.settings.session_ttl_seconds
                    and self._try_drop(session)):  # idle (as ``_is_idle``): expired unless a program holds it
                session = None
            if session is None or session.owner != owner:
                if sid in self._expired and self._expired[sid] == owner:
                    raise _expired(sid, self.settings.session_ttl_seconds)
                raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {sid!r}")
            session.last_used = now
            return session

    def delete(self, sid: str, owner: str | None = None) -> None:
        session = self.get(sid, owner)
        with self._lock:
            self._sessions.pop(session.id, None)
        with session.lock:
            session.clear()

    def sweep(self) -> int:
        """Free every idle session now (the app calls this periodically); how many were freed."""
        with self._lock:
            return sum(self._try_drop(s) for s in list(self._sessions.values()) if self._is_idle(s))

    def __len__(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def _token_budget(self, owner: str | None) -> Budget:
        """The bytes ``owner``'s sessions hold together; the caller holds ``_lock``."""
        budget = self.token_budgets.get(owner)
        if budget is None:
            budget = self.token_budgets[owner] = Budget(self.settings.max_bytes_per_token,
                                                        "max_bytes_per_token", "this token")
        return budget

    def load(self, owner: str | None) -> dict:
        """What placement weighs (bytes held, then sessions) and what ``owner`` holds here."""
        with self._lock:
            return {"bytes": self.budget.held, "sessions": len(self._sessions),
                    "token_sessions": self._sessions_of(owner)}

    def _sessions_of(self, owner: str | None) -> int:
        """How many sessions ``owner`` holds here (the caller holds the lock)."""
        return sum(s.owner == owner for s in self._sessions.values())

    def _is_idle(self, session: Session) -> bool:
        return time.monotonic() - session.last_used > self.settings.session_ttl_seconds

    def _expire_idle(self) -> None:
        for session in [s for s in self._sessions.values() if self._is_idle(s)]:
            self._try_drop(session)

    def _try_drop(self, session: Session) -> bool:
        """Expire ``session`` unless a program holds it (then it is not idle); the caller holds ``_lock``."""
        if not session.lock.acquire(blocking=False):
            return False
        try:
            self._sessions.pop(session.id, None)
            self._expired[session.id] = session.owner
            session.expired_after = self.settings.session_ttl_seconds
            while len(self._expired) > self._EXPIRED_REMEMBERED:
                self._expired.popitem(last=False)
            session.clear()
        finally:
            session.lock.release()
        return True


def check_token_sessions(held: int, settings: Settings) -> None:
    """429 when a token already holds ``max_sessions_per_token`` sessions (``held``)."""
    if held >= settings.max_sessions_per_token:
        raise ProtocolError(ErrorCode.TOO_MANY, f"this token holds {held} sessions: "
                            f"limit max_sessions_per_token={settings.max_sessions_per_token}")


def check_open(session: Session) -> None:
    """A request that got the session before it was deleted (404) or expired (410, as ``SessionStore.get``
    answers it) finds it gone: a long upload outlives the idle limit of the session it was sent to."""
    if session.expired_after is not None:
        raise _expired(session.id, session.expired_after)
    if session.closed:
        raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {session.id!r}")


def _expired(sid: str, ttl: float) -> ProtocolError:
    return ProtocolError(ErrorCode.SESSION_EXPIRED,
                         f"session {sid} expired after being idle: limit session_ttl_seconds={ttl}")


def tenant_tag(owner: str | None) -> str:
    """A name for ``owner``'s tenant where the token itself must not appear (state directories, Ray
    actor names): 16 hex digits of a digest of the token, or ``open`` on a server without tokens."""
    if owner is None:
        return "open"
    return hashlib.blake2b(owner.encode(), digest_size=8, person=b"ra-tenant").hexdigest()

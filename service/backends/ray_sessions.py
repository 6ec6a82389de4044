"""``RaySessions``: the Ray backend of the ``SessionBackend`` seam (``REMOTE_AUTOGRAD_BACKEND=ray``).

Sessions live in ``SessionWorker`` actors, one per device slot and tenant (token), so
tenants never share an address space. The device slots are each GPU of each node, or, on a
node without GPUs, each unit of the custom resource ``remote_autograd_worker`` the node
declares (``ray start --resources '{"remote_autograd_worker": 1}'``). A token's actor on a
slot is made when a session of the token is first placed there, and asks for a share of
the slot (``num_gpus`` or the resource: one over the number of tokens), so every token's
actor fits beside the others and the GPU's own memory protection keeps them apart. This
front keeps no session state: a session id starts with its worker's key (slot, then the
tenant's tag), the actor is named after that key, so any front process on any node serves
any session. Workers are detached named actors pinned to their node (``get_if_exists``:
fronts racing make one); a node that joins later is used at the next placement.

Routing checks the caller first: an id whose key names another tenant's actor is unknown
(404) without reaching that actor. Faults: a call to a dead worker (its process ended, or
its node left) raises Ray's ``RayActorError``; that session's request is answered
``410 session_lost`` and the worker leaves the placement list. Other sessions, and other
tenants' actors on the same device, never notice.

Without ``RAY_ADDRESS`` the front starts a local Ray instance declaring one worker slot.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, TaskCancelledError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from remote_autograd.proto import ErrorCode, ProtocolError

from ..engine.guards import ProgramSlots
from ..engine.program_watch import ProgramWatch
from ..sessions.store import check_token_sessions, tenant_tag
from ..settings import Settings
from .protocol import EncodedAnswer
from .ray_worker import WORKER_PREFIX, SessionWorker, worker_name

WORKER_RESOURCE = "remote_autograd_worker"
# the device slot (the node id's first 12 hex digits, the slot's number), then the tenant's tag
_KEY = re.compile(r"([0-9a-f]{12}-\d{1,4})-([0-9a-f]{16}|open)")
_REFRESH_SECONDS = 2.0  # how stale the worker list may be when a session is placed
_FIRST_ANSWER_SECONDS = 120.0  # a new worker imports torch (and opens CUDA) before it answers
_READY_SECONDS = 5.0
_ASK_ABOVE_BYTES = 1 << 20  # a smaller body costs less to read than a round trip to its worker


class RaySessions:
    """Routes each call to the worker actor that holds the session; places new sessions least-loaded."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slots = ProgramSlots.of(settings)  # this front's programs in flight
        self.observe_program: Callable[[float], None] = lambda seconds: None
        _connect(settings.ray_namespace)
        self._actor = ray.remote(SessionWorker)
        self._share = 1 / max(1, len(settings.tokens))  # of a device slot, for each tenant's actor on it
        self._slots: dict[str, tuple[str, bool]] = {}  # slot -> (node id, on a GPU), the live ones as last listed
        self._workers: dict[str, Any] = {}  # key -> actor handle, the live workers as last listed
        self._listed_at = 0.0
        self._list_workers()

    # -- life of the backend ---------------------------------------------------------------

    def start(self) -> None:
        pass  # each worker sweeps its own idle sessions

    async def close(self) -> None:
        pass  # the workers outlive this front (detached): another front serves their sessions

    def health(self) -> dict:
        return {"device": "ray"}

    async def readiness(self) -> tuple[bool, dict]:
        """Ready with a device slot to place sessions on; ``workers`` counts the slots, ``tenant_workers``
        the actors (one per slot and token, made as sessions are placed) that answered."""
        workers = await self._workers_now(force=True)
        answers = await asyncio.gather(*(_within(h.ping.remote(), _READY_SECONDS) for h in workers.values()),
                                       return_exceptions=True)
        up = sum(not isinstance(a, BaseException) for a in answers)
        if not self._slots:
            return False, {"status": "unavailable", "device": "ray", "workers": 0, "tenant_workers": up,
                           "detail": f"no node offers a GPU or the {WORKER_RESOURCE} resource"}
        return True, {"status": "ready", "device": "ray", "workers": len(self._slots), "tenant_workers": up}

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, owner: str | None) -> dict:
        """On the least-loaded device slot (bytes held, then sessions, by every tenant's actor on it), in the
        token's actor there (made if it has none), within the token's cluster-wide limit. The list of workers
        is read afresh: another front may have made a token's actor a moment ago, and placing by a stale
        list would put every new session on the slot that looked empty."""
        workers = await self._workers_now(force=True)
        tag = tenant_tag(owner)
        loads = await asyncio.gather(*(self._load(key, h, owner) for key, h in workers.items()))
        by_slot = {slot: [0, 0] for slot in self._slots}
        token_sessions = 0
        for key, load in zip(workers, loads):
            slot, theirs = _KEY.fullmatch(key).groups()
            if load is None or slot not in by_slot:
                continue
            by_slot[slot][0] += load["bytes"]
            by_slot[slot][1] += load["sessions"]
            token_sessions += load["token_sessions"] if theirs == tag else 0
        if not by_slot:
            raise ProtocolError(ErrorCode.TOO_MANY, "no worker is up to hold a session: retry later")
        check_token_sessions(token_sessions, self.settings)
        for slot in sorted(by_slot, key=lambda s: (*by_slot[s], s)):
            key = f"{slot}-{tag}"
            handle = workers.get(key) or self._make_worker(slot, key)
            try:
                return _unwrap(await _within(handle.create_session.remote(owner), _FIRST_ANSWER_SECONDS))
            except (RayActorError, GetTimeoutError, asyncio.TimeoutError):  # it died or never came up: the next slot
                self._workers.pop(key, None)
        raise ProtocolError(ErrorCode.TOO_MANY, "every worker died while placing the session: retry later")

    async def describe_session(self, sid: str, owner: str | None) -> dict:
        return await self._ask(sid, owner, lambda h: h.describe_session.remote(sid, owner))

    async def delete_session(self, sid: str, owner: str | None) -> None:
        await self._ask(sid, owner, lambda h: h.delete_session.remote(sid, owner))

    # -- work ------------------------------------------------------------------------------

    async def check_session(self, sid: str, owner: str | None, body_bytes: int | None) -> None:
        """404/410 before the body is read: an id no worker could hold at once; for a body bigger than
        ``_ASK_ABOVE_BYTES`` (or of unknown length), whether its worker holds the session."""
        if body_bytes is None or body_bytes > _ASK_ABOVE_BYTES:
            await self.describe_session(sid, owner)
        elif not _is_theirs(sid, owner):
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {sid!r}")

    @asynccontextmanager
    async def answer_program(self, sid: str, owner: str | None, body, ctype: str | None, accept: str | None,
                             watch: ProgramWatch | None = None, found: None = None) -> AsyncIterator[EncodedAnswer]:
        """The body goes to the worker as bytes (decoded there, once); its answer comes back encoded,
        as bytes of its own (nothing of the session's is held while the caller sends it). A cancelled
        ``watch`` cancels the worker's call, which stops the program at its next step there."""
        data = body if isinstance(body, bytes) else bytes(body)  # a view of the receive buffer cannot travel

        def call(handle: Any) -> Any:
            ref = handle.answer_program.remote(sid, owner, data, ctype, accept)
            if watch is not None:
                watch.on_cancel(lambda: ray.cancel(ref))
            return ref

        self.slots.take(sid, owner)
        try:
            start = time.perf_counter()
            try:
                status, media_type, answer, steps, worker = await self._ask(sid, owner, call)
            except TaskCancelledError:
                raise ProtocolError(ErrorCode.CANCELLED, "the client disconnected while the program ran: it "
                                    "stopped at a step boundary on its worker") from None
            hop = time.perf_counter() - start
            self.observe_program(hop)
        finally:
            self.slots.give(sid, owner)
        yield EncodedAnswer(status, media_type, [answer], len(answer), steps, hop)

    async def read_tensor(self, sid: str, owner: str | None, tid: str, *, value: bool, grad: bool,
                          as_json: bool) -> dict:
        return await self._ask(sid, owner, lambda h: h.read_tensor.remote(sid, owner, tid, value, grad, as_json))

    # -- workers ---------------------------------------------------------------------------

    async def _ask(self, sid: str, owner: str | None, call: Callable[[Any], Any]) -> Any:
        """``call(worker)`` on the worker that holds ``sid``; its ProtocolError raised here; 410 if it died.
        An id of another tenant's worker is unknown here: that worker is never reached."""
        key = sid.partition(".")[0]
        if not _is_theirs(sid, owner):
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {sid!r}")
        handle = self._workers.get(key)
        if handle is None:  # made by another front since this one listed the workers, or gone
            handle = await asyncio.to_thread(_named_worker, key)
            if handle is None:
                raise _lost(sid, key, "is gone")
            self._workers[key] = handle
        try:
            return _unwrap(await call(handle))
        except RayActorError:
            self._workers.pop(key, None)  # placement stops offering it at once
            raise _lost(sid, key, "died (its process ended or its node left the cluster)") from None

    async def _load(self, key: str, handle: Any, owner: str | None) -> dict | None:
        try:
            return _unwrap(await _within(handle.load.remote(owner), _FIRST_ANSWER_SECONDS))
        except (RayActorError, GetTimeoutError, asyncio.TimeoutError):
            self._workers.pop(key, None)
            return None

    async def _workers_now(self, force: bool = False) -> dict[str, Any]:
        if force or time.monotonic() - self._listed_at > _REFRESH_SECONDS:
            await asyncio.to_thread(self._list_workers)
        return dict(self._workers)

    def _list_workers(self) -> None:
        """The device slots of every live node, and the live workers (any front's) on them."""
        slots = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            gpus = int(resources.get("GPU", 0))
            for slot in range(gpus or int(resources.get(WORKER_RESOURCE, 0))):
                slots[f"{node['NodeID'][:12]}-{slot}"] = (node["NodeID"], gpus > 0)
        workers = {}
        for name in ray.util.list_named_actors():
            match = _KEY.fullmatch(name[len(WORKER_PREFIX):]) if name.startswith(WORKER_PREFIX) else None
            if match is not None and match.group(1) in slots:
                key = match.group(0)
                workers[key] = self._workers.get(key) or _named_worker(key)
        self._slots = slots
        self._workers = {key: handle for key, handle in workers.items() if handle is not None}
        self._listed_at = time.monotonic()

    def _make_worker(self, slot: str, key: str) -> Any:
        # num_cpus=0: the device is what the worker holds; a default actor would also hold a CPU
        # for life and could leave nothing else schedulable on a small node.
        node_id, on_gpu = self._slots[slot]
        resources = {"num_gpus": self._share} if on_gpu else {"resources": {WORKER_RESOURCE: self._share}}
        handle = self._actor.options(
            name=worker_name(key), lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=0,
            max_concurrency=1000, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **resources,
        ).remote(self.settings, key)
        self._workers[key] = handle
        return handle


def _connect(namespace: str) -> None:
    """Join ``RAY_ADDRESS``'s cluster, or start a local Ray declaring one worker slot."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(namespace=namespace, log_to_driver=False)
    else:
        ray.init(namespace=namespace, resources={WORKER_RESOURCE: 1}, include_dashboard=False, log_to_driver=False)


def _is_theirs(sid: str, owner: str | None) -> bool:
    """Whether ``sid`` names a worker of ``owner``'s tenant (any other id is unknown to the caller)."""
    match = _KEY.fullmatch(sid.partition(".")[0])
    return match is not None and match.group(2) == tenant_tag(owner)


def _named_worker(key: str) -> Any | None:
    try:
        return ray.get_actor(worker_name(key))
    except ValueError:  # no live actor of that name
        return None


async def _within(ref: Any, seconds: float) -> Any:
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), seconds)


def _unwrap(answer: tuple) -> Any:
    status, value = answer
    if status == "error":
        raise ProtocolError(ErrorCode(value["code"]), value["message"], step=value.get("step"), op=value.get("op"))
    return value


def _lost(sid: str, key: str, how: str) -> ProtocolError:
    return ProtocolError(ErrorCode.SESSION_LOST,
                         f"session {sid} is lost: its worker {worker_name(key)} {how}; other sessions go on")

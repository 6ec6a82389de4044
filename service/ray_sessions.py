"""``RaySessions``: the Ray backend of the ``SessionBackend`` seam (``REMOTE_AUTOGRAD_BACKEND=ray``).

Sessions live in ``SessionWorker`` actors, one per device: one per GPU of each node
(``num_gpus=1``), or, on a node without GPUs, one per unit of the custom resource
``remote_autograd_worker`` the node declares (``ray start --resources
'{"remote_autograd_worker": 1}'``). This front keeps no session state: a session id starts
with its worker's key, the worker actor is named after that key, so any front process on
any node serves any session. Workers are detached named actors pinned to their node; every
front makes the missing ones (``get_if_exists``: fronts racing make one), so a node that
joins later gets workers on the next placement.

Faults: a call to a dead worker (its process ended, or its node left) raises Ray's
``RayActorError``; that session's request is answered ``410 session_lost`` and the worker
leaves the placement list. Other sessions never notice.

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

from .guards import ProgramSlots
from .local_sessions import ProgramAnswer
from .program_watch import ProgramWatch
from .ray_worker import WORKER_PREFIX, SessionWorker, worker_name
from .settings import Settings
from .store import check_token_sessions

WORKER_RESOURCE = "remote_autograd_worker"
_KEY = re.compile(r"[0-9a-f]{12}-\d{1,4}")  # the node id's first 12 hex digits, then the device slot
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
        self._workers: dict[str, Any] = {}  # key -> actor handle, the live workers as last listed
        self._listed_at = 0.0
        self._list_workers()

    # -- life of the backend ---------------------------------------------------------------

    def start(self) -> None:
        pass  # each worker sweeps its own idle sessions

    def close(self) -> None:
        pass  # the workers outlive this front (detached): another front serves their sessions

    def health(self) -> dict:
        return {"device": "ray"}

    async def readiness(self) -> tuple[bool, dict]:
        workers = await self._workers_now(force=True)
        answers = await asyncio.gather(*(_within(h.ping.remote(), _READY_SECONDS) for h in workers.values()),
                                       return_exceptions=True)
        up = sum(not isinstance(a, BaseException) for a in answers)
        if not up:
            return False, {"status": "unavailable", "device": "ray", "workers": 0,
                           "detail": f"no worker answered: no node offers a GPU or the {WORKER_RESOURCE} resource"}
        return True, {"status": "ready", "device": "ray", "workers": up}

    # -- sessions --------------------------------------------------------------------------

    async def create_session(self, owner: str | None) -> dict:
        """On the least-loaded worker (bytes held, then sessions), within the token's cluster-wide limit."""
        workers = await self._workers_now()
        loads = await asyncio.gather(*(self._load(key, h, owner) for key, h in workers.items()))
        loads = [(load, key) for load, key in zip(loads, workers) if load is not None]
        if not loads:
            raise ProtocolError(ErrorCode.TOO_MANY, "no worker is up to hold a session: retry later")
        check_token_sessions(sum(load["token_sessions"] for load, _ in loads), self.settings)
        for load, key in sorted(loads, key=lambda lk: (lk[0]["bytes"], lk[0]["sessions"], lk[1])):
            try:
                return _unwrap(await workers[key].create_session.remote(owner))
            except RayActorError:  # it died since it answered: the next one
                self._workers.pop(key, None)
        raise ProtocolError(ErrorCode.TOO_MANY, "every worker died while placing the session: retry later")

    async def describe_session(self, sid: str, owner: str | None) -> dict:
        return await self._ask(sid, lambda h: h.describe_session.remote(sid, owner))

    async def delete_session(self, sid: str, owner: str | None) -> None:
        await self._ask(sid, lambda h: h.delete_session.remote(sid, owner))

    # -- work ------------------------------------------------------------------------------

    async def check_session(self, sid: str, owner: str | None, body_bytes: int | None) -> None:
        """404/410 before the body is read: an id no worker could hold at once; for a body bigger than
        ``_ASK_ABOVE_BYTES`` (or of unknown length), whether its worker holds the session."""
        if body_bytes is None or body_bytes > _ASK_ABOVE_BYTES:
            await self.describe_session(sid, owner)
        elif not _KEY.fullmatch(sid.partition(".")[0]):
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, f"unknown session {sid!r}")

    @asynccontextmanager
    async def answer_program(self, sid: str, owner: str | None, body, ctype: str | None,
                             accept: str | None, watch: ProgramWatch | None = None) -> AsyncIterator[ProgramAnswer]:
        """The body goes to the worker as bytes (decoded there, once); its answer comes back encoded,
        as bytes of its own (nothing of the session's is held while the caller sends it). A cancelled
        ``watch`` cancels the worker's call, which stops the program at its next step there."""
        data = body if isinstance(body, bytes) else bytes(body)  # a view of the receive buffer cannot travel

        def call(handle: Any) -> Any:
            ref = handle.answer_program.remote(sid, owner, data, ctype, accept)
            if watch is not None:
                watch.on_cancel(lambda: ray.cancel(ref))
            return ref

        with self.slots.take(sid, owner):
            start = time.perf_counter()
            try:
                status, media_type, answer, steps, worker = await self._ask(sid, call)
            except TaskCancelledError:
                raise ProtocolError(ErrorCode.CANCELLED, "the client disconnected while the program ran: it "
                                    "stopped at a step boundary on its worker") from None
            hop = time.perf_counter() - start
            self.observe_program(hop)
        yield ProgramAnswer(status, media_type, [answer], len(answer), steps, hop)

    async def read_tensor(self, sid: str, owner: str | None, tid: str, *, value: bool, grad: bool,
                          as_json: bool) -> dict:
        return await self._ask(sid, lambda h: h.read_tensor.remote(sid, owner, tid, value, grad, as_json))

    # -- workers ---------------------------------------------------------------------------

    async def _ask(self, sid: str, call: Callable[[Any], Any]) -> Any:
        """``call(worker)`` on the worker that holds ``sid``; its ProtocolError raised here; 410 if it died."""
        key = sid.partition(".")[0]
        if not _KEY.fullmatch(key):
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
        """The live workers, after making the missing ones: one per device slot of every live node."""
        listed = {name[len(WORKER_PREFIX):] for name in ray.util.list_named_actors()
                  if name.startswith(WORKER_PREFIX)}
        workers = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            gpus = int(resources.get("GPU", 0))
            for slot in range(gpus or int(resources.get(WORKER_RESOURCE, 0))):
                key = f"{node['NodeID'][:12]}-{slot}"
                known = self._workers.get(key) if key in listed else None
                workers[key] = known or self._make_worker(node["NodeID"], key, on_gpu=gpus > 0)
        self._workers, self._listed_at = workers, time.monotonic()

    def _make_worker(self, node_id: str, key: str, *, on_gpu: bool) -> Any:
        # num_cpus=0: the device is what the worker holds; a default actor would also hold a CPU
        # for life and could leave nothing else schedulable on a small node.
        resources = {"num_gpus": 1} if on_gpu else {"resources": {WORKER_RESOURCE: 1}}
        return self._actor.options(
            name=worker_name(key), lifetime="detached", get_if_exists=True, num_cpus=0, max_restarts=0,
            max_concurrency=1000, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **resources,
        ).remote(self.settings, key)


def _connect(namespace: str) -> None:
    """Join ``RAY_ADDRESS``'s cluster, or start a local Ray declaring one worker slot."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(namespace=namespace, log_to_driver=False)
    else:
        ray.init(namespace=namespace, resources={WORKER_RESOURCE: 1}, include_dashboard=False, log_to_driver=False)


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

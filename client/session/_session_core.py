"""``SessionCore``: one server session, its id counter, and the queue of steps not yet sent.

The part of ``Session`` that tensors and dispatch build on; it makes no tensors (the
public ``Session``, in ``_session``, adds uploads, factories and ops by name on top).

Steps are queued and sent as one program when a value is needed, on ``sync()``,
when the queue reaches the session's limits, and on ``close()``. When step k of
a program fails, results of steps from k on are marked failed and the error is
raised here and again wherever a failed tensor is used.
"""

from __future__ import annotations

import itertools
import secrets
import weakref
from typing import TYPE_CHECKING, Any, Callable, Self

import torch

from remote_autograd.proto import decode_tensor, dtype_from_name
from remote_autograd.proto.frames import FRAME_MIN_BYTES

from ..device._device import claim_index, release_index
from ..transport._errors import RemoteError
from ..transport._protocol_advice import explain
from ..transport._transport import Transport, error_from
from . import _caller_memo, _checkpoint_regions
from ._banner import announce
from ._callsite import refuse_custom_function
from ._queue_globals import QueueGlobals
from ._routes import RouteTable

if TYPE_CHECKING:
    from ..tensor._tensor import RemoteTensor

_ROUTE_TABLES: dict[str, RouteTable] = {}
_TOP_HOOKS = _checkpoint_regions.TOP_HOOKS


class _Origin:
    """Where a queued step came from, what it makes, and how to undo local predictions."""

    __slots__ = ("op", "where", "outputs", "undo", "on_result")

    def __init__(self, op: str, where: str | None, outputs: list | tuple = (),
                 undo: Callable[[], None] | None = None, on_result: Callable[[Any], None] | None = None) -> None:
        self.op, self.where = op, where
        self.outputs = outputs  # weakrefs to RemoteTensors this step creates
        self.undo = undo
        self.on_result = on_result  # corrects local predictions from the step's result


class SessionCore:
    """A session on a remote-autograd server: its queue of steps, flushed as programs."""

    def __init__(self, transport: Transport, *, pipeline: bool = True) -> None:
        self._transport = transport
        try:
            info = transport.call("POST", "/v1/sessions", {})
        except RemoteError as exc:  # a protocol mismatch becomes one error saying what to upgrade
            error = explain(transport, exc)
            transport.close()  # no session will: its connections (or in-process app) end here
            raise error from None
        self.id: str = info["session_id"]
        self.remote_device: str = info["device"]
        self.server_version: str = info["server_version"]
        self.limits: dict[str, Any] = info["limits"]
        self.pipeline = pipeline
        self._routes = _route_table(transport)
        self._path = f"/v1/sessions/{self.id}"
        self._program_prefix = secrets.token_hex(4)
        self._programs = itertools.count(1)
        self._ids = itertools.count(1)
        self._queue: list[dict] = []
        self._origins: list[_Origin | None] = []
        self._queued_bytes = 0
        self._frees: list[str] = []
        # the default dtype the queued ops were inferred under (None: no op queued), and torch's other
        # settings they run under (_queue_globals)
        self._queue_dtype: torch.dtype | None = None
        self._globals = QueueGlobals()
        self._grad_tracked: weakref.WeakValueDictionary[str, RemoteTensor] = weakref.WeakValueDictionary()
        # handles with hooks (handlers/_hooks), by id(handle): recorded at each backward and grad call
        self._hooked: weakref.WeakValueDictionary[int, RemoteTensor] = weakref.WeakValueDictionary()
        self._hook_kept: dict[str, RemoteTensor] = {}  # hooked non-leaves kept as torch keeps their hooks, by id
        # hooks on the server nodes of module backward hooks (handlers/_node_hooks), by node id, while they live
        self._node_hooks: dict[str, Any] = {}
        self._templates: dict[str, dict] = {}  # template id -> its step: the templates this session has been sent
        self._regions = _checkpoint_regions.Regions()  # torch.utils.checkpoint(use_reentrant=False)'s, open
        self._closed = False
        self._max_steps = max(2, int(self.limits["max_steps_per_program"]) - 1)  # room for a free step
        self._max_bytes = int(self.limits["max_body_bytes"]) // 2
        self.device: torch.device = claim_index(self)  # torch.device("remote", k) while open
        announce(info, transport.base_url)  # one line on connect, in notebooks only

    # -- context manager --------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._queue)} queued"
        return f"<remote-autograd Session {self.id} on {self._transport.base_url} ({self.remote_device}), {state}>"

    def close(self) -> None:
        """Send what is queued, then delete the session on the server (freeing all its tensors)."""
        if self._closed:
            return
        try:
            self.sync()
        finally:
            self._closed = True
            release_index(self.device)
            try:
                self._transport.request("DELETE", self._path)
            finally:
                self._transport.close()

    @property
    def requests(self) -> int:
        """HTTP requests this session's transport has sent (tests and benchmarks count these)."""
        return self._transport.requests

    def sync(self) -> None:
        """Send every queued step now and wait; raises the first error."""
        self.flush()

    def stats(self) -> dict[str, Any]:
        """The server's view of this session: tensors and bytes held (sends queued steps first)."""
        self.flush()
        return self._transport.call("GET", self._path, session=self.id)

    # -- the queue --------------------------------------------------------------------------

    def new_id(self) -> str:
        return f"t{next(self._ids)}"

    def enqueue(self, step: dict, origin: _Origin | None, nbytes: int = 0) -> int:
        """Queue a step; returns its index in the next program. Eager sessions send at once."""
        if self._closed:
            self._check_open()
        hooks = _TOP_HOOKS(False)  # a checkpointed function's region begins or ends here? (_checkpoint_regions)
        if hooks is None:
            if self._regions.open:
                _checkpoint_regions.sync(self, hooks, _Origin)
        elif hooks[0] is not self._regions.pack:
            _checkpoint_regions.sync(self, hooks, _Origin)
        queue = self._queue
        if queue and (len(queue) >= self._max_steps or self._queued_bytes + nbytes > self._max_bytes):
            self.flush()
            queue = self._queue
        queue.append(step)
        self._origins.append(origin)
        self._queued_bytes += nbytes
        index = len(queue) - 1
        if not self.pipeline:
            self._pending_results = self.flush()
        return index

    def globals_changed(self, dtype: torch.dtype) -> None:
        """An op is queued under default dtype ``dtype``, not the queue's: the queue's first op, or a
        change since its last (the ops so far are sent first: a program runs under one)."""
        if self._queue_dtype is not None:
            self.flush()
        self._globals.start()
        self._queue_dtype = dtype

    def autograd_step(self, step: dict) -> None:
        """A backward or grad step about to be queued: torch's settings as for an op, anomaly detection its own."""
        dtype = torch.get_default_dtype()
        if dtype is not self._queue_dtype:
            self.globals_changed(dtype)
        self._globals.autograd_step(step)

    def ensure_template(self, tid: str, step: dict) -> None:
        """Queue template ``tid``'s definition unless this session has been sent it (a compiled graph's
        first call here: ``capture``)."""
        if tid not in self._templates:
            self._templates[tid] = step
            # a program failing at or before it leaves the server without it: sent again at its next use
            self.enqueue(step, _Origin("template", None, undo=lambda: self._templates.pop(tid, None)))

    def flush(self) -> list:
        """Send the queue as one program; the results, one per step."""
        _caller_memo.forget()  # its frame may be the last to hold a tensor: freed in this program
        frees, self._frees = self._frees, []
        steps, origins = self._queue, self._origins
        if frees:
            steps, origins = steps + [{"kind": "free", "ids": frees}], origins + [None]
        if not steps:
            return []
        big = self._queued_bytes >= FRAME_MIN_BYTES
        self._queue, self._origins, self._queued_bytes = [], [], 0
        program_id = f"{self._program_prefix}-{next(self._programs)}"
        dtype, self._queue_dtype = self._queue_dtype, None
        fields: dict = {}
        if dtype is not None:  # a program with ops runs under the torch settings they were queued under
            try:
                fields = self._globals.fields(dtype, program_id, origins)
            except RemoteError as error:  # changed while they were queued: none of them runs
                self._frees = frees + self._frees
                self._fail_all(error, origins, 0)
        sent_origins = origins
        done: list = []
        for _ in range(len(self._templates) + 1):
            status, body = self._post(program_id, steps, fields, big)
            lost = _lost_template(body, steps) if status == 404 else None
            if lost not in self._templates:
                break
            # the server restarted since it was sent this template (a restart keeps none): send it again,
            # then the steps from the run that asked for it on (those before it ran)
            k = body["error"]["step"]
            done += _kept(body.get("results") or [], origins)
            steps, origins = [self._templates[lost], *steps[k:]], [_RESENT, *origins[k:]]
            program_id = f"{self._program_prefix}-{next(self._programs)}"
        if status >= 400:
            self._fail(status, body, origins)
        results = done + _kept(body["results"], origins)
        origins = sent_origins
        for origin, result in zip(origins, results):
            if origin is not None and origin.on_result is not None:
                origin.on_result(result)
        return results

    def _post(self, program_id: str, steps: list, fields: dict, big: bool) -> tuple[int, Any]:
        # The SDK names every output and infers its metadata: the server need not send it back
        # (it still answers what only it knows: fetches, out_many calls, allow_unused grads, no_grad).
        # ``fields``: the torch settings the steps were queued under (_queue_globals).
        program = {"id": program_id, "steps": steps, "omit_known_meta": True, **fields}
        return self._transport.request("POST", self._path + "/programs", program, big=big)

    def _fail(self, status: int, body: Any, origins: list[_Origin | None]) -> None:
        err = (body or {}).get("error") or {}
        k = err.get("step")
        k = 0 if k is None else min(k, len(origins))
        origin = origins[k] if k < len(origins) else None
        error = error_from(status, body, where=origin.where if origin else None, session=self.id)
        if origin is not None and not error.op:
            error.op = origin.op
        if isinstance(err.get("forward"), dict):  # a backward under anomaly detection: the call that made the node
            self._globals.name_forward(error, err["forward"])
        self._fail_all(error, origins, k)

    def _fail_all(self, error: RemoteError, origins: list[_Origin | None], k: int) -> None:
        """Raise ``error``, the steps from ``k`` on marked failed: their outputs raise it where used."""
        for o in origins[k:]:
            if o is None:
                continue
            if o.undo is not None:
                o.undo()
            for ref in o.outputs:
                t = ref()
                if t is not None:
                    t._error = error
        raise error

    def take_result(self, index: int) -> Any:
        """The result of the step queued at ``index`` (flushing if it is still queued)."""
        if self.pipeline:
            return self.flush()[index]
        return self._pending_results[index]

    def _free_later(self, tid: str) -> None:
        if not self._closed:
            self._frees.append(tid)

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteError(f"session {self.id} is closed", code="session_closed")

    # -- fetching ---------------------------------------------------------------------------

    def fetch(self, tid: str, *, value: bool = True, grad: bool = False) -> dict:
        if not torch.is_grad_enabled():  # inside a Function's forward, a value read may become a local output
            refuse_custom_function(None)
        index = self.enqueue({"kind": "fetch", "id": tid, "value": value, "grad": grad}, _Origin("fetch", None))
        message = self.take_result(index)["tensor"]
        return message


def _route_table(transport: Transport) -> RouteTable:
    """The server's op table, fetched once per URL over sockets. A given transport's is not
    cached: two in-process apps may share a placeholder URL and not their ops."""
    if not transport.own_socket_layer:
        return RouteTable(transport.call("GET", "/v1/ops")["ops"])
    table = _ROUTE_TABLES.get(transport.base_url)
    if table is None:
        table = _ROUTE_TABLES[transport.base_url] = RouteTable(transport.call("GET", "/v1/ops")["ops"])
    return table


_RESENT = _Origin("template", None)  # a template sent again after a restart: its result is no step's of the queue


def _kept(results: list, origins: list) -> list:
    return [r for r, o in zip(results, origins) if o is not _RESENT]


def _lost_template(body: Any, steps: list) -> str | None:
    """The template a ``run_template`` step (or a ``function`` step, its ``backward``) asked for that the server
    did not hold (``unknown_template``)."""
    err = (body or {}).get("error") if isinstance(body, dict) else None
    k = (err or {}).get("step")
    if (err or {}).get("code") != "unknown_template" or not isinstance(k, int) or k >= len(steps):
        return None
    return steps[k].get("template") or steps[k].get("backward")


def meta_from_result(result: dict) -> list[tuple[str, tuple[int, ...], torch.dtype, bool] | None]:
    out = []
    for m in result["tensors"]:
        out.append(None if m is None else (m["id"], tuple(m["shape"]), dtype_from_name(m["dtype"]), m["requires_grad"]))
    return out

"""A tenant's worker process: ``python -m remote_autograd.service.backends.tenant_worker FD FRONT``.

The front (``tenant_processes``) starts one per token, on the token's first session, with
its end of a socketpair as file descriptor ``FD``, and speaks ``tenant_channel``'s
protocol over it. Inside runs the in-process backend, ``LocalSessions``, unchanged: the
same store, runner, op table, worker threads and per-session guarantees (one program of
a session at a time, its generator, atomic steps, idempotent program ids, its limits)
as a single server. Only its share of ``max_total_bytes`` comes from the front
(``byte_grants``). It holds one token's sessions and never learns any token: the front
checked the caller and sends every call with ``owner`` None, so the per-token limits
(``max_sessions_per_token``, ``max_bytes_per_token``) bound this process's own sessions.

It ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group):
the front tells it to save its sessions and stop. When the front's end closes without
that, it exits at once and its sessions are lost; when the front (pid ``FRONT``) dies,
the kernel kills it (SIGKILL) even mid-kernel (``process_guards.die_with_parent``). It is
not readable by other processes of its user, other tenants' workers included
(``process_guards.forbid_reading``).

Its private memory is bounded (``RLIMIT_DATA``, set once it has started:
``worker_memory_bytes`` above what it holds then, and room for its threads' stacks), so a
kernel's hidden temporaries beyond every byte count fail in this process (the CPU
allocator's refusal is a ``507``) or end it (``410`` for its sessions), never the host.
Not on a GPU: CUDA maps host memory of its own at will (a device's temporaries are bounded
by the device: a ``507``); there, a container's memory limit bounds the host's.
"""

from __future__ import annotations

import sys

from .. import process_guards

if __name__ == "__main__":  # first: torch's import starts a thread, and capabilities are dropped per thread
    process_guards.guard_worker(int(sys.argv[2]))

import asyncio
import os
import signal
import socket
from dataclasses import fields as dataclass_fields
from pathlib import Path

import msgpack
import torch

from remote_autograd.proto import ErrorCode, ProtocolError

from .. import logs
from ..engine import template_compile
from ..engine.program_watch import ProgramWatch
from ..gc_freeze import freeze_startup_objects
from ..ops import load_configured_ops
from ..settings import Settings
from ..step_histogram import OP_BUCKETS, StepHistogram
from . import state_volume
from .byte_grants import GrantedBudget, asker
from .local_sessions import LocalSessions
from .tenant_channel import Call, Channel, open_channel


_PURGE_ABOVE = 256  # programs the front may still ask about (cancelled mid-step): the finished ones forgotten past this


def settings_to_wire(settings: Settings) -> dict:
    """The settings as plain values for the ``hello`` call (tuples as lists; ``extra`` left out)."""
    return {f.name: list(v) if isinstance(v := getattr(settings, f.name), tuple) else v
            for f in dataclass_fields(Settings) if f.name != "extra"}


def settings_from_wire(values: dict) -> Settings:
    known = {f.name for f in dataclass_fields(Settings)} - {"extra"}
    return Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known})


class TenantWorker:
    """The worker's end: its table of methods (``handlers``), each a call of ``LocalSessions``."""

    def __init__(self) -> None:
        self.sessions: LocalSessions | None = None
        self.channel: Channel | None = None
        self.state_dir: Path | None = None
        self.stopping = asyncio.Event()
        self.steps = StepHistogram("remote_autograd_op_seconds", "", OP_BUCKETS)  # the front renders them
        self.running: dict[int, ProgramWatch] = {}  # the front's tag of each program call -> its watch
        self.handlers = {
            "hello": self.hello, "create_session": self.create_session, "describe_session": self.describe_session,
            "delete_session": self.delete_session, "program": self.program, "read_tensor": self.read_tensor,
            "load": self.load, "figures": self.figures, "readiness": self.readiness, "return_slack": self.return_slack,
            "save_state": self.save_state, "stop": self.stop, "where": self.where,
        }

    async def hello(self, call: Call) -> None:
        """Set up from the front's settings; restore this tenant's saved sessions; answer the id prefixes served."""
        if self.sessions is not None:
            raise ProtocolError(ErrorCode.CONFLICT, "hello: already set up")
        settings = settings_from_wire(call.fields["settings"])
        logs.configure(settings.log_level)
        load_configured_ops(settings.op_modules, test_ops=settings.test_ops)
        sessions = LocalSessions(settings, id_prefix=call.fields["prefix"] + ".",
                                 name=f"{call.fields['label']} (pid {os.getpid()})")
        loop = asyncio.get_running_loop()
        # Before any session exists: each one takes its budgets from the store when it is made.
        sessions.store.budget = GrantedBudget(settings.max_total_bytes, asker(loop, self._ask_bytes),
                                              lambda n: loop.call_soon_threadsafe(self._return_bytes, n))
        sessions.on_step = self.steps
        self.sessions = sessions
        prefixes = [call.fields["prefix"]]
        if call.fields.get("state_dir"):
            self.state_dir = Path(call.fields["state_dir"])
            prefixes += await asyncio.to_thread(state_volume.restore, sessions, self.state_dir, None)
        sessions.start()
        freeze_startup_objects()  # this process exists to serve one tenant from here on
        limit = _limit_memory(settings)
        await call.answer({"pid": os.getpid(), "prefixes": sorted(set(prefixes)), "sessions": len(sessions.store),
                           "memory_limit": limit})

    async def create_session(self, call: Call) -> None:
        await call.answer(await self._ready().create_session(None))

    async def describe_session(self, call: Call) -> None:
        await call.answer(await self._ready().describe_session(call.fields["sid"], None))

    async def delete_session(self, call: Call) -> None:
        await self._ready().delete_session(call.fields["sid"], None)

    async def program(self, call: Call) -> None:
        f = call.fields
        sessions = self._ready()
        watch = ProgramWatch(sessions.settings.max_program_seconds)
        tag = f.get("tag")
        if isinstance(tag, int):
            if len(self.running) > _PURGE_ABOVE:
                self.running = {t: w for t, w in self.running.items() if not w.finished}
            self.running[tag] = watch
        try:
            async with sessions.answer_program(f["sid"], None, call.body, f.get("ctype"), f.get("accept"),
                                               watch) as answer:
                # Inside: the answer's parts may view the session's memory, which the next program may
                # write once this block ends. So the answer must be in the socket's hands first (flush).
                await call.answer({"status": answer.status, "media_type": answer.media_type,
                                   "steps": answer.steps_seconds, "worker": answer.worker_seconds},
                                  answer.parts, flush=True)
        finally:
            # a program cancelled mid-step runs on in its thread: the front may still ask where it is
            if isinstance(tag, int) and not watch.running:
                self.running.pop(tag, None)

    async def where(self, call: Call) -> None:
        """Where the program the front tagged ``tag`` is (``ProgramWatch.position``), or ``done``: the
        front asks when one runs long (``step_deadline``)."""
        tag = call.fields.get("tag")
        watch = self.running.get(tag) if isinstance(tag, int) else None
        if watch is not None and watch.finished:
            del self.running[tag]
        await call.answer({"done": True} if watch is None else watch.position())

    async def read_tensor(self, call: Call) -> None:
        """The tensor message as msgpack in the body (its data may be big: headers carry small fields only)."""
        f = call.fields
        message = await self._ready().read_tensor(f["sid"], None, f["tid"], value=f["value"], grad=f["grad"],
                                                  as_json=f["as_json"])
        await call.answer(parts=[msgpack.packb(message, use_bin_type=True)])

    async def load(self, call: Call) -> None:
        store = self._ready().store
        await call.answer({"sessions": len(store), "bytes": store.budget.held})

    async def figures(self, call: Call) -> None:
        """What the front's /metrics shows of this tenant: its sessions, tensors, bytes, device memory, step times,
        and its templates' variants (this process compiles them)."""
        store = self._ready().store
        sessions = store.sessions()
        device = store.device
        await call.answer({"sessions": len(sessions), "tensors": sum(len(s.tensors) for s in sessions),
                           "bytes": store.budget.held, "steps": self.steps.rows(),
                           "device_memory": torch.cuda.memory_allocated(device) if device.type == "cuda" else 0,
                           "compile": template_compile.COMPILER.figures()})

    async def readiness(self, call: Call) -> None:
        ready, body = await self._ready().readiness()
        await call.answer({"ready": ready, "body": body})

    async def return_slack(self, call: Call) -> None:
        await call.answer({"bytes": self._ready().store.budget.release_slack()})

    async def save_state(self, call: Call) -> None:
        """Write every session to the state directory (the front is stopping gracefully)."""
        sessions = self._ready()
        if self.state_dir is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "save_state: no state directory was given")
        saved = await asyncio.to_thread(state_volume.save, sessions, self.state_dir, None)
        await call.answer({"sessions": saved})

    async def stop(self, call: Call) -> None:
        await call.answer()
        self.stopping.set()

    def _ready(self) -> LocalSessions:
        if self.sessions is None:
            raise ProtocolError(ErrorCode.TOO_MANY, "the tenant's worker is still starting: retry")
        return self.sessions

    async def _ask_bytes(self, need: int, want: int) -> int:
        fields, _ = await self.channel.call("grant_bytes", {"need": need, "want": want})
        return int(fields.get("bytes", 0))

    def _return_bytes(self, nbytes: int) -> None:
        if self.channel is not None and not self.channel.closed:
            asyncio.ensure_future(self._quietly(self.channel.call("return_bytes", {"bytes": nbytes})))

    @staticmethod
    async def _quietly(call) -> None:
        try:
            await call
        except Exception:  # the front is gone: nothing to return the bytes to
            pass


def _limit_memory(settings: Settings) -> int | None:
    """Bound this process's private memory (``RLIMIT_DATA``): what it holds now (torch, the op table,
    restored sessions), each thread it may start a stack, and ``worker_memory_bytes`` (automatic:
    half as much again as the bytes its sessions may hold, for kernels' temporaries). The limit, or
    None where none is set (a GPU, ``-1``)."""
    if settings.worker_memory_bytes < 0 or settings.resolved_device().type == "cuda":
        return None
    allowance = settings.worker_memory_bytes or worker_memory_default(settings)
    # each worker thread opens an OpenMP team of its own on the CPU (service.backends.workers)
    threads = settings.resolved_workers() * (torch.get_num_threads() + 1) + 16
    limit = process_guards.data_bytes() + threads * process_guards.stack_bytes() + allowance
    return limit if process_guards.limit_data(limit) else None


def worker_memory_default(settings: Settings) -> int:
    """``worker_memory_bytes`` left at 0: what one worker's sessions may hold, and half as much again."""
    return min(settings.max_bytes_per_token, settings.max_total_bytes) * 3 // 2


async def serve(fd: int) -> None:
    worker = TenantWorker()
    closed = asyncio.Event()
    worker.channel = await open_channel(socket.socket(fileno=fd), worker.handlers, flush_every_write=True,
                                        on_close=lambda because: closed.set())
    stopping = asyncio.ensure_future(worker.stopping.wait())
    front_gone = asyncio.ensure_future(closed.wait())
    await asyncio.wait((stopping, front_gone), return_when=asyncio.FIRST_COMPLETED)
    if not worker.stopping.is_set():
        os._exit(0)  # the front is gone without asking to save: nothing here can be reached again
    worker.channel.close("stopped")
    if worker.sessions is not None:
        worker.sessions.shutdown()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it; plain asyncio works the same, a little slower
        asyncio.run(serve(int(argv[0])))
    else:
        uvloop.run(serve(int(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

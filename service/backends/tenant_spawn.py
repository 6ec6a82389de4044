"""``WorkerProcess``: the front's handle on one tenant's worker process: starting it, calling it, stopping it.

A worker is ``python -m remote_autograd.service.backends.tenant_worker FD`` with its end of a
socketpair as ``FD``, in a session of its own (a terminal's signals reach the front,
which decides), with the front's environment less the tokens: a worker never learns
any token, its own included. It is told its settings, id prefix and state directory in
the first call (``hello``), and answers once its saved sessions are restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from remote_autograd.proto import ErrorCode, ProtocolError

from ..settings import Settings
from .tenant_channel import Channel, ChannelClosed, open_channel
from .tenant_worker import settings_to_wire

_HELLO_SECONDS = 120.0  # a new worker imports torch (and opens CUDA) before it answers
_STOP_SECONDS = 30.0
_HIDDEN_VARIABLES = ("REMOTE_AUTOGRAD_TOKENS", "REMOTE_AUTOGRAD_TOKEN")


class WorkerProcess:
    """One worker process. ``sessions`` and ``creating`` are the front's count of what it holds."""

    def __init__(self, owner: str | None, label: str, proc: asyncio.subprocess.Process, prefix: str) -> None:
        self.owner, self.label, self.proc = owner, label, proc
        self.key = prefix  # the byte pool's key: unique to this process
        self.prefixes = {prefix}  # the id prefixes it serves: its own and those of the sessions it restored
        self.channel: Channel | None = None
        self.sessions = 0
        self.creating = 0
        self.last_busy = time.monotonic()
        self.stopped = False  # stopped on purpose (idle, or the front is stopping)
        self.gone = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, owner: str | None, label: str, settings: Settings, state_dir: Path | None, *,
                    handlers_for: Callable[["WorkerProcess"], dict],
                    on_end: Callable[["WorkerProcess"], None]) -> "WorkerProcess":
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k not in _HIDDEN_VARIABLES}
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "remote_autograd.service.backends.tenant_worker", str(theirs.fileno()),
                pass_fds=(theirs.fileno(),), env=env, start_new_session=True)
        finally:
            theirs.close()  # the child has it now; the front must not keep the other end open
        worker = cls(owner, label, proc, secrets.token_hex(4))

        def closed(because: str) -> None:
            worker.gone = True
            if not worker.stopped and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # it broke the protocol, or is ending anyway: never left running unheard
            on_end(worker)

        worker.channel = await open_channel(ours, handlers_for(worker), on_close=closed)
        worker_settings = settings_to_wire(settings)
        worker_settings.update(tokens=[], metrics_token="", tenant_processes="off")  # no token, none of its own
        try:
            fields, _ = await asyncio.wait_for(worker.channel.call("hello", {
                "settings": worker_settings, "prefix": worker.key, "label": label,
                "state_dir": str(state_dir) if state_dir else None}), _HELLO_SECONDS)
        except (ChannelClosed, ProtocolError, asyncio.TimeoutError) as exc:
            worker.channel.close("did not start")
            await worker.ended()
            raise ProtocolError(ErrorCode.TOO_MANY, f"{label}'s worker process could not start "
                                f"({worker.how_it_ended()}: {exc}): retry later") from None
        worker.prefixes.update(fields.get("prefixes", ()))
        worker.sessions = int(fields.get("sessions", 0))  # restored ones
        return worker

    async def call(self, name: str, fields: dict | None = None, body=b"", *, watch=None) -> tuple[dict, bytes]:
        self.last_busy = time.monotonic()
        return await self.channel.call(name, fields, body, watch=watch)

    async def ended(self, timeout: float = 5.0) -> None:
        """Wait (a little) until the process has exited, so ``how_it_ended`` can say how."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout)

    def how_it_ended(self) -> str:
        code = self.proc.returncode
        if code is None:
            return f"(pid {self.pid}) closed its channel ({self.channel.closed_because})"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"(pid {self.pid}) was killed by {signal.Signals(-code).name}"
        return f"(pid {self.pid}) exited with status {code}"

    async def stop(self) -> None:
        """Ask it to stop, and wait until it has (killing it if it does not)."""
        self.stopped = True
        with contextlib.suppress(ChannelClosed, ProtocolError):
            await asyncio.wait_for(self.channel.call("stop"), _STOP_SECONDS)
        try:
            await asyncio.wait_for(self.proc.wait(), _STOP_SECONDS)
        except asyncio.TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self.channel.close("stopped")

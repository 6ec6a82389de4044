"""``WorkerProcess``: the front's handle on one tenant's worker process: starting it, calling it, stopping it.

A worker is ``python -m remote_autograd.service.backends.tenant_worker FD FRONT`` with its end
of a socketpair as ``FD`` and the front's pid as ``FRONT`` (it dies with that process:
``process_guards.die_with_parent``), in a session of its own (a terminal's signals reach
the front, which decides). A worker never learns any token, its own included: its
environment is built from an allow-list of the front's (``worker_environment``: what
Python, torch, CUDA and the locale read; never a name that looks secret), nothing
secret is on its command line, its settings come without tokens, and it knows its
tenant by a label (``tenant-0``), not by the token. The front itself is not readable by
its workers (``process_guards.forbid_reading``, set by ``service/__main__.py``). It is
told its settings, id prefix and state directory in the first call (``hello``), and
answers once its saved sessions are restored.
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
# The environment a worker gets: these names, and names with these prefixes, of the front's; never
# one with a word of _SECRET in it. Settings reach it in ``hello``, so no REMOTE_AUTOGRAD_* at all.
_PASSED = frozenset(("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
                     "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
                     "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD",
                     "XDG_CACHE_HOME"))
_PASSED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "CUBLAS_", "CUDNN_", "NCCL_", "OMP_", "GOMP_", "KMP_", "MKL_",
                    "OPENBLAS_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TRITON_", "MALLOC_")
_SECRET = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY", "AUTH", "COOKIE")


def worker_environment(environ: dict[str, str]) -> dict[str, str]:
    """What of ``environ`` a tenant's worker gets: an allow-list, so a secret added to the front's
    environment tomorrow (under any name) does not reach a worker by default."""
    return {name: value for name, value in environ.items()
            if (name in _PASSED or name.startswith(_PASSED_PREFIXES)) and not any(w in name.upper() for w in _SECRET)}


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
        self.ended_because: str | None = None  # killed by the front (``end``): why

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def start(cls, owner: str | None, label: str, settings: Settings, state_dir: Path | None, *,
                    handlers_for: Callable[["WorkerProcess"], dict],
                    on_end: Callable[["WorkerProcess"], None]) -> "WorkerProcess":
        ours, theirs = socket.socketpair()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "remote_autograd.service.backends.tenant_worker", str(theirs.fileno()),
                str(os.getpid()), pass_fds=(theirs.fileno(),), env=worker_environment(dict(os.environ)),
                start_new_session=True)
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

    def end(self, because: str) -> None:
        """Kill it now (SIGKILL): its sessions are lost, ``because`` says why (``how_it_ended``)."""
        self.ended_because = because
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def how_it_ended(self) -> str:
        if self.ended_because is not None:
            return f"(pid {self.pid}) {self.ended_because}"
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

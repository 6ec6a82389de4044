"""The embedded default: ``connect()`` with no URL starts the service on loopback, once per process.

This is the only place the client touches the service package, and only when called.

The server is ``python -m remote_autograd.service`` in a child process, as an operator
would start it, so the embedded default is exactly as fast as a separate server. (It
used to run uvicorn in a thread of the user's process; every round trip then went
through the one GIL the user's code, the event loop and the workers all wanted, many
times slower than the same server in a process of its own.)

It keeps its sessions in its own process (``REMOTE_AUTOGRAD_TENANT_PROCESSES=off``, unless
the environment says otherwise), not in a worker process per tenant as a standalone server
does: it is already a process of its own, serving only this program's user, whose tensors
are all it holds, and it holds no token. A crashing kernel ends it and its sessions, exactly
what ending a worker would lose, and the next ``connect()`` starts it again; a worker would
cost a second import of torch (and, on a GPU, a second CUDA context) for nothing to protect.

The child lives as long as this process: it is stopped at exit, and it stops itself
when this process dies without exiting (its stdin is a pipe only this process writes
to; end of file means we are gone). It runs in a session of its own, so a Ctrl-C meant
for the user's script or notebook cell does not stop the server under it. What it
writes (its JSON log on stderr) goes to a file whose end is quoted when it fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

_TENANT_PROCESSES = "REMOTE_AUTOGRAD_TENANT_PROCESSES"
_START_TIMEOUT = 120.0  # seconds; a cold start imports torch (and CUDA) in the child
_lock = threading.Lock()
_server: "EmbeddedServer | None" = None


@dataclass
class EmbeddedServer:
    """The child process serving ``url``, and the file its output goes to."""

    url: str
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (uvicorn finishes what is running), then SIGKILL if it hangs; removes the log."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        self.log.unlink(missing_ok=True)


def embedded_url() -> str:
    """The URL of this process's embedded server, starting it on first use (or again, if it died)."""
    return embedded_server().url


def embedded_server() -> EmbeddedServer:
    global _server
    with _lock:
        if _server is None or not _server.alive():
            if _server is not None:
                _server.stop()
            else:
                atexit.register(_stop_at_exit)
            _server = _start()
        return _server


def _stop_at_exit() -> None:
    if _server is not None:
        _server.stop()


def _start(attempts: int = 3) -> EmbeddedServer:
    for attempt in range(attempts):
        server = _launch(_free_port())
        try:
            _wait_healthy(server)
            return server
        except RuntimeError:
            tail = server.log_tail()
            server.stop()
            # The port was free when we looked; another process may have taken it since.
            if "address already in use" not in tail.lower() or attempt == attempts - 1:
                raise RuntimeError(f"the embedded remote-autograd server did not start; it said:\n{tail}") from None
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(port: int) -> EmbeddedServer:
    from remote_autograd.service import openmp_wait

    # The child imports torch (through this package) before the service's entry point runs, so the
    # OpenMP wait policy of a server beside its client goes in its environment here.
    env = {_TENANT_PROCESSES: "off", **os.environ}  # its sessions in its own process: the module's docstring
    openmp_wait.settle("127.0.0.1", env)
    fd, name = tempfile.mkstemp(prefix="remote-autograd-embedded-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "remote_autograd.client.transport._embedded", "--host", "127.0.0.1",
             "--port", str(port)],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return EmbeddedServer(f"http://127.0.0.1:{port}", process, Path(name))


def _wait_healthy(server: EmbeddedServer) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while server.alive() and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.02)
    raise RuntimeError("not healthy")


def service_app(**settings):
    """The service's ASGI app, configured as ``python -m remote_autograd.service`` would be
    (``REMOTE_AUTOGRAD_*``), with ``settings`` (``Settings`` fields) on top; its sessions in this
    process unless the environment or ``settings`` say otherwise (an app in the user's process)."""
    from remote_autograd.service.http.app import create_app
    from remote_autograd.service.settings import Settings

    if _TENANT_PROCESSES not in os.environ:
        settings.setdefault("tenant_processes", "off")
    return create_app(Settings.from_env(**settings))


def _serve_until_parent_goes(argv: list[str]) -> int:
    """The child: the service's own entry point, plus a thread that stops it when stdin closes."""

    def watch_parent() -> None:
        while sys.stdin.buffer.read(1 << 12):
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown, as at exit

    threading.Thread(target=watch_parent, name="remote-autograd-parent-watch", daemon=True).start()
    from remote_autograd.service.__main__ import main

    return main(argv)


if __name__ == "__main__":
    raise SystemExit(_serve_until_parent_goes(sys.argv[1:]))

"""The one launcher of real servers for tests: a chosen port, signals, logs.

``conftest.start_server`` (a URL) covers the usual case; the fault, security and
observability tests also restart a server on the same port, send it SIGTERM
mid-request, or read what it logged (to a file: a pipe nobody reads would fill up
and stall the server).
"""

from __future__ import annotations

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
from functools import partial
from pathlib import Path
from typing import Iterator

import httpx
import msgpack

from .answer_schema import response_hook

AUTH = "Authorization"
ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    port: int
    proc: subprocess.Popen
    log: Path

    def logged(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Send ``sig`` and wait for the exit status (killing it after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        """Stop it (if it runs) and remove its log."""
        self.stop()
        self.log.unlink(missing_ok=True)


def launch(port: int | None = None, *, nofile: int | None = None, **env: str) -> Server:
    """``python -m remote_autograd.service`` on 127.0.0.1:``port`` with ``env``; returns once ``/healthz`` answers.

    ``nofile`` caps the server's open files (``RLIMIT_NOFILE``), as a container's ``ulimits`` would.
    """
    port = port or _free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("REMOTE_AUTOGRAD_")}
    if "REMOTE_AUTOGRAD_DEVICE" in os.environ:  # the suite on a GPU host: REMOTE_AUTOGRAD_DEVICE=cuda make test
        full_env["REMOTE_AUTOGRAD_DEVICE"] = os.environ["REMOTE_AUTOGRAD_DEVICE"]
    full_env.update(env)
    log = Path(tempfile.mkstemp(prefix="remote-autograd-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "remote_autograd.service", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=ROOT, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=None if nofile is None else partial(_limit_open_files, nofile))
    server = Server(f"http://127.0.0.1:{port}", port, proc, log)
    deadline = time.monotonic() + 120  # a Ray front joins its cluster first
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.logged()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/healthz", timeout=1).status_code == 200:
                return server
        if time.monotonic() > deadline:
            server.stop(signal.SIGKILL)
            raise RuntimeError("server did not become healthy in 120 s")
        time.sleep(0.05)


def _limit_open_files(n: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


@contextlib.contextmanager
def running(port: int | None = None, *, nofile: int | None = None, **env: str) -> Iterator[Server]:
    server = launch(port, nofile=nofile, **env)
    try:
        yield server
    finally:
        server.close()


def api(url: str, token: str | None = None, timeout: float = 30, **kw) -> httpx.Client:
    """A raw JSON client with the protocol header (and the token when given); every answer it reads is
    held to proto/schema.json (``answer_schema``)."""
    headers = {"Remote-Autograd-Protocol": "1"}
    if token:
        headers[AUTH] = f"Bearer {token}"
    return httpx.Client(base_url=url, headers=headers, timeout=timeout, event_hooks={"response": [response_hook]}, **kw)


def program(c: httpx.Client, sid: str, steps: list, pid: str | None = None) -> httpx.Response:
    """POST one program (JSON) and return the raw response."""
    pid = pid or os.urandom(8).hex()
    return c.post(f"/v1/sessions/{sid}/programs", json={"id": pid, "steps": steps})


def put(tid: str, values: list, dtype: str = "float32", requires_grad: bool = False,
        shape: list[int] | None = None) -> dict:
    """A put step of a tensor given as a flat JSON list (1-d unless ``shape`` says otherwise)."""
    shape = [len(values)] if shape is None else shape
    return {"kind": "put", "id": tid, "value": {"dtype": dtype, "shape": shape, "data": values},
            "requires_grad": requires_grad}


def call(op: str, *args, out=(), grad_enabled: bool = True, **kwargs) -> dict:
    return {"kind": "call", "op": op, "args": list(args), "kwargs": kwargs, "out": list(out),
            "grad_enabled": grad_enabled}


def ref(tid: str) -> dict:
    return {"ref": tid}


def wait_in_flight(c: httpx.Client, n: int = 1, timeout: float = 10) -> None:
    """Wait until the server says ``n`` programs are admitted and running (its metrics gauge)."""
    deadline = time.monotonic() + timeout
    while f"remote_autograd_programs_in_flight {float(n)}" not in c.get("/metrics").text:
        assert time.monotonic() < deadline, f"{n} program(s) never ran at once"
        time.sleep(0.02)


def sleep_program(url: str, sid: str, seconds: float) -> httpx.Response:
    """A program of one ``_test_sleep`` step (test-only ops), on a client of its own (for threads)."""
    with api(url) as own:
        return program(own, sid, [call("_test_sleep", seconds, out=["slept"])])


def error_of(r: httpx.Response, status: int, code: str, *words: str) -> dict:
    """The error of an answer that must be ``status``/``code`` and whose message has every word."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert err["code"] == code, err
    for w in words:
        assert w in err["message"], (w, err["message"])
    return err


def read_answer(raw: socket.socket) -> str:
    """A whole HTTP answer from a raw socket: its head and Content-Length bytes of body, which the
    server may write as separate segments."""
    data = b""
    while b"\r\n\r\n" not in data and (piece := raw.recv(65536)):
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (piece := raw.recv(65536)):
        body += piece
    return (head + b"\r\n\r\n" + body).decode()


def slow_fetch(port: int, sid: str, tid: str, *, token: str | None = None, burst: int = 2 << 20,
               every: float = 1.0) -> tuple[socket.socket, list]:
    """A program fetching ``tid`` (msgpack), on a socket of its own whose answer is read ``burst`` bytes at
    once every ``every`` seconds, in a thread, until the socket closes or fails: a reader slower
    than the server (a receive buffer of 256 KiB, so the kernel does not take the answer for it).
    The socket (close it to stop) and ``[bytes read so far, whether the connection ended]``."""
    body = msgpack.packb({"id": os.urandom(8).hex(), "steps": [{"kind": "fetch", "id": tid}]})
    auth = f"{AUTH}: Bearer {token}\r\n" if token else ""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 10)
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: x\r\n{auth}Remote-Autograd-Protocol: 1\r\n"
              f"Content-Type: application/msgpack\r\nAccept: application/msgpack\r\nContent-Length: {len(body)}"
              "\r\n\r\n".encode() + body)
    got = [0, False]

    def read() -> None:
        try:
            while True:
                time.sleep(every)
                taken = 0
                while taken < burst:
                    piece = s.recv(min(burst - taken, 1 << 20))
                    if not piece:
                        raise ConnectionResetError("closed by the server")
                    taken += len(piece)
                got[0] += taken
        except OSError:
            got[1] = True

    threading.Thread(target=read, daemon=True).start()
    return s, got


def session_pids(server: Server, c: httpx.Client, sid: str) -> list[int]:
    """The processes that hold session ``sid``'s memory: the server's, and its token's worker
    process when sessions live in one (``GET /v1/sessions/{sid}`` names it "<label> (pid N)")."""
    worker = c.get(f"/v1/sessions/{sid}").json()["worker"]
    pids = [server.proc.pid]
    if "(pid " in worker:
        pids.append(int(worker.rsplit("pid ", 1)[1].rstrip(")")))
    return pids


def reset_peak(pids: list[int]) -> None:
    """Start each process's ``VmHWM`` again from what it holds now (``/proc/<pid>/clear_refs``), so that
    ``memory_of(pids, "VmHWM")`` after a request shows that request's peak, not an earlier one's."""
    for pid in pids:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")


def memory_of(pids: list[int], field: str = "VmRSS") -> int:
    """``field`` of ``/proc/<pid>/status`` (``VmRSS`` resident now, ``VmHWM`` its high-water mark)
    summed over ``pids``, in bytes."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            total += next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))
    return total

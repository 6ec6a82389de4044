"""The embedded default (``connect()`` with no URL): the service in a child process, one per process,
reused by every connect, gone when the process exits or dies, and saying why when it cannot start."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remote_autograd.client.transport import _embedded

from ...servers import ROOT

pytestmark = pytest.mark.slow  # each starts the embedded server, a process of its own

_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch
    from remote_autograd import client
    from remote_autograd.client.transport import _embedded

    first, second = client.connect(), client.connect(pipeline=False)
    server = _embedded.embedded_server()
    assert first._transport.base_url == second._transport.base_url == server.url
    x = torch.randn(5, 3, dtype=torch.float64)
    w = first.tensor(x, requires_grad=True)
    (w * w).sum().backward()
    assert torch.equal(w.grad.to_torch(), 2 * x)
    assert torch.equal((second.tensor(x) + 1).to_torch(), x + 1)
    print(server.process.pid, server.log, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)
""")


def _script(mode: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMOTE_AUTOGRAD_")}
    return subprocess.Popen([sys.executable, "-c", _SCRIPT, mode], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _gone(pid: int, within: float = 30.0) -> bool:
    """The process has exited (a zombie nobody reaps counts: it serves nothing)."""
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def test_one_child_per_process_reused_and_stopped_at_exit():
    proc = _script("exit")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    pid, log = out.split()
    assert _gone(int(pid)), "the embedded server outlived its process"
    assert not Path(log).exists()


def test_the_child_stops_itself_when_its_process_is_killed():
    proc, pid = _script("wait"), None
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        pid = int(line.split()[0])
        proc.send_signal(signal.SIGKILL)  # no atexit: only the closed stdin pipe tells the child
        proc.wait(timeout=30)
        assert _gone(pid), "the embedded server outlived a killed process"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        if pid is not None and not _gone(pid, within=0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # this test's orphan, when the test fails


def test_a_server_that_cannot_start_says_why(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REMOTE_AUTOGRAD_MAX_STEPS_PER_PROGRAM", "many")  # the child's settings refuse it
    with pytest.raises(RuntimeError, match=r"(?s)did not start.*invalid literal for int\(\).*'many'"):
        _embedded._start()


def test_the_embedded_server_waits_passively_beside_its_client(monkeypatch: pytest.MonkeyPatch):
    """Its OpenMP threads sleep between regions instead of spinning on the client's cores
    (``service/openmp_wait.py``); libgomp prints what it runs with when torch loads it."""
    monkeypatch.setenv("OMP_DISPLAY_ENV", "VERBOSE")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    server = _embedded._start()
    try:
        spin = [line for line in server.log_tail(200).splitlines() if "GOMP_SPINCOUNT" in line]
        assert spin and spin[0].split("=")[1].strip() == "'0'", server.log_tail()  # libgomp's default: 300000
    finally:
        server.stop()

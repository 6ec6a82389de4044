"""``wan``: the SDK and torch's dist_autograd on this machine alone, then over one link with real delay, 10 ms each way.

The section makes the link (``bench.wan_link``), starts a server and torch's RPC peer
(``bench.torch_peer``) on its server side, and runs the measuring client (``bench.wan_measure``)
on its client side; the loopback server the other sections use plays no part. A GPT step, an MLP
step and a 64 MiB upload, each beside torch's own way of doing it: where a step is one request
for the SDK and several round trips for torch, the delay shows it. Everything it starts and makes
is stopped and removed on the way out; where no link can be made it says why in one line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Iterator

from remote_autograd.service.engine.template_compile import compiler_missing

from ._util import ROOT, free_port
from .wan_link import Link, LinkUnavailable, delayed_link, loopback
from .wan_measure import COMPILE_WAIT_S, COMPILED_FROM_REPEAT

DELAY_MS = 10
SERVER_PORT, STORE_PORT = 8000, 29500  # in namespaces of our own: nothing else listens there
MEASURE_TIMEOUT_S = 600
# One intra-op thread for each of the three processes (unless OMP_NUM_THREADS says otherwise): the link is
# the subject here, and on a small shared machine three processes' thread pools oversubscribe the cores, where
# every parallel op waits for its threads (a local GPT step ran many times slower so on a busy 2-core machine).
# c10d's warning that a namespace without DNS cannot name a socket's host is true and no matter here.
CHILD_ENV = {"OMP_NUM_THREADS": "1", **os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _server(link: Link, port: int) -> list[str]:
    return [sys.executable, "-m", "remote_autograd.service", "--host", link.server_host, "--port", str(port)]


@contextlib.contextmanager
def _started(argv: list[str], **env: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(argv, cwd=ROOT, env={**CHILD_ENV, **env})
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _measure_over(link: Link, repeat: int, ports: tuple[int, int] = (SERVER_PORT, STORE_PORT),
                  compiling_port: int | None = None) -> str | None:
    """Run the server and torch's peer on the link's server side and the measuring client on its client
    side (``ports``: the server's and torch's rendezvous store's); what went wrong, if anything. With
    ``compiling_port``, a second server there compiles its templates (``REMOTE_AUTOGRAD_COMPILE=on``): the
    compiled steps are timed against it too, once compiled."""
    server_port, store_port = ports
    master = f"{link.server_host}:{store_port}"
    url = f"http://{link.server_host}:{server_port}"
    peer = [sys.executable, "-m", "bench.torch_peer", "--master", master, "--ifname", link.server_ifname]
    measuring = [sys.executable, "-m", "bench.wan_measure", "--url", url, "--master", master,
                 "--ifname", link.client_ifname, "--repeat", str(repeat)]
    with contextlib.ExitStack() as started:
        started.enter_context(_started(link.inside("server", _server(link, server_port))))
        started.enter_context(_started(link.inside("server", peer)))
        if compiling_port is not None:
            started.enter_context(_started(link.inside("server", _server(link, compiling_port)),
                                           REMOTE_AUTOGRAD_COMPILE="on"))
            measuring += ["--compiling-url", f"http://{link.server_host}:{compiling_port}"]
        timeout = MEASURE_TIMEOUT_S + (2 * COMPILE_WAIT_S if compiling_port is not None else 0)  # two models compile
        try:
            status = subprocess.run(link.inside("client", measuring), cwd=ROOT, env=CHILD_ENV,
                                    timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return f"the measuring client was stopped after {timeout} s"
        return f"the measuring client exited with status {status}" if status else None


def _exit_on_term(signum, frame) -> None:
    raise SystemExit(128 + signum)  # a killed bench still leaves through the finally blocks


def run(url: str | None = None, repeat: int = 20) -> None:
    print(f"\n[wan] over a link with {DELAY_MS} ms delay each way: the SDK (one request per step) beside torch "
          "dist_autograd + DistributedOptimizer (forward, backward and optimizer step each a round trip)")
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        same_machine = loopback()  # first on this machine alone: the requirement holds there too
        print(f"  {same_machine.describe()}")
        # the requirement's figures with the server compiling too, where it can (a C++ compiler) and the run is
        # long enough to time compiled steps at all
        compiling = free_port() if repeat >= COMPILED_FROM_REPEAT and compiler_missing() is None else None
        failed = _measure_over(same_machine, repeat, (free_port(), free_port()), compiling)
        if failed:
            print(f"  {failed}")
        with delayed_link(DELAY_MS) as link:
            print(f"  link: {link.describe()}")
            print(f"  each process computes on {CHILD_ENV['OMP_NUM_THREADS']} intra-op thread(s) (OMP_NUM_THREADS)")
            failed = _measure_over(link, repeat)
            if failed:
                print(f"  {failed}")
    except LinkUnavailable as exc:
        print(f"  skipped: no delayed link can be made here: {exc}")
    finally:
        signal.signal(signal.SIGTERM, previous)

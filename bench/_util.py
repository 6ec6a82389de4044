"""Timing and server helpers for the benchmarks (printed figures, never asserted)."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent


def measure(fn: Callable[[], object], *, repeat: int = 300, warmup: int = 30, per: int = 1) -> list[float]:
    """Seconds per call (divided by ``per`` for amortised figures), after a warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / per)
    return times


def summary(times: list[float]) -> tuple[float, float]:
    """(median, p90) in microseconds."""
    ordered = sorted(times)
    return statistics.median(ordered) * 1e6, ordered[int(0.9 * (len(ordered) - 1))] * 1e6


def row(label: str, times: list[float], baseline: float | None = None, extra: str = "", unit: str = "us") -> float:
    """Print a figure's median and p90 (in ``unit``: "us" or "ms"), and its ratio to ``baseline`` (a median in
    microseconds); return the median in microseconds."""
    med, p90 = summary(times)
    ratio = f"{med / baseline:7.2f}x" if baseline else " " * 8
    scale = 1e-3 if unit == "ms" else 1.0
    print(f"  {label:<48} median {med * scale:9.1f} {unit}   p90 {p90 * scale:9.1f} {unit}  {ratio} {extra}")
    return med


def requests_per_step(sess, step: Callable[[], object], n: int = 5) -> float:
    """HTTP requests a session sends per call of ``step`` (counted on the wire, over ``n`` calls)."""
    before = sess.requests
    for _ in range(n):
        step()
    return (sess.requests - before) / n


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_PIDS: dict[str, int] = {}  # url -> pid, for figures read from /proc (peak RSS)


def peak_rss_bytes(pid: int | None = None) -> int:
    """VmHWM (peak resident set) of a process, in bytes; this process by default."""
    return _status_bytes(pid, "VmHWM")


def rss_bytes(pid: int | None = None) -> int:
    """VmRSS (resident set now) of a process, in bytes; this process by default."""
    return _status_bytes(pid, "VmRSS")


def _status_bytes(pid: int | None, key: str) -> int:
    with open(f"/proc/{pid or 'self'}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def serve(module_args: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``python <module_args> --port P`` on loopback until /healthz answers; yields the URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, *module_args, "--host", "127.0.0.1", "--port", str(port)],
                            cwd=ROOT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a Ray front joins its cluster first
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{module_args} did not start")
            time.sleep(0.05)
        SERVER_PIDS[url] = proc.pid
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)

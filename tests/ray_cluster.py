"""Real Ray clusters on this machine for the Ray backend's tests (``ray.cluster_utils.Cluster``).

Each node is a real raylet and its worker processes; nodes declare worker slots as fake
GPUs (``num_gpus=1``) or as the ``remote_autograd_worker`` resource. Every process that
joins is told to stay on 127.0.0.1 (see ``RAY_ENV``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Iterator

import httpx

# Without this Ray rewrites a RAY_ADDRESS of 127.0.0.1 to the machine's interface address,
# where the GCS does not listen, and a front joining from outside hangs.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
NODE = {"node_ip_address": "127.0.0.1", "include_dashboard": False}


class RayUnavailable(RuntimeError):
    """Ray is not installed, or cannot start a cluster on this machine (the reason says which)."""


# A Ray node waits a fixed 30 s for its raylet to register (ray/_private/node.py), which a machine
# busy with the rest of the suite can exceed: that one failure is tried again, twice.
_STARTS, _SLOW_START = 3, "timed out during startup"
_FAILED: list[str] = []  # why Ray could not start, once it could not


def _descendants() -> set[int]:
    """The ids of this process's children, theirs, and so on (from ``/proc``)."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry.name}/stat") as stat:  # "pid (comm) state ppid ..."
                    parents[int(entry.name)] = int(stat.read().rpartition(")")[2].split()[1])
    found, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        kids = [kid for kid, parent in parents.items() if parent == pid]
        found.update(kids)
        todo += kids
    return found


@contextlib.contextmanager
def cluster_or_skip(*nodes: dict) -> Iterator[tuple[object, list]]:
    """``local_cluster`` in a test: skipped (with Ray's own reason) only when Ray cannot start here, never on CI."""
    import pytest

    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(local_cluster(*nodes))
        except RayUnavailable as exc:
            if os.environ.get("CI"):  # CI runs where Ray can start: a skip there would hide a failure
                raise
            pytest.skip(str(exc))
        yield cluster


@contextlib.contextmanager
def local_cluster(*nodes: dict) -> Iterator[tuple[object, list]]:
    """A cluster whose head is ``nodes[0]`` and whose other nodes are the rest: ``(cluster, [node, ...])``."""
    os.environ.update(RAY_ENV)  # before Ray is imported: it reads the variable once
    try:
        from ray.cluster_utils import Cluster
    except ImportError as exc:
        raise RayUnavailable(f"the Ray backend needs ray (pip install -e '.[ray]'): {exc}") from None
    if _FAILED:  # once per process: each try of a cluster that cannot start here takes a minute
        raise RayUnavailable(_FAILED[0])
    handler = signal.getsignal(signal.SIGTERM)  # a Ray node installs its own in the process that starts it
    for attempt in range(1, _STARTS + 1):
        before = _descendants()
        try:
            cluster = Cluster(initialize_head=True, head_node_args={**NODE, **nodes[0]})
            started = [cluster.head_node] + [cluster.add_node(**NODE, **extra) for extra in nodes[1:]]
            break
        except Exception as exc:  # noqa: BLE001  (whatever keeps Ray from starting on this machine)
            for pid in _descendants() - before:  # the half-started nodes' processes, none of them ours
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if attempt == _STARTS or _SLOW_START not in str(exc):
                _FAILED.append(f"Ray cannot start a local cluster here: {type(exc).__name__}: {exc}")
                raise RayUnavailable(_FAILED[0]) from exc
        finally:
            signal.signal(signal.SIGTERM, handler)
    try:
        yield cluster, started
    finally:
        cluster.shutdown()
        signal.signal(signal.SIGTERM, handler)


def front_env(address: str, **env: str) -> dict[str, str]:
    """The environment of a front process on the Ray backend joining ``address``."""
    return {"REMOTE_AUTOGRAD_BACKEND": "ray", "RAY_ADDRESS": address, **RAY_ENV, **env}


def ready_workers(url: str, want: int, timeout: float = 90) -> dict:
    """The front's ``/readyz`` answer once it counts ``want`` workers up; raises after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        body = httpx.get(url + "/readyz", timeout=30).json()
        if body.get("workers") == want:
            return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Ray front never had {want} worker(s) up: {body}")
        time.sleep(0.5)

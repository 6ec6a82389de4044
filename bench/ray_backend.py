"""The Ray backend beside the in-process one: the cost of the hop, and throughput with one worker vs two.

A local Ray cluster (one node declaring one ``remote_autograd_worker`` slot) and a front on
it; then a second node joins, so new sessions spread over two workers. Every figure is
taken through the same SDK as the in-process ones.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch
from torch import nn

from remote_autograd import client
from tests.ray_cluster import NODE, front_env, local_cluster, ready_workers

from ._util import measure, row, serve
from .training import _mlp, _step_fn

SLOT = {"num_cpus": 1, "resources": {"remote_autograd_worker": 1}}
SESSIONS, STEPS = 4, 15


def run(url: str) -> None:
    print("\n[ray] the Ray backend (a front and worker actors on a local Ray cluster) beside in-process")
    with local_cluster(SLOT) as (cluster, _), serve(["-m", "remote_autograd.service"],
                                                     front_env(cluster.address)) as ray_url:
        ready_workers(ray_url, 1, timeout=120)
        a, b = torch.randn(16), torch.randn(16)
        for label, where in (("in-process", url), ("ray", ray_url)):
            with client.connect(where, pipeline=False) as sess:
                x, y = sess.tensor(a), sess.tensor(b)
                sess.sync()
                base = row(f"{label}: eager x + y", measure(lambda: x + y, repeat=300, warmup=30))
                _bulk(sess, label)
            with contextlib.ExitStack() as sessions:
                step = _mlp_step(where, sessions)
                row(f"{label}: MLP 64x784 step (SGD, loss.item())", measure(step, repeat=30, warmup=5), base)
        one = _throughput(ray_url)
        print(f"  ray, 1 worker: {SESSIONS} concurrent sessions        {one:8.1f} steps/s")
        cluster.add_node(**NODE, **SLOT)
        ready_workers(ray_url, 2, timeout=120)
        two = _throughput(ray_url)
        print(f"  ray, 2 workers: {SESSIONS} concurrent sessions       {two:8.1f} steps/s   "
              f"({two / one:.2f}x one worker; 2 cores run the front, both workers and the clients)")
        print(f"  in-process, for reference: {SESSIONS} concurrent sessions {_throughput(url):8.1f} steps/s")


def _mlp_step(url: str, sessions: contextlib.ExitStack):
    """One MLP training step on a new session (closed with ``sessions``)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    sess = sessions.enter_context(client.connect(url))
    model = sess.module(_mlp())
    return _step_fn(model, torch.optim.SGD(model.parameters(), lr=0.01), sess.tensor(x), sess.tensor(y))


def _bulk(sess, label: str) -> None:
    """16 MiB up and back: the body crosses the front as bytes and the worker through Ray's object store."""
    t = torch.randn(4 << 20)
    start = time.perf_counter()
    remote = sess.tensor(t)
    sess.sync()
    up = time.perf_counter() - start
    start = time.perf_counter()
    remote.to_torch()
    down = time.perf_counter() - start
    print(f"  {label + ': 16 MiB upload / download':<48} {16 / 1024 / up:6.2f} / {16 / 1024 / down:6.2f} GB/s")


def _throughput(url: str) -> float:
    """Training steps per second of ``SESSIONS`` sessions stepping at once (one thread each)."""
    with contextlib.ExitStack() as sessions:  # closed after: the next placement sees empty workers
        steps = [_mlp_step(url, sessions) for _ in range(SESSIONS)]
        for step in steps:
            step()  # warm: every session placed, every worker's first step done
        start = time.perf_counter()
        threads = [threading.Thread(target=lambda s=step: [s() for _ in range(STEPS)]) for step in steps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return SESSIONS * STEPS / (time.perf_counter() - start)

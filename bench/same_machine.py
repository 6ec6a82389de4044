"""``same_machine``: client and server on one machine, with torch's default threads, as users run them.

The MLP step (784-128-10, SGD, batch 64: 200 KB) with its batch uploaded each step (the usual
``x.to(device)`` loop) and with the batch already on the device, against the embedded server
(``connect()`` with no URL) and against ``python -m remote_autograd.service`` on loopback. Each
server runs twice: as shipped (a loopback server waits passively: ``service/openmp_wait.py``) and
spinning as torch's OpenMP runtime does by default (``GOMP_SPINCOUNT=300000``, libgomp's default
count, which the server leaves alone). The uploaded step runs with the SDK's copy of the batch as
shipped (numpy's, ``proto/codec.py`` ``encode_tensor(private=True)``) and with the copy it used to
make (torch's ``clone``, which wakes torch's intra-op threads in the client). All variants are timed
in interleaved rounds, so load from elsewhere falls on each alike.

``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (``make bench`` is often run with one thread) would hide the
subject: the section runs itself in a child process without them.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import time
from typing import Callable, Iterator

import torch

from ._util import ROOT, serve, summary

SPINNING = {"GOMP_SPINCOUNT": "300000"}  # libgomp's own default, written out: openmp_wait leaves it alone
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_BATCH, _ROUNDS, _PER_ROUND, _WARMUP = 64, 4, 10, 3


def run(url: str | None = None) -> None:
    print("\n[same_machine] MLP 784-128-10 SGD step, batch 64 (200 KB), client and server on this machine, "
          "torch's default threads")
    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARIABLES}
    subprocess.run([sys.executable, "-m", "bench.same_machine"], cwd=ROOT, env=env, check=True)


@contextlib.contextmanager
def torch_clone_copies() -> Iterator[None]:
    """The SDK's upload copy as it was before: torch's ``clone`` (the plain path ``private=`` replaces)."""
    from remote_autograd.client import _core

    shipped = _core.encode_tensor

    def encode(t: torch.Tensor, **kw):
        if kw.pop("private", False):
            t = t.detach().clone(memory_format=torch.contiguous_format)
        return shipped(t, **kw)

    _core.encode_tensor = encode
    try:
        yield
    finally:
        _core.encode_tensor = shipped


def mlp_step(sess) -> Callable[[bool], float]:
    """``step(upload)``: one SGD step of the MLP, its batch uploaded first or already on the device."""
    from .training import _mlp, _step_fn

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(_BATCH, 784, generator=g), torch.randint(0, 10, (_BATCH,), generator=g)
    model = sess.module(copy.deepcopy(_mlp()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    on_device = sess.tensor(x), sess.tensor(y)

    def step(upload: bool) -> float:
        return _step_fn(model, opt, *((x.to(sess.device), y.to(sess.device)) if upload else on_device))()

    return step


def _embedded(env: dict[str, str]):
    """An embedded server (as ``connect()`` starts it) with ``env`` on top of this process's."""
    from remote_autograd.client.transport import _embedded as embedded

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        server = embedded._start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return server


_CASES = [("batch on the device", False, False), ("batch uploaded each step", True, False),
          ("  uploaded, the client copying with torch's clone", True, True)]


def _measure() -> None:
    from remote_autograd import client

    times: dict[tuple[str, str], list[float]] = {}
    with contextlib.ExitStack() as stack:
        steps = {}
        for server, env in (("as shipped (passive)", {}), ("spinning (libgomp's default)", SPINNING)):
            embedded = _embedded(env)
            stack.callback(embedded.stop)
            steps[f"embedded, {server}"] = mlp_step(stack.enter_context(client.connect(embedded.url)))
            url = stack.enter_context(serve(["-m", "remote_autograd.service"], env))
            steps[f"loopback, {server}"] = mlp_step(stack.enter_context(client.connect(url)))
        print(f"  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
              f"client threads {torch.get_num_threads()}", flush=True)
        for _ in range(_ROUNDS):
            for label, step in steps.items():
                for case, upload, cloned in _CASES:
                    with torch_clone_copies() if cloned else contextlib.nullcontext():
                        for _ in range(_WARMUP):
                            step(upload)
                        for _ in range(_PER_ROUND):
                            start = time.perf_counter()
                            step(upload)
                            times.setdefault((label, case), []).append(time.perf_counter() - start)
    for label in steps:
        print(f"  {label}")
        on_device = summary(times[(label, _CASES[0][0])])[0]
        for case, _, _ in _CASES:
            med, p90 = summary(times[(label, case)])
            print(f"    {case:<50} median {med / 1e3:7.2f} ms   p90 {p90 / 1e3:7.2f} ms  "
                  f"{med / on_device:6.2f}x on the device")


if __name__ == "__main__":
    _measure()

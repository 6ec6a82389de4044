"""The SDK's path for one op: function calls inside ``remote_autograd.client`` for one ``a + b``.

    python -m bench.client_hops

Two remote float tensors on an in-process server, pipelined (the step is only queued, nothing
is sent); one warm-up ``a + b`` first, so one-time work (route lookups, imports) is not counted.
Prints the calls (every function entry, in order), the distinct functions and the files they
are in. ``trace`` is the tracer ``bench.op_hops`` counts the whole walk of one op with.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import torch

from remote_autograd import client

PREFIX = "remote_autograd.client"


def trace(walk: Callable[[client.Session, torch.Tensor, torch.Tensor], Any], *, requires_grad: bool = False,
          pipeline: bool = True, prefix: str = PREFIX, every_thread: bool = False) -> list[tuple[str, str, int]]:
    """(module, function, thread id) for each call into ``prefix``'s modules during ``walk(sess, a, b)``,
    run once to warm up (route lookups, the meta memo: one-time work is not counted), then traced.
    What ``walk`` returns lives on past the trace, as a user's variables do: its frees are not counted.
    ``a`` and ``b`` are remote ``randn(3)``s (``requires_grad``: ``a`` is a leaf that requires grad).
    ``pipeline=False`` sends each op at once; ``every_thread`` also follows the threads the
    in-process app starts (its event loop, its workers), to see the server's side."""
    calls: list[tuple[str, str, int]] = []
    lock = threading.Lock()
    recording = threading.Event()

    def profile(frame, event, arg):
        if event == "call" and recording.is_set():
            module = frame.f_globals.get("__name__", "")
            if module.startswith(prefix):
                with lock:
                    calls.append((module, frame.f_code.co_qualname, threading.get_ident()))

    if every_thread:
        threading.setprofile(profile)  # threads started from now on: the app's loop and workers
    sys.setprofile(profile)
    try:
        with client.connect(transport=client.InProcessTransport(), pipeline=pipeline) as sess:
            a = sess.tensor(torch.randn(3), requires_grad=requires_grad)
            b = sess.tensor(torch.randn(3))
            warm = walk(sess, a, b)
            del warm
            recording.set()
            kept = walk(sess, a, b)
            recording.clear()
            del kept
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls


def _add(sess: client.Session, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def trace_one_add(requires_grad: bool = False, *, pipeline: bool = True, prefix: str = PREFIX,
                  every_thread: bool = False) -> list[tuple[str, str]]:
    """(module, function) for each call into ``prefix``'s modules during one ``a + b``."""
    return [(module, name) for module, name, _ in trace(_add, requires_grad=requires_grad, pipeline=pipeline,
                                                        prefix=prefix, every_thread=every_thread)]


def figures(calls: list[tuple[str, str]]) -> tuple[int, int, int]:
    """(calls, distinct functions, files)."""
    return len(calls), len(set(calls)), len({m for m, _ in calls})


def main() -> None:
    verbose = "-v" in sys.argv
    for requires_grad in (False, True):
        calls = trace_one_add(requires_grad)
        if verbose:
            for module, name in calls:
                print(f"  {module.removeprefix(PREFIX + '.')}.{name}")
        n, distinct, files = figures(calls)
        print(f"one a + b (a.requires_grad={requires_grad}): {n} calls, {distinct} distinct functions, "
              f"{files} files")


if __name__ == "__main__":
    main()

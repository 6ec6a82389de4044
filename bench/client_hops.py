"""The SDK's path for one op: function calls inside ``remote_autograd.client`` for one ``a + b``.

    python -m bench.client_hops

Two remote float tensors on an in-process server, pipelined (the step is only queued, nothing
is sent); one warm-up ``a + b`` first, so one-time work (route lookups, imports) is not counted.
Prints the calls (every function entry, in order), the distinct functions and the files they
are in. ARCHITECTURE's walk of one op quotes these figures.
"""

from __future__ import annotations

import sys
import threading

import torch

from remote_autograd import client

PREFIX = "remote_autograd.client"


def trace_one_add(requires_grad: bool = False, *, pipeline: bool = True, prefix: str = PREFIX,
                  every_thread: bool = False) -> list[tuple[str, str]]:
    """(module, function) for each call into ``prefix``'s modules during one ``a + b``
    (``requires_grad``: ``a`` is a leaf that requires grad, so the step records a graph).
    ``pipeline=False`` sends the op at once; ``every_thread`` also follows the threads the
    in-process app starts (its event loop, its workers), to see the server's side."""
    calls: list[tuple[str, str]] = []
    lock = threading.Lock()
    recording = threading.Event()

    def profile(frame, event, arg):
        if event == "call" and recording.is_set():
            module = frame.f_globals.get("__name__", "")
            if module.startswith(prefix):
                with lock:
                    calls.append((module, frame.f_code.co_qualname))

    if every_thread:
        threading.setprofile(profile)  # threads started from now on: the app's loop and workers
    sys.setprofile(profile)
    try:
        with client.connect(transport=client.InProcessTransport(), pipeline=pipeline) as sess:
            a = sess.tensor(torch.randn(3), requires_grad=requires_grad)
            b = sess.tensor(torch.randn(3))
            warm = a + b  # route lookups, the meta memo: one-time work is not counted
            del warm
            recording.set()
            c = a + b
            recording.clear()
            del c
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls


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

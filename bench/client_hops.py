"""The SDK's path for one op: function calls inside ``remote_autograd.client`` for one ``a + b``.

    python -m bench.client_hops

Two remote float tensors on an in-process server, pipelined (the step is only queued, nothing
is sent); one warm-up ``a + b`` first, so one-time work (route lookups, imports) is not counted.
Prints the calls (every function entry, in order), the distinct functions and the files they
are in. ARCHITECTURE's walk of one op quotes these figures.
"""

from __future__ import annotations

import sys

import torch

from remote_autograd import client

PREFIX = "remote_autograd.client"


def trace_one_add(requires_grad: bool = False) -> list[tuple[str, str]]:
    """(module, function) for each call into the client package during one ``a + b``
    (``requires_grad``: ``a`` is a leaf that requires grad, so the step records a graph)."""
    calls: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            if module.startswith(PREFIX):
                calls.append((module, frame.f_code.co_qualname))

    with client.connect(transport=client.InProcessTransport()) as sess:
        a = sess.tensor(torch.randn(3), requires_grad=requires_grad)
        b = sess.tensor(torch.randn(3))
        warm = a + b
        del warm
        sys.setprofile(profile)
        try:
            c = a + b
        finally:
            sys.setprofile(None)
        del c
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

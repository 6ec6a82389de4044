"""``python -m bench.op_hops``: the calls one ``a + b`` on two remote tensors passes through, counted.

The walk of one op (ARCHITECTURE.md) in numbers: an eager ``a + b`` (sent at once) on the
service's app in this process (``InProcessTransport``, so the server's side is seen too), with
a profile hook on every thread. It prints how many calls land in our own modules on each side,
in how many functions and files, and how often the walk returns to a file it had left (a
"room already left"). Meta memos are warmed by one run first: a training loop's step is the
repeated one. Not a speed figure: the count of hops the next engineer follows.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch

_COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")  # a loop, not a hop


def _folders() -> dict[str, str]:
    """Each side's folder, as its modules' code objects name it."""
    import remote_autograd
    from remote_autograd import client, proto, service

    return {side: str(Path(package.__file__).parent) + "/"
            for side, package in (("client", client), ("service", service), ("proto", proto),
                                  ("remote_autograd", remote_autograd))}


def count_hops() -> dict:
    from remote_autograd import client

    folders = _folders()

    def _side(filename: str) -> str | None:
        for side, folder in folders.items():
            if filename.startswith(folder) and not (side == "remote_autograd" and "/" in filename[len(folder):]):
                return side
        return None

    calls: list[tuple[str, str, str]] = []  # (side, file, function), in call order per thread
    lock = threading.Lock()

    def profile(frame, event, arg):
        if event == "call" and not frame.f_code.co_qualname.endswith(_COMPREHENSIONS):
            side = _side(frame.f_code.co_filename)
            if side is not None:
                with lock:
                    calls.append((side, frame.f_code.co_filename, frame.f_code.co_qualname))

    recording = threading.Event()

    def hook(frame, event, arg):
        if recording.is_set():
            profile(frame, event, arg)

    threading.setprofile(hook)  # threads the app starts from now on (its loop, its workers)
    sys.setprofile(hook)
    try:
        with client.connect(transport=client.InProcessTransport(), pipeline=False) as sess:
            a, b = sess.tensor(torch.ones(3)), sess.tensor(torch.ones(3))
            a + b  # warm: the route table, the meta memo
            recording.set()
            a + b
            recording.clear()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    figures = {}
    for side in ("client", "service", "proto", "remote_autograd"):
        mine = [c for c in calls if c[0] == side]
        files, returns, left = [], 0, set()
        for _, file, _ in mine:
            if not files or files[-1] != file:
                if file in left:
                    returns += 1
                if files:
                    left.add(files[-1])
                files.append(file)
        figures[side] = {"calls": len(mine), "functions": len({(f, q) for _, f, q in mine}),
                         "files": len({f for _, f, _ in mine}), "returns to a file left": returns}
    return figures


def main() -> None:
    for side, f in count_hops().items():
        print(f"{side:16s} " + "  ".join(f"{k} {v}" for k, v in f.items()))


if __name__ == "__main__":
    main()

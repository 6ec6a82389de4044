"""``python -m bench.op_hops``: the calls one op's whole walk passes through, counted on each side.

The walk of one op (ARCHITECTURE.md) in numbers: ``c = a + b; s = c.sum(); s.backward(); s.item()``
on two remote ``randn(3)`` (``a`` requires grad), pipelined as a user runs it (the four lines are one
request, sent by ``item()``), on an in-process server (``InProcessTransport``), traced by
``bench.client_hops.trace`` on every thread (the caller's, the app's event loop, its workers) after
one warm-up walk. It prints, for the client, the wire (``proto``), the server and the package's top
modules, then in total: the calls into our modules, the distinct functions, the files, and how
often a thread's walk returns to a file it had left. Comprehensions and generator expressions are
loops, not hops: they are not counted. Not a speed figure: the count of hops the next engineer
follows, beside the goal of issue 32 (``GOAL``).
"""

from __future__ import annotations

import sys

from .client_hops import trace

_COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")
SIDES = ("client", "proto", "service", "remote_autograd")
GOAL = {"calls": 150, "files": 25}  # the whole walk, all sides together


def _side(module: str) -> str:
    """``client``, ``proto`` or ``service`` for their modules; ``remote_autograd`` for the top ones."""
    part = module.split(".")[1] if module.count(".") else ""
    return part if part in SIDES[:3] else "remote_autograd"


def walk(sess, a, b) -> tuple:
    """The user's four lines (``c`` and ``s`` live on after them, as a user's variables do)."""
    c = a + b
    s = c.sum()
    s.backward()
    s.item()
    return c, s


def _figures(calls: list[tuple[str, str, int]]) -> dict[str, int]:
    returns = 0
    for thread in {t for _, _, t in calls}:
        order, left = [], set()
        for module, _, t in calls:
            if t != thread or (order and order[-1] == module):
                continue
            if module in left:
                returns += 1
            if order:
                left.add(order[-1])
            order.append(module)
    return {"calls": len(calls), "functions": len({(m, f) for m, f, _ in calls}),
            "files": len({m for m, _, _ in calls}), "returns to a file left": returns}


def traced_walk() -> list[tuple[str, str, int]]:
    """(module, function, thread id) of each call into our modules during the walk, comprehensions aside."""
    return [c for c in trace(walk, requires_grad=True, prefix="remote_autograd", every_thread=True)
            if not c[1].endswith(_COMPREHENSIONS)]


def count_hops(calls: list[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    """The figures of ``traced_walk``'s calls per side (``SIDES``) and in ``"total"``."""
    figures = {side: _figures([c for c in calls if _side(c[0]) == side]) for side in SIDES}
    figures["total"] = _figures(calls)
    return figures


def main() -> None:
    calls = traced_walk()
    figures = count_hops(calls)
    print("c = a + b; s = c.sum(); s.backward(); s.item()  (one request, in-process server, every thread)")
    for side, f in figures.items():
        print(f"{side:16s} " + "  ".join(f"{k} {v}" for k, v in f.items()))
    total = figures["total"]
    print(f"whole walk: {total['calls']} calls over {total['files']} files "
          f"(goal: <= {GOAL['calls']} calls over <= {GOAL['files']} files)")
    if "-v" in sys.argv:
        threads = list(dict.fromkeys(t for _, _, t in calls))
        for module, name, thread in calls:
            print(f"  thread {threads.index(thread)}  {module.removeprefix('remote_autograd.')}.{name}")


if __name__ == "__main__":
    main()

"""``python -m bench.op_hops``: the calls one eager ``a + b`` passes through, counted on each side.

The walk of one op (ARCHITECTURE.md) in numbers: ``bench.client_hops``'s trace of one ``a + b``,
sent at once (eager) to the service's app in this process, on every thread, so the server's side
is seen too. It prints how many calls land in our own modules on each side, in how many
functions and modules, and how often the walk returns to a module it had left (a "room already
left"). Comprehensions and generator expressions are loops, not hops: they are not counted.
Not a speed figure: the count of hops the next engineer follows.
"""

from __future__ import annotations

from .client_hops import trace_one_add

_COMPREHENSIONS = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")
SIDES = ("client", "service", "proto", "remote_autograd")


def _side(module: str) -> str:
    """``client``, ``service`` or ``proto`` for their modules; ``remote_autograd`` for the top ones."""
    part = module.split(".")[1] if module.count(".") else ""
    return part if part in SIDES[:3] else "remote_autograd"


def count_hops() -> dict[str, dict[str, int]]:
    calls = [(module, name) for module, name in trace_one_add(pipeline=False, prefix="remote_autograd",
                                                                every_thread=True)
             if not name.endswith(_COMPREHENSIONS)]
    figures = {}
    for side in SIDES:
        mine = [(module, name) for module, name in calls if _side(module) == side]
        order, returns, left = [], 0, set()
        for module, _ in mine:
            if not order or order[-1] != module:
                if module in left:
                    returns += 1
                if order:
                    left.add(order[-1])
                order.append(module)
        figures[side] = {"calls": len(mine), "functions": len(set(mine)),
                         "files": len({module for module, _ in mine}), "returns to a file left": returns}
    return figures


def main() -> None:
    for side, f in count_hops().items():
        print(f"{side:16s} " + "  ".join(f"{k} {v}" for k, v in f.items()))


if __name__ == "__main__":
    main()

"""Sizes and numbers of a graph traced with dynamic shapes, worked out for each call.

A graph dynamo traced with symbolic sizes (after a batch of another shape, ``automatic_dynamic_shapes``)
describes its outputs' shapes, and the sizes its calls take, as expressions of symbols: the inputs'
sizes (``s0``), numbers it takes (``s1``), values it read (``item()``). ``Symbols`` learns, once, where
each symbol comes from; each call binds them from that call's inputs and evaluates the expressions
(sympy), so the server runs the steps with the bound sizes and the SDK's handles get the real shapes.
"""

from __future__ import annotations

from typing import Any

import torch

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(x: Any) -> bool:
    return isinstance(x, SYM_TYPES) and x.node.expr.free_symbols != set()


def expr_of(x: Any):
    """The sympy expression of a symbolic number, with the shape environment's known replacements."""
    node = x.node
    return node.shape_env.replace(node.expr) if node.shape_env is not None else node.expr


def hint(x: Any, default: Any) -> Any:
    """A concrete example of ``x`` (its hint), for recording; ``default`` when it has none (unbacked)."""
    if not isinstance(x, SYM_TYPES):
        return x
    value = x.node.hint
    return default if value is None else value


class Symbols:
    """Where each symbol of a graph is bound from, and the expressions each call evaluates."""

    def __init__(self) -> None:
        self.dims: list[tuple[Any, int, int]] = []  # (symbol, argument, dim): an input's size
        self.numbers: list[tuple[Any, int]] = []  # (symbol, argument): a number the graph takes
        self.locals: list[tuple[Any, Any]] = []  # (symbol, node): a value the local part computes
        self.known: set = set()

    def learn_input(self, example: Any, k: int) -> None:
        """Symbols ``example`` (argument ``k``'s) binds: a tensor's sizes, or the number itself."""
        if isinstance(example, torch.Tensor):
            for d, size in enumerate(example.shape):
                if is_symbolic(size) and len(expr_of(size).free_symbols) == 1 and expr_of(size).is_Symbol:
                    self.dims.append((expr_of(size), k, d))
                    self.known.add(expr_of(size))
        elif is_symbolic(example) and expr_of(example).is_Symbol:
            self.numbers.append((expr_of(example), k))
            self.known.add(expr_of(example))

    def learn_local(self, example: Any, node: Any) -> None:
        if is_symbolic(example) and expr_of(example).is_Symbol and expr_of(example) not in self.known:
            self.locals.append((expr_of(example), node))
            self.known.add(expr_of(example))

    def can_evaluate(self, x: Any) -> bool:
        return not is_symbolic(x) or expr_of(x).free_symbols <= self.known

    def bind(self, args: tuple, env: dict) -> dict:
        """This call's value of every symbol."""
        bindings = {sym: args[k].shape[d] for sym, k, d in self.dims}
        for sym, k in self.numbers:
            bindings[sym] = args[k]
        for sym, node in self.locals:
            bindings[sym] = env[node]
        return bindings


def evaluate(x: Any, bindings: dict) -> Any:
    """``x`` (a number, maybe symbolic) for the call whose symbols are ``bindings``."""
    if not is_symbolic(x):
        return x if not isinstance(x, SYM_TYPES) else hint(x, x)
    value = expr_of(x).xreplace(bindings)
    if isinstance(x, torch.SymInt):
        return int(value)
    if isinstance(x, torch.SymFloat):
        return float(value)
    return bool(value)

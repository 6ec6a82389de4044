"""Walks of a server autograd graph: the nodes a backward from some roots could run."""

from __future__ import annotations

import torch


def graph_nodes(roots: list[torch.Tensor]) -> set:
    """Every node of the autograd graph a backward from ``roots`` could run."""
    seen: set = set()
    stack = [r.grad_fn for r in roots]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(n for n, _ in node.next_functions)
    return seen


def _accumulate_grad_type() -> type:
    """The class of torch's AccumulateGrad nodes (it has no public name)."""
    leaf = torch.zeros((), requires_grad=True)
    return type(leaf.view_as(leaf).grad_fn.next_functions[0][0])


ACCUMULATE_GRAD = _accumulate_grad_type()  # the node that holds a leaf (``node.variable``)

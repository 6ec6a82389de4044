"""A backward that reaches client-run nodes (``dispatch/_client_run``: Functions whose backward reads values)
runs in stages, driven from here, as torch's engine would call those backwards from the middle of its walk.

Stage one is the server's backward from the roots as the user asked for it, which also keeps the gradient
that reaches each client-run node it may reach (``capture``: the node cuts the graph on the server, so the
walk stops there). Then, latest node first (creation order is a topological order: no later node feeds an
earlier one), the node's own backward runs here on the sum of what its captures got, as eager remote code,
and the server's backward goes on from the node's inputs with what it returned (a backward step whose roots
are those inputs, capturing again at the earlier nodes it reaches), and so on. Leaves accumulate ``.grad``
at each stage that reaches them: by linearity the sum is torch's, up to the order of the additions where a
leaf gets gradients from more than one stage (``docs/known-differences.md``).

A stage retains the graph where a later stage may walk the same nodes again, with another gradient (what
the two walk down to, their handles' ``_leaves``, meet: a leaf reached both through a client-run node and
around it), else as the user asked; a backward that does not retain it marks its client-run nodes freed, so
a second backward through them raises torch's error. ``torch.autograd.grad`` runs so too, a ``grad`` step per
stage, each input's gradient summed over them. Where a form cannot be staged faithfully the call raises,
naming the Function: ``create_graph`` through such a node, and hooks on the session's tensors or modules (a
hook would run once per stage, on part of its gradient).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._core import RemoteTensor
from ..dispatch._client_run import FREED, MADE, ClientRun
from ..session._steps import where
from ._hooks import any_hooks


def reached(tensors: list) -> list[ClientRun]:
    """The client-run nodes a backward from ``tensors`` reaches directly (not behind another), earliest first
    (nothing to look for in a session that never made one)."""
    if not any(isinstance(t, RemoteTensor) and t._session in MADE for t in tensors):
        return []
    found: set = set()
    for t in tensors:
        if isinstance(t, RemoteTensor) and t._rg:
            found.update(k for k in t._leaves if type(k) is ClientRun)
    return sorted(found, key=lambda r: r.order)


def _upstream(runs: list[ClientRun]) -> list[ClientRun]:
    """``runs`` and every client-run node behind them, latest first."""
    seen: set = set()
    todo = list(runs)
    while todo:
        r = todo.pop()
        if r not in seen:
            seen.add(r)
            todo += reached(list(r.args))
    return sorted(seen, key=lambda r: -r.order)


def _depends(tensors: list) -> frozenset:
    """What a backward from ``tensors`` walks down to on the server: the leaves (and client-run nodes, where it
    stops) their ``_leaves`` name."""
    return frozenset().union(*(t._leaves for t in tensors if isinstance(t, RemoteTensor) and t._rg))


def refuse(runs: list[ClientRun], what: str) -> RuntimeError:
    names = ", ".join(dict.fromkeys(r.name for r in runs))
    return RuntimeError(f"{what} through {names}, whose backward runs on the client (it reads values, so it "
                        f"cannot run inside the server's backward): not supported ({where()})")


def _check(session: Any, runs: list[ClientRun], create_graph: bool) -> None:
    if create_graph:
        raise refuse(runs, "a backward with create_graph=True")
    if any_hooks(session) or session._node_hooks:
        raise refuse(runs, "a backward with hooks on the session's tensors or modules")
    _check_kept(runs)


def _check_kept(runs: list[ClientRun]) -> None:
    for r in runs:
        if r.freed:
            raise RuntimeError(f"{FREED} (through {r.name}, whose backward runs on the client; {where()})")


def staged_backward(session: Any, runs: list[ClientRun], tensors: list, grads: list, retain_graph, create_graph: bool,
                    queue: Callable[..., int]) -> None:
    """``torch.autograd.backward(tensors, grads, ...)`` in stages (see the module's docstring); ``queue(roots,
    grads, retain_graph, capture)`` queues one stage's backward step (``_autograd.queue_backward``) and answers
    its index in the queue."""
    _check(session, runs, create_graph)
    _stages(session, runs, tensors, grads, bool(retain_graph), lambda *a: (queue(*a), None))


def staged_grad(session: Any, runs: list[ClientRun], outputs: list, inputs: list, grad_outputs: list | None,
                retain_graph, create_graph: bool, queue: Callable[..., tuple[int, Callable]]) -> list:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, ...)`` in stages: each stage a ``grad`` step (that
    allows unused inputs); the gradient of each input summed over the stages (None where none reached it).
    ``queue(roots, grads, retain_graph, capture)``: the stage's index in the queue, and what reads the
    gradients of ``inputs`` from its answer."""
    _check(session, runs, create_graph)
    sums: list = [None] * len(inputs)

    def queued(*args) -> tuple[int, Callable]:
        index, read = queue(*args)

        def take(answer: dict) -> None:
            for k, g in enumerate(read(answer)):
                if g is not None:
                    sums[k] = g if sums[k] is None else _add(sums[k], g)

        return index, take

    given = grad_outputs if grad_outputs is not None else [None] * len(outputs)
    _stages(session, runs, outputs, given, bool(retain_graph), queued)
    return sums


def _add(a: RemoteTensor, b: RemoteTensor) -> RemoteTensor:
    with torch.no_grad():
        return a + b


def _stages(session: Any, runs: list[ClientRun], tensors: list, grads: list, retain: bool,
            queue: Callable[..., tuple[int, Callable | None]]) -> None:
    """The stages themselves (see the module's docstring). A stage retains the graph where the user's call
    does, unless a later stage may walk a part of it again: where what it walks down to (``_depends``) meets
    what a client-run node not yet run walks down to from its inputs."""
    upstream = _upstream(runs)
    below = {r: _depends(list(r.args)) for r in upstream}
    captured: dict[ClientRun, list] = {}
    done: set = set()

    def stage(roots: list, given: list, reach: list[ClientRun], before: int | None) -> None:
        entries, slots = [], []
        for r in reach:
            if r in done:
                continue
            for j, meta in enumerate(m for m in r.outputs if m is not None):
                if meta[2]:
                    entries.append({"node": r.node, "output": j, "out": session.new_id()})
                    slots.append((r, j, meta))
        walks = _depends(roots)  # (a node the stage stops at is named there too: a later stage walks on from it)
        later = [r for r in upstream if r not in done and (before is None or r.order < before)]
        index, take = queue(roots, given, retain or any(not walks.isdisjoint(below[r]) for r in later), entries)
        if not entries and take is None:
            return
        answer = session.take_result(index) or {}
        if take is not None:
            take(answer)
        for entry, (r, j, meta), got in zip(entries, slots, answer.get("captured") or ()):
            if got:
                g = RemoteTensor._new(session, entry["out"], meta[0], meta[1])
                sums = captured.setdefault(r, [None] * sum(m is not None for m in r.outputs))
                sums[j] = g if sums[j] is None else _add(sums[j], g)

    stage(tensors, grads, runs, None)
    while captured:
        r = max(captured, key=lambda n: n.order)
        done.add(r)
        passed = r.run(captured.pop(r))
        if not retain:  # torch frees its saved tensors: ours go with the ctx
            r.freed, r.ctx = True, None
        roots = [(a, g) for a, g in zip(r.args, passed) if g is not None]
        if roots:
            nxt = [n for n in reached([a for a, _ in roots]) if n not in done]
            _check_kept(nxt)
            stage([a for a, _ in roots], [g for _, g in roots], nxt, r.order)

"""``Caches``: what a session's speed paths remember between its programs, kept beside the session.

The plain path (``runner``) needs none of it. A repeated program's plan and the keys sighted once
(``program_plan``), a program's CUDA-graph captures (``graph_steps``): each bounded by its own
module's limit, made at a session's first program that wants one, and dropped with the session
(``Session.clear``: a capture's memory goes with its last tensor).
"""

from __future__ import annotations

from collections import OrderedDict


class Caches:
    """A session's plans (by program key), the keys seen once, and its captures (by signature)."""

    __slots__ = ("plans", "seen", "graphs")

    def __init__(self) -> None:
        self.plans: OrderedDict = OrderedDict()
        self.seen: OrderedDict = OrderedDict()
        self.graphs: OrderedDict = OrderedDict()


def of(session) -> Caches:
    """``session``'s caches (made at its first use)."""
    caches = session.caches
    if caches is None:
        caches = session.caches = Caches()
    return caches

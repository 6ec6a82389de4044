"""``python -m bench.op_hops`` counts the whole walk of one op on every side: the client, the wire
(``proto``) and the server, each thread of the in-process app followed: the count sees each side (a
tracer that lost a thread or a side fails), and the walk stays within issue 32's goal (a change that
lengthens it past the goal fails here with the calls per module, and says so in its review)."""

from __future__ import annotations

from collections import Counter

from bench.op_hops import GOAL, SIDES, count_hops, traced_walk


def test_the_walk_of_one_op_is_counted_on_every_side():
    calls = traced_walk()
    figures = count_hops(calls)
    for side in ("client", "proto", "service"):
        assert figures[side]["calls"] > 0 and figures[side]["files"] > 0, (side, figures)
    assert figures["total"]["calls"] == sum(figures[side]["calls"] for side in SIDES)
    assert len({thread for _, _, thread in calls}) >= 2, "the server's threads are followed, not only the caller's"
    names = [f"{module}.{name}" for module, name, _ in calls]
    # the four lines are one request, sent by item(), and the server runs the backward the client queued
    assert sum(name.endswith(".flush") and ".client." in name for name in names) == 1, names
    assert any("autograd_steps" in name for name in names), names


def test_the_walk_stays_within_its_goal(monkeypatch):
    """What the walk enters depends on what the four lines do, with one exception held off here: the
    program route starts listening for a client that goes away only once a program has run for
    ``LISTEN_AFTER_SECONDS`` (a few calls more), which a traced walk on a busy machine may reach."""
    from remote_autograd.service.http.routes import programs

    monkeypatch.setattr(programs, "LISTEN_AFTER_SECONDS", 600.0)
    calls = traced_walk()
    total = count_hops(calls)["total"]
    per_module = Counter(module for module, _, _ in calls).most_common()
    assert total["calls"] <= GOAL["calls"] and total["files"] <= GOAL["files"], (total, per_module)

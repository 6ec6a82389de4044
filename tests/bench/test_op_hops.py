"""``python -m bench.op_hops`` counts the whole walk of one op on every side: the client, the wire
(``proto``) and the server, each thread of the in-process app followed. Not the goal (that is the
figure's to show): that the count sees each side, so a tracer that lost a thread or a side fails."""

from __future__ import annotations

from bench.op_hops import SIDES, count_hops, traced_walk


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

"""``bench._hot``, the benchmark's parts timed alone: recorded programs replay in process (and a
replay that fails says so, never a silent time), and the client alone sends nothing but its first round trip.

The tap wraps an in-process transport: nothing here needs a socket.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

from bench import _hot
from remote_autograd import client


@pytest.fixture
def tapped() -> Iterator[tuple[client.Session, _hot.Tap]]:
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess:
        yield sess, tap


def test_recorded_programs_replay_in_process(tapped):
    sess, tap = tapped
    with _hot.recording(tap) as programs:
        w = sess.tensor(torch.randn(3, 2), requires_grad=True)
        x = sess.tensor(torch.randn(4, 3))
        (x @ w).relu().sum().backward()
        w.grad.to_torch()
        _hot.empty_program(sess)()
    assert len(programs()) == 2 and programs()[-1]["steps"] == []
    assert [s["kind"] for s in programs()[0]["steps"]][:2] == ["put", "put"]
    times = _hot.server_alone(programs(), last=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_a_replay_that_fails_raises(tapped):
    sess, tap = tapped
    with _hot.recording(tap) as programs:
        x = sess.tensor(torch.randn(4, 3))
        with pytest.raises(Exception, match="same reduction dim"):  # torch's meta check, before any kernel
            (x @ sess.tensor(torch.randn(4, 3))).to_torch()
    with pytest.raises(RuntimeError, match="replaying program.*same reduction dim"):
        _hot.server_alone(programs(), last=1)


def test_client_alone_answers_from_memory(tapped):
    sess, tap = tapped
    x, y = sess.tensor(torch.randn(16)), sess.tensor(torch.randn(16))
    sess.sync()
    forwarded, sent = tap.forwarded, sess.requests
    times = _hot.client_alone(tap, sess, lambda: (x + y).sum().item(), repeat=5)
    assert len(times) == 5
    assert tap.forwarded == forwarded + 2  # only the round trips whose answers are then repeated (empty, fn)
    assert sess.requests >= sent + 2 + 2 * 5  # the others went through the SDK's transport, answered by the tap
    assert (x * 2).to_torch().allclose(x.to_torch() * 2)  # the server answers again


def test_a_recording_inside_another_is_the_outer_ones_too(tapped):
    sess, tap = tapped
    x = sess.tensor(torch.randn(4))
    with _hot.recording(tap) as outer:
        (x * 2).sum().item()
        with _hot.recording(tap) as inner:
            (x + 1).sum().item()
        (x - 1).sum().item()
    assert len(inner()) == 1 and len(outer()) == 3
    assert outer()[1] == inner()[0] and tap.recorded is None

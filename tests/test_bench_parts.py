"""``bench._hot``, the benchmark's parts timed alone: recorded programs replay in process (and a
replay that fails says so, never a silent time), and the client alone sends nothing but its first round trip."""

from __future__ import annotations

import pytest
import torch

from bench import _hot


def test_recorded_programs_replay_in_process(sess):
    with _hot.recording(sess) as programs:
        w = sess.tensor(torch.randn(3, 2), requires_grad=True)
        x = sess.tensor(torch.randn(4, 3))
        (x @ w).relu().sum().backward()
        w.grad.to_torch()
        _hot.empty_program(sess)()
    assert len(programs) == 2 and programs[-1]["steps"] == []
    times = _hot.server_alone(programs, last=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_a_replay_that_fails_raises(sess):
    with _hot.recording(sess) as programs:
        x = sess.tensor(torch.randn(4, 3))
        with pytest.raises(Exception, match="shape"):
            (x @ sess.tensor(torch.randn(4, 3))).to_torch()
    with pytest.raises(RuntimeError, match="replaying program.*cannot be multiplied"):
        _hot.server_alone(programs, last=1)


def test_client_alone_answers_from_memory(sess):
    x, y = sess.tensor(torch.randn(16)), sess.tensor(torch.randn(16))
    sess.sync()
    before = sess.requests
    times = _hot.client_alone(sess, lambda: (x + y).sum().item(), repeat=5)
    assert len(times) == 5
    assert sess.requests == before + 1  # only the round trip whose answer is then repeated
    assert (x * 2).to_torch().allclose(x.to_torch() * 2)  # the transport is the real one again

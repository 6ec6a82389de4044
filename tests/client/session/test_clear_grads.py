"""``.grad = None`` queued one after another from one line (an optimizer's ``zero_grad``) goes as one
``clear_grads`` step of all their ids (``SessionCore.clear_grad``); from different lines, each its own
step, so an error still names its line. Training is local torch's either way."""

from __future__ import annotations

import copy

import torch

from bench import _hot
from remote_autograd import client

from ...conftest import _Shared


def _steps(programs: list[dict], kind: str) -> list[dict]:
    return [s for p in programs for s in p["steps"] if s["kind"] == kind]


def test_zero_grad_is_one_step_of_every_parameter_and_trains_as_local_torch(in_process_app):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x, y = torch.randn(16, 4), torch.randn(16, 2)

    def train(model, device):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
        return loss.item(), [p.detach().cpu() for p in model.parameters()]

    want = train(copy.deepcopy(model), "cpu")
    tap = _hot.Tap(_Shared(in_process_app))
    with client.connect(transport=tap) as sess, _hot.recording(tap) as programs:
        remote = copy.deepcopy(model).to(sess.device)
        got = train(remote, sess.device)
        ids = [p._id for p in remote.parameters()]
    assert got[0] == want[0] and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    # the first zero_grad finds no grad to clear; the next two clear all four in one step each
    assert [s["ids"] for s in _steps(programs(), "clear_grads")] == [ids, ids]
    assert not _steps(programs(), "set_grad")


def test_clears_from_different_lines_are_steps_of_their_own(in_process_app):
    tap = _hot.Tap(_Shared(in_process_app))
    with client.connect(transport=tap) as sess, _hot.recording(tap) as programs:
        a, b = (torch.ones(3, device=sess.device, requires_grad=True) for _ in range(2))
        (a * b).sum().backward()
        a.grad = None
        b.grad = None
        sess.sync()
        assert a.grad is None and b.grad is None
    assert [s["ids"] for s in _steps(programs(), "clear_grads")] == [[a._id], [b._id]]

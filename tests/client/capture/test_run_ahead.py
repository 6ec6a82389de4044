"""A compiled step's program is answered once its loss is known, its backward and optimizer run after the
answer while the next step's Python runs (SPEC §3, running ahead; the server's side:
``tests/service/engine/test_run_ahead.py``). What a user sees: the same values as local torch, and an
error of a step run after the answer raised at the next sync, at that step's line."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from remote_autograd.client import RemoteError

X = torch.randn(8, 10, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(2))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def _train(device, compile, steps: int = 3, fail_at: int | None = None):
    """A loop with a compiled model and a compiled optimizer step; at step ``fail_at`` the loss's backward
    runs twice (torch refuses the second: the graph was freed)."""
    model = _model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    forward, opt_step = (torch.compile(model, backend="remote"), torch.compile(opt.step, backend="remote")) \
        if compile else (model, opt.step)
    x, y = X.to(device), Y.to(device)
    losses = []
    for step in range(steps):
        loss = F.cross_entropy(forward(x), y)
        opt.zero_grad()
        loss.backward()
        if step == fail_at:
            loss.backward()  # the line the error names
        opt_step()
        losses.append(loss.item())
    return model, losses


def _line(text: str) -> int:
    with open(__file__) as source:
        return next(n for n, line in enumerate(source, 1) if line.rstrip().endswith(text))


def test_a_compiled_loop_runs_ahead_and_trains_as_local_torch(sess):
    want_model, want_losses = _train("cpu", compile=False)
    model, losses = _train(sess.device, compile=True)
    assert sess._ahead is not None  # the last step's answer came before its backward and optimizer ran
    assert losses == want_losses
    for got, want in zip(model.parameters(), want_model.parameters()):
        assert torch.equal(got.detach().cpu(), want.detach())


def test_a_step_that_fails_after_its_answer_raises_at_the_next_sync_at_its_line(sess):
    with pytest.raises(RuntimeError, match="second time"):
        _train("cpu", compile=False, fail_at=2)  # torch raises at the second backward
    model, losses = _train(sess.device, compile=True, fail_at=2)  # here the loss was answered first
    with pytest.raises(RemoteError, match="second time") as raised:
        sess.sync()
    assert raised.value.where == f"{__file__}:{_line('# the line the error names')}"
    # as torch leaves them: two steps, then the third's forward and first backward (the optimizer did not run)
    want_model, _ = _train("cpu", compile=False, steps=2)
    want_opt_params = [p.detach().clone() for p in want_model.parameters()]
    assert len(losses) == 3
    for got, want in zip(model.parameters(), want_opt_params):
        assert torch.equal(got.detach().cpu(), want)
    sess.sync()  # told once: the session goes on


def test_without_running_ahead_the_error_raises_at_the_item_that_sent_it(sess):
    """``run_ahead = False`` (``CUDA_LAUNCH_BLOCKING=1``'s counterpart): every step ran before the answer."""
    sess.run_ahead = False
    with pytest.raises(RemoteError, match="second time") as raised:
        _train(sess.device, compile=True, fail_at=2)
    assert raised.value.where == f"{__file__}:{_line('# the line the error names')}"
    sess.sync()  # nothing was left to tell


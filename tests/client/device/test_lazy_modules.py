"""Lazy modules moved to the device before their first forward materialize there, as on CUDA
(client/handlers/_moves.py): the same values and gradients as on the CPU, the same parameter
objects (an optimizer made before the first forward trains them), and no parameter uploaded."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .test_device import recorded  # noqa: F401 (a fixture)


def _lazy_net() -> nn.Module:
    return nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))


def _train(device, dtype=torch.float32, steps=3):
    """Built lazy, moved, an optimizer made before the first forward, then trained."""
    data = torch.Generator().manual_seed(1)  # so the initial values are the generator's first draws
    X, Y = torch.randn(4, 2, 6, 6, dtype=dtype, generator=data), torch.randint(0, 3, (4,), generator=data)
    torch.manual_seed(0)  # seeds the session's generator too
    model = _lazy_net().to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    X, Y = X.to(device), Y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(X), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses, {k: v.cpu() for k, v in model.state_dict().items()}


def test_a_lazy_model_moved_before_its_first_forward_trains_like_cpu(sess):
    for dtype in (torch.float32, torch.float64):
        model, losses, state = _train(sess.device, dtype)
        _, want_losses, want_state = _train("cpu", dtype)
        assert losses == want_losses  # the session's generator draws the initial values the CPU draws
        assert state.keys() == want_state.keys()
        for k, v in want_state.items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6, msg=k)
        assert all(p.device == sess.device and p.dtype == dtype and isinstance(p, nn.Parameter)
                   for p in model.parameters())
        assert all(b.device == sess.device for b in model.buffers())
        assert type(model[-1]) is nn.Linear and model[-1].in_features == 4 * 4 * 4  # no longer lazy


def test_materializing_on_the_device_uploads_no_parameter(recorded):  # noqa: F811
    sess, recorder = recorded
    lazy = nn.LazyLinear(3)
    weight = lazy.weight
    lazy.to(sess.device)
    x = torch.randn(2, 5).to(sess.device)
    y = lazy(x)
    sess.sync()
    assert lazy.weight is weight and weight.shape == (3, 5) and weight.device == sess.device
    assert [p["value"]["shape"] for p in recorder.puts()] == [[2, 5]], "only the input is uploaded"
    y.sum().backward()
    torch.testing.assert_close(weight.grad.cpu(), x.cpu().sum(0).expand(3, 5))

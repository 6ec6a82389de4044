"""Training with plain PyTorch on remote modules: torch.optim, schedulers, clipping, state dicts."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch
from torch import nn

from bench import _hot
from remote_autograd import client


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def _data(n: int = 64):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 10, generator=g), torch.randint(0, 3, (n,), generator=g)


def _train(model, opt, X, Y, *, steps=20, sched=None, clip=None, batch=16):
    losses = []
    for step in range(steps):
        i = (step * batch) % X.shape[0]
        xb, yb = X[i:i + batch], Y[i:i + batch]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd-momentum-nesterov-wd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
}


def _assert_same_params(remote: nn.Module, local: nn.Module) -> None:
    got = remote.state_dict()  # keeps the device, as torch's does: values come back with .cpu()
    for k, v in local.state_dict().items():
        assert got[k].device == remote[0].weight.device, "state_dict moved off the device"
        torch.testing.assert_close(got[k].cpu(), v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.backends("inprocess", "ray")
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_match_local_training(sess, name):
    X, Y = _data()
    local = _mlp()
    remote = sess.module(_mlp())
    make = OPTIMIZERS[name]
    want = _train(local, make(local.parameters()), X, Y, clip=1.0)
    got = _train(remote, make(remote.parameters()), sess.tensor(X), sess.tensor(Y), clip=1.0)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    _assert_same_params(remote, local)


@pytest.mark.parametrize("sched", ["step", "cosine"])
def test_schedulers_match(sess, sched):
    X, Y = _data()
    make_sched = {"step": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5),
                  "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10)}[sched]
    local, remote = _mlp(), sess.module(_mlp())
    opt_l = torch.optim.SGD(local.parameters(), lr=0.1, momentum=0.9)
    opt_r = torch.optim.SGD(remote.parameters(), lr=0.1, momentum=0.9)
    want = _train(local, opt_l, X, Y, sched=make_sched(opt_l))
    got = _train(remote, opt_r, sess.tensor(X), sess.tensor(Y), sched=make_sched(opt_r))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    _assert_same_params(remote, local)


def test_eager_and_pipelined_training_are_identical(server_url):
    X, Y = _data()
    results = []
    for pipeline in (True, False):
        with client.connect(server_url, pipeline=pipeline) as s:
            model = s.module(_mlp())
            losses = _train(model, torch.optim.Adam(model.parameters(), lr=0.01), s.tensor(X), s.tensor(Y), steps=5)
            results.append((losses, {k: v.cpu() for k, v in model.state_dict().items()}))
    assert results[0][0] == results[1][0]
    for k in results[0][1]:
        assert torch.equal(results[0][1][k], results[1][1][k])


def test_a_training_step_costs_at_most_two_requests_and_no_upload():
    X, Y = _data()
    tap = _hot.Tap(client.InProcessTransport())  # counts and records what reaches the server
    with client.connect(transport=tap) as sess:
        model = sess.module(_mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        Xr, Yr = sess.tensor(X), sess.tensor(Y)
        _train(model, opt, Xr, Yr, steps=2)  # momentum buffers exist from here on
        before = tap.forwarded
        with _hot.recording(tap) as programs:
            _train(model, opt, Xr, Yr, steps=10)
        assert tap.forwarded - before <= 2 * 10
        puts = [s for body in programs() for s in body["steps"] if s["kind"] == "put"]
    assert puts == [], "the data set was uploaded again"


def test_zero_grad_without_set_to_none(sess):
    X, Y = _data()
    local, remote = _mlp(), sess.module(_mlp())
    opt_l, opt_r = torch.optim.SGD(local.parameters(), lr=0.1), torch.optim.SGD(remote.parameters(), lr=0.1)
    for model, opt, x, y in ((local, opt_l, X, Y), (remote, opt_r, sess.tensor(X), sess.tensor(Y))):
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    _assert_same_params(remote, local)
    assert remote[0].weight.grad is not None


def test_state_dict_round_trips_exactly(sess):
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    remote = sess.module(model)
    assert remote is model, "sess.module(m) is m.to(sess.device): moved in place"
    sd = remote.state_dict()
    assert all(isinstance(v, client.RemoteTensor) and v.device == sess.device for v in sd.values())
    for k, v in before.items():
        assert torch.equal(sd[k].cpu(), v)
    new = {k: torch.randn_like(v) for k, v in before.items()}
    remote.load_state_dict(new)  # local values into remote parameters: copy_ uploads them
    back = remote.state_dict()
    for k in new:
        assert torch.equal(back[k].cpu(), new[k])


def test_optimizer_state_dict_round_trip_through_torch_save(sess):
    X, Y = _data()
    remote, local = sess.module(_mlp()), _mlp()
    opt_r = torch.optim.Adam(remote.parameters(), lr=0.01)
    opt_l = torch.optim.Adam(local.parameters(), lr=0.01)
    Xr, Yr = sess.tensor(X), sess.tensor(Y)
    _train(remote, opt_r, Xr, Yr, steps=3)
    _train(local, opt_l, X, Y, steps=3)
    buf = io.BytesIO()
    torch.save(opt_r.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    opt_r2 = torch.optim.Adam(remote.parameters(), lr=0.01)
    opt_r2.load_state_dict(saved)
    got = _train(remote, opt_r2, Xr, Yr, steps=3)
    want = _train(local, opt_l, X, Y, steps=3)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_batchnorm_dropout_train_eval(sess):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    local, remote = copy.deepcopy(net), sess.module(net)
    X, Y = _data()
    for model, x, y in ((local, X, Y), (remote, sess.tensor(X), sess.tensor(Y))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _train(model, opt, x, y, steps=5)
    _assert_same_params(remote, local)  # includes running_mean / running_var / num_batches_tracked
    local.eval()
    remote.eval()
    torch.testing.assert_close(remote(sess.tensor(X[:4])).to_torch(), local(X[:4]), rtol=1e-5, atol=1e-6)

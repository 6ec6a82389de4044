"""Everyday training idioms, each one function taking ``device``, run on ``"cpu"`` and on ``sess.device``:
the losses (or outputs) and the final parameters must match local torch. None of the functions
names the SDK; the device is the only difference between the two runs."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _data(device, n: int = 32):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g).to(device), torch.randint(0, 3, (n,), generator=g).to(device)


def _state(model: nn.Module) -> dict:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def _assert_same_run(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=atol)
    for g, w in zip(got[1:], want[1:]):
        assert g.keys() == w.keys()
        for k in w:
            torch.testing.assert_close(g[k], w[k], rtol=rtol, atol=atol, msg=k)


def _step(model, opt, x, y) -> float:
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


# -- copies and checkpoints ------------------------------------------------------------------------


def train_with_ema_and_best_snapshot(device, steps=5):
    """An EMA of the weights and a best-model snapshot, both ``copy.deepcopy`` after ``.to(device)``."""
    torch.manual_seed(0)
    model = _mlp().to(device)
    ema = copy.deepcopy(model).requires_grad_(False)
    assert all(p.device == torch.device(device) for p in ema.parameters()), "the copy lives where the model does"
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    x, y = _data(device)
    losses, best, best_loss = [], None, float("inf")
    for _ in range(steps):
        losses.append(_step(model, opt, x, y))
        with torch.no_grad():
            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.25)
        if losses[-1] < best_loss:
            best_loss, best = losses[-1], copy.deepcopy(model.state_dict())
    with torch.no_grad():
        losses.append(F.cross_entropy(ema(x), y).item())
    model.load_state_dict(best)
    return losses, _state(model), _state(ema)


def test_a_model_deep_copied_on_the_device_for_ema_and_best_snapshot(sess):
    _assert_same_run(train_with_ema_and_best_snapshot(sess.device), train_with_ema_and_best_snapshot("cpu"))


def resume_from_a_local_checkpoint(device, path, steps=3):
    """A checkpoint saved on the CPU, loaded with ``map_location=device``, training resumed there."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = _data("cpu")
    for _ in range(2):
        _step(model, opt, x, y)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": 2}, path)
    checkpoint = torch.load(path, map_location=device)
    tensors = [*checkpoint["model"].values(), *(v for s in checkpoint["opt"]["state"].values() for v in s.values())]
    assert all(t.device == torch.device(device) for t in tensors) and checkpoint["epoch"] == 2
    resumed = _mlp().to(device)
    resumed.load_state_dict(checkpoint["model"])
    opt = torch.optim.Adam(resumed.parameters(), lr=0.01)
    opt.load_state_dict(checkpoint["opt"])
    x, y = x.to(device), y.to(device)
    return [_step(resumed, opt, x, y) for _ in range(steps)], _state(resumed)


def test_a_checkpoint_saved_locally_resumes_on_the_device(sess, tmp_path):
    _assert_same_run(resume_from_a_local_checkpoint(sess.device, tmp_path / "remote.pt"),
                     resume_from_a_local_checkpoint("cpu", tmp_path / "local.pt"))


# -- decoding, distributions, LBFGS ----------------------------------------------------------------


class TinyLM(nn.Module):
    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

    def forward(self, idx):
        return self.head(torch.tanh(self.emb(idx)))


@torch.no_grad()
def generate_with_top_k_and_eos(device, new_tokens=8, k=3):
    """``generate``'s loop: top-k sampling, finished rows padded, a stop once every row met an eos token."""
    torch.manual_seed(0)
    model = TinyLM().to(device)
    torch.manual_seed(1)  # the sampler's draws: the local generator, or the session's (seeded alike)
    idx = torch.tensor([[1, 2], [3, 4], [5, 6]], device=device)
    eos = torch.tensor([0, 7], device=device)
    finished = torch.zeros(idx.shape[0], dtype=torch.bool, device=device)
    for _ in range(new_tokens):
        logits = model(idx)[:, -1, :]
        top, _ = torch.topk(logits, k)
        logits[logits < top[:, [-1]]] = -float("inf")
        nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
        nxt = torch.where(finished[:, None], torch.zeros_like(nxt), nxt)
        idx = torch.cat([idx, nxt], dim=1)
        finished |= torch.isin(nxt[:, 0], eos)
        if finished.all():
            break
    return idx.cpu()


def test_generate_with_top_k_sampling_and_an_eos_stop(sess):
    assert torch.equal(generate_with_top_k_and_eos(sess.device), generate_with_top_k_and_eos("cpu"))


def train_gaussian_likelihood(device, steps=4):
    """A ``torch.distributions.Normal`` whose parameters the model predicts; the loss is its negative log-likelihood."""
    torch.manual_seed(0)
    model = nn.Linear(6, 2).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    x, _ = _data(device)
    target = x[:, :1] * 0.5 + 0.1
    losses = []
    for _ in range(steps):
        mean, log_std = model(x).chunk(2, dim=-1)
        loss = -torch.distributions.Normal(mean, log_std.exp()).log_prob(target).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, _state(model)


def test_a_normal_distributions_log_likelihood_loss(sess):
    _assert_same_run(train_gaussian_likelihood(sess.device), train_gaussian_likelihood("cpu"))


def train_with_lbfgs(device, steps=3):
    """LBFGS with a closure that builds a tensor with ``Tensor.new``; a parameter without a gradient makes LBFGS
    itself call ``p.new(p.numel()).zero_()``."""
    torch.manual_seed(0)
    model = nn.Linear(6, 1).to(device)
    model.unused = nn.Parameter(torch.zeros(2, device=device))
    x, _ = _data(device)
    target = x.sum(dim=1, keepdim=True) * 0.3
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=3)

    def closure():
        opt.zero_grad()
        pred = model(x)
        weights = pred.new([0.5, 2.0]).repeat(pred.shape[0] // 2).unsqueeze(1)  # the legacy constructor
        loss = (weights * (pred - target) ** 2).mean()
        loss.backward()
        return loss

    return [opt.step(closure).item() for _ in range(steps)], _state(model)


def test_an_lbfgs_closure_using_tensor_new(sess):
    _assert_same_run(train_with_lbfgs(sess.device), train_with_lbfgs("cpu"), rtol=1e-4, atol=1e-5)


# -- autocast and a local DataLoader ---------------------------------------------------------------


def train_under_autocast(device, steps=3):
    """``torch.autocast(device_type=device.type, dtype=torch.bfloat16)`` around the forward, as for CUDA."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data(device)
    losses = []
    for _ in range(steps):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            out = model(x)
            loss = F.cross_entropy(out, y)
        assert (out.dtype, loss.dtype) == (torch.bfloat16, torch.float32), "linear in bf16, the loss in float32"
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, _state(model)


def test_autocast_with_the_devices_type_in_bf16(sess):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch must not turn autocast off for the remote device
        got = train_under_autocast(sess.device)
    _assert_same_run(got, train_under_autocast("cpu"), rtol=0, atol=0)  # the server's torch casts as torch


def train_from_a_pinned_cpu_loader(device, epochs=2):
    """A CPU ``DataLoader(pin_memory=True)`` whose batches move with ``.to(device, non_blocking=True)``."""
    torch.manual_seed(0)
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data("cpu")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(3), pin_memory=True)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(epochs):
            for xb, yb in loader:
                losses.append(_step(model, opt, xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)))
    return losses, _state(model), sorted({str(w.message) for w in caught})


def test_a_cpu_dataloader_with_pin_memory_in_the_same_process(sess):
    got, want = train_from_a_pinned_cpu_loader(sess.device), train_from_a_pinned_cpu_loader("cpu")
    _assert_same_run(got[:2], want[:2])
    assert got[2] == want[2], "the loader warns (or not) alike"

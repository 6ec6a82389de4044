"""On ``sess.device`` torch's optimizers and ``clip_grad_norm_`` take their foreach paths, as on ``cuda``
(``client/tensor/_foreach.py``), and train to local torch's values bit for bit.

Each optimizer steps an MLP with clipping, once with ``device="cpu"`` (torch's single-tensor path)
and once with ``sess.device`` (now its foreach path): the device is the only difference, and the
losses and final parameters must be equal. The programs sent must hold foreach ops and no
per-parameter update, and ``foreach=False`` must still give the per-parameter path.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bench import _hot
from remote_autograd import client

OPTIMIZERS = {
    "sgd-momentum": lambda p, **kw: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=0.01, **kw),
    "adamw-amsgrad": lambda p, **kw: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, amsgrad=True, **kw),
    "rmsprop-centered": lambda p, **kw: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, **kw),
    "adagrad": lambda p, **kw: torch.optim.Adagrad(p, lr=0.05, **kw),
    "adamax": lambda p, **kw: torch.optim.Adamax(p, lr=0.01, **kw),
    "adadelta": lambda p, **kw: torch.optim.Adadelta(p, **kw),
    "rprop": lambda p, **kw: torch.optim.Rprop(p, lr=0.01, **kw),
}
# their foreach paths round differently from their single-tensor ones: left on the single-tensor path
SINGLE_TENSOR = {
    "nadam": lambda p, **kw: torch.optim.NAdam(p, lr=0.01, **kw),
    "radam": lambda p, **kw: torch.optim.RAdam(p, lr=0.01, **kw),
    "asgd": lambda p, **kw: torch.optim.ASGD(p, lr=0.01, **kw),
}


def _train(device, make_optimizer, **kw):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(device)
    opt = make_optimizer(model.parameters(), **kw)
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(32, 6, generator=g), torch.randint(0, 3, (32,), generator=g)
    losses = []
    for step in range(4):
        i = (step * 8) % 32
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 8].to(device)), Y[i:i + 8].to(device))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _ops_sent(make_optimizer, **kw) -> tuple[list, list, set]:
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess, _hot.recording(tap) as programs:
        losses, params = _train(sess.device, make_optimizer, **kw)
        return losses, params, {s["op"] for p in programs() for s in p["steps"] if s.get("kind") == "call"}


def _trained_as_local_torch(make_optimizer) -> set:
    """Train on sess.device and on the CPU: the same losses and parameters, bit for bit; the ops sent."""
    losses, params, ops = _ops_sent(make_optimizer)
    local_losses, local_params = _train("cpu", make_optimizer)
    assert losses == local_losses
    for remote, local in zip(params, local_params):
        assert torch.equal(remote, local)
    return ops


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_optimizer_takes_its_foreach_path_and_trains_as_local_torch(name):
    ops = _trained_as_local_torch(OPTIMIZERS[name])
    assert {"_foreach_norm", "_foreach_mul_"} <= ops  # clip_grad_norm_'s foreach path
    assert any(op.startswith("_foreach_") and op not in ("_foreach_norm", "_foreach_mul_")
               for op in ops), f"{name} sent no foreach update: {sorted(ops)}"


@pytest.mark.parametrize("name", list(SINGLE_TENSOR))
def test_an_optimizer_whose_paths_differ_keeps_the_single_tensor_path(name):
    ops = _trained_as_local_torch(SINGLE_TENSOR[name])
    assert not any(op.startswith("_foreach_") and op not in ("_foreach_norm", "_foreach_mul_") for op in ops)


def test_foreach_false_keeps_the_single_tensor_path():
    _, _, ops = _ops_sent(OPTIMIZERS["adam"], foreach=False)
    assert "Tensor.addcdiv_" in ops and not any(op.startswith("_foreach_a") for op in ops)


def test_param_groups_read_as_the_user_made_them():
    """The foreach the hook sets lasts one step: a checkpoint's param_groups are the user's."""
    with client.connect(transport=client.InProcessTransport()) as sess:
        model = nn.Linear(3, 2).to(sess.device)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.ones(4, 3, device=sess.device)).sum().backward()
        opt.step()
        assert opt.param_groups[0]["foreach"] is None
        assert opt.state_dict()["param_groups"][0] == torch.optim.Adam(nn.Linear(3, 2).parameters(), lr=0.1).state_dict()[
            "param_groups"][0]


@pytest.mark.slow  # a process of its own importing torch.distributed
def test_torch_distributed_optim_still_compiles():
    """torch.distributed.optim compiles torch's optimizer functions with TorchScript at its import."""
    import subprocess
    import sys
    code = "import remote_autograd.client, torch.distributed.optim"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

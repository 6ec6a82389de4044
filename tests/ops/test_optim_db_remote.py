"""Every optimizer of torch's ``optim_db`` on the remote device against local torch.

The ops the surface took from ``optim`` (``torch._foreach_*``, ``torch._fused_*``, the scalar
updates) are checked here: each optimizer, plain, ``foreach`` and ``fused`` where the CPU has it,
on its first two argument sets, takes three steps of fixed gradients on a tiny model, locally and
on the server (an in-process one); the parameters and the optimizer's state must agree.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from remote_autograd import client
from tools.derive_ops._record import _impls

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_optimizers import optim_db

pytestmark = pytest.mark.optable

CASES = []
for _info in optim_db:
    if _info.only_supports_sparse_grads:
        continue
    for _i, _input in enumerate(_info.optim_inputs_func(device="cpu")[:2]):
        _kwargs = {k: v for k, v in _input.kwargs.items() if k not in ("foreach", "fused", "differentiable")}
        if _kwargs.get("capturable"):
            continue
        for _impl in _impls(_info):
            how = "-".join(f"{k}={v}" for k, v in _impl.items()) or "plain"
            CASES.append(pytest.param(_info, {**_kwargs, **_impl}, id=f"{_info.name}-{_i}-{how}"))


@pytest.fixture(scope="module")
def device():
    with client.connect(transport=client.InProcessTransport()) as sess:
        yield sess.device


def _params(two_d_only: bool) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 2)] if two_d_only else [(3, 2), (3,)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]


def _train(info, kwargs, params, device=None) -> None:
    opt = info.optim_cls(params, **kwargs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]

        def closure():
            opt.zero_grad()
            loss = sum(((p - 1) ** 2).sum() for p in params)
            loss.backward()
            return loss

        for p, g in zip(params, grads):
            p.grad = g.to(device) if device is not None else g
        opt.step(closure) if info.step_requires_closure else opt.step()
    return opt


@pytest.mark.parametrize("info, kwargs", CASES)
def test_optimizer_steps_as_on_the_cpu(info, kwargs, device):
    two_d_only = info.name == "Muon"  # matrices only
    local = _params(two_d_only)
    remote = [p.detach().to(device).requires_grad_() for p in copy.deepcopy(local)]
    want = _train(info, kwargs, local)
    got = _train(info, kwargs, remote, device)
    for r, lp in zip(remote, local):
        torch.testing.assert_close(r.to_torch().detach(), lp.detach(), rtol=1e-7, atol=1e-9)
    for rp, lp in zip(remote, local):
        for key, value in want.state[lp].items():
            other = got.state[rp][key]
            if isinstance(value, torch.Tensor):
                other = other.to_torch() if isinstance(other, client.RemoteTensor) else other
                torch.testing.assert_close(other, value, rtol=1e-7, atol=1e-9, msg=lambda m, k=key: f"{k}: {m}")

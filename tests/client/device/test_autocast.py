"""``torch.autocast`` around remote ops, against the same code on local torch.

The user writes ``torch.autocast(device_type=device.type, dtype=...)`` with ``device = sess.device``,
as for CUDA; the local reference runs on the server's device under its autocast
(``autocast("cpu")`` on CPU tensors for the CPU test server). An autocast for another device
type (``"cpu"``, ``"cuda"``) leaves remote ops alone, as torch leaves other devices' tensors.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from remote_autograd import client
from remote_autograd.client.session._steps import Origin


def autocast_on(device: torch.device, dtype: torch.dtype):
    """What the user writes: an autocast region for the tensors' own device type, which torch must not turn off."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns, and disables autocast, for a device type without its dtypes
        return torch.autocast(device_type=device.type, dtype=dtype)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3)
        self.norm = nn.LayerNorm(4)
        self.fc = nn.Linear(4 * 6, 5)

    def forward(self, x):
        h = F.relu(self.conv(x))  # conv: low precision
        h = self.norm(h.transpose(1, 2))  # layer_norm: as torch's CPU autocast says
        h = h.flatten(1)
        return self.fc(h)  # linear: low precision


def _run(model, x, target, ctx):
    with ctx:
        out = model(x)
        probs = out.softmax(-1)
        loss = F.cross_entropy(out, target) + (probs @ torch.ones(5, 2, device=target.device)).pow(2).mean()
    loss.backward()
    return out, probs, loss


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_forward_backward_matches_torch(sess, dtype):
    torch.manual_seed(0)
    model = Net()
    x, target = torch.randn(3, 2, 8), torch.tensor([0, 4, 2])
    device = torch.device(sess.remote_device)  # the reference runs where the server does, under its autocast
    local_model = copy.deepcopy(model).to(device)
    local = _run(local_model, x.to(device), target.to(device), torch.autocast(device.type, dtype=dtype))
    remote_model = copy.deepcopy(model).to(sess.device)
    remote = _run(remote_model, x.to(sess.device), target.to(sess.device), autocast_on(sess.device, dtype))
    assert local[0].dtype == dtype  # the reference really ran under autocast
    for r, l in zip(remote, local):
        assert r.dtype == l.dtype and r.shape == l.shape  # the client's metadata is the server's
        torch.testing.assert_close(r.to_torch().detach(), l.detach().cpu(), rtol=0, atol=0)
    for (name, lp), rp in zip(local_model.named_parameters(), remote_model.parameters()):
        got, want = rp.grad.to_torch(), lp.grad.cpu()
        if name == "norm.bias":
            # The table's layer_norm sums the bias gradient in the low dtype; torch's mixed-dtype kernel
            # accumulates in float32: the two differ by the low dtype's rounding of that sum.
            tolerance = 2 * torch.finfo(dtype).eps * want.abs().max().item()
            torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_another_device_types_autocast_leaves_remote_ops_alone_as_torch_leaves_other_devices(sess, device_type):
    w, x = torch.randn(4, 3), torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast("cuda") on a client without CUDA turns itself off, saying so
        with torch.autocast(device_type, dtype=torch.bfloat16):
            local = F.linear(x, w)
            remote = F.linear(sess.tensor(x), sess.tensor(w))
    assert local.dtype == (torch.bfloat16 if device_type == "cpu" else torch.float32)
    assert remote.dtype == torch.float32
    torch.testing.assert_close(remote.to_torch(), F.linear(x, w))


def test_the_remote_device_lists_torchs_autocast_dtypes(sess):
    assert torch.remote.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    with pytest.warns(UserWarning, match="target dtype is not supported. Disabling autocast"):
        with torch.autocast(device_type=sess.device.type, dtype=torch.float64):  # as torch refuses it for CUDA
            assert not torch.is_autocast_enabled(sess.device.type)


def test_views_under_autocast_still_share_memory(sess):
    y = sess.tensor(torch.zeros(2, 3))
    with autocast_on(sess.device, torch.bfloat16):
        v = y[0]
        v.add_(1)
        z = y.t().float()
    assert v.dtype == torch.float32 and z.dtype == torch.float32
    torch.testing.assert_close(y.to_torch(), torch.tensor([[1.0, 1, 1], [0, 0, 0]]))


def test_float64_is_left_alone_like_torch(sess):
    w, x = torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        local = x @ w.t()
    with autocast_on(sess.device, torch.bfloat16):
        remote = sess.tensor(x) @ sess.tensor(w).t()
    assert remote.dtype == local.dtype == torch.float64
    torch.testing.assert_close(remote.to_torch(), local, rtol=0, atol=0)


def test_an_autocast_dtype_the_server_does_not_support_is_a_422(sess):
    x = sess.tensor(torch.randn(3))
    sess.enqueue({"kind": "call", "op": "relu", "args": [x._ref()], "out": [sess.new_id()], "autocast": "float32"},
                 Origin("relu", None))
    with pytest.raises(client.RemoteError, match="autocast: dtype 'float32' is not supported") as got:
        sess.sync()
    assert got.value.status == 422


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_torch_composites_under_autocast_cast_op_by_op_as_torch(sess, dtype):
    """Native entries that are torch composites (multi-head attention, a GRU) run inside torch's own
    autocast on the server, so each op within them is cast as torch casts it locally."""
    torch.manual_seed(0)
    mha, gru = nn.MultiheadAttention(8, 2, batch_first=True), nn.GRU(8, 8, batch_first=True)
    x = torch.randn(2, 5, 8)

    def run(mha, gru, x, ctx):
        with ctx:
            out, weights = mha(x, x, x)
            h, _ = gru(out.float())
            loss = h.float().pow(2).mean() + weights.float().sum()
        loss.backward()
        return out, weights, h, loss

    device = torch.device(sess.remote_device)
    local_models = copy.deepcopy(mha).to(device), copy.deepcopy(gru).to(device)
    local = run(*local_models, x.to(device), torch.autocast(device.type, dtype=dtype))
    remote_models = copy.deepcopy(mha).to(sess.device), copy.deepcopy(gru).to(sess.device)
    remote = run(*remote_models, x.to(sess.device), autocast_on(sess.device, dtype))
    for r, l in zip(remote, local):
        assert r.dtype == l.dtype and r.shape == l.shape
        torch.testing.assert_close(r.cpu().detach(), l.detach().cpu(), rtol=0, atol=0)
    for lm, rm in zip(local_models, remote_models):
        for (name, lp), rp in zip(lm.named_parameters(), rm.parameters()):
            torch.testing.assert_close(rp.grad.cpu(), lp.grad.cpu(), rtol=0, atol=0, msg=lambda m: f"{name}: {m}")

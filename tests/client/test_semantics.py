"""Torch semantics through the SDK: in-place rules, autograd flags, conversions, higher-order grads."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from remote_autograd import client


def test_in_place_overwriting_a_saved_value_fails_at_backward_like_torch(sess):
    local = torch.randn(3, requires_grad=True)
    y = local.sigmoid()
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as want:
        y.sum().backward()
    x = sess.tensor(local.detach(), requires_grad=True)
    r = x.sigmoid()
    r.mul_(2)
    with pytest.raises(client.RemoteError, match="modified by an inplace operation"):
        r.sum().backward()
        sess.sync()
    del want


def test_in_place_results_and_grads_match_torch(sess):
    t = torch.randn(4)
    for make in (lambda a: a.add_(1), lambda a: a.mul_(3), lambda a: a.sub_(2), lambda a: a.div_(4),
                 lambda a: a.clamp_(-0.5, 0.5), lambda a: a.relu_(), lambda a: a.masked_fill_(a > 0, 7.0),
                 lambda a: a.fill_(2.0), lambda a: a.zero_()):
        local = t.clone().requires_grad_()
        y = local * 1.5
        make(y)
        (y * torch.arange(4.0)).sum().backward()
        x = sess.tensor(t, requires_grad=True)
        r = x * 1.5
        make(r)
        (r * torch.arange(4.0, device=r.device)).sum().backward()
        torch.testing.assert_close(r.to_torch().detach(), y.detach())
        torch.testing.assert_close(x.grad.to_torch(), local.grad)


def test_setitem_and_iadd(sess):
    t = torch.randn(3, 4)
    local = t.clone().requires_grad_()
    y = local * 1
    y[0] = 5.0
    y[1:, 2] += 1
    y.sum().backward()
    x = sess.tensor(t, requires_grad=True)
    r = x * 1
    r[0] = 5.0
    r[1:, 2] += 1
    r.sum().backward()
    torch.testing.assert_close(r.to_torch().detach(), y.detach())
    torch.testing.assert_close(x.grad.to_torch(), local.grad)


def test_retain_grad_and_backward_inputs(sess):
    t = torch.randn(3)
    x = sess.tensor(t, requires_grad=True)
    w = sess.tensor(torch.ones(3), requires_grad=True)
    h = x * w
    h.retain_grad()
    (h * h).sum().backward(inputs=[w])
    assert x.grad is None and h.grad is None
    torch.testing.assert_close(w.grad.to_torch(), 2 * t * t)
    h2 = x * w
    h2.retain_grad()
    (h2 * 3).sum().backward()
    torch.testing.assert_close(h2.grad.to_torch(), torch.full((3,), 3.0))


@pytest.mark.parametrize("device", ["cpu", "remote"])
def test_a_leaf_a_backward_reaches_without_a_grad_keeps_none_beside_others(sess, device):
    """``vector_norm(u, 0)`` reaches ``u`` yet gives it no grad: torch leaves ``u.grad`` None. The
    SDK, which predicted a grad, corrects itself from the server's answer; with another leaf of
    another shape beside it (a list's ``in`` on tensors would compare them with torch.eq)."""
    device = sess.device if device == "remote" else device
    x = torch.arange(6.0).to(device).requires_grad_()
    u = torch.arange(4.0).to(device).requires_grad_()
    (torch.linalg.vector_norm(u, 0) + (x * 2).sum()).backward(inputs=[x, u])
    sess.sync()  # the correction comes with the answer: before it, u.grad is a handle (see the README)
    assert u.grad is None
    assert torch.equal(x.grad.cpu(), torch.full((6,), 2.0))


def test_integer_and_bool_tensors_never_require_grad(sess):
    i = sess.tensor(torch.arange(3))
    assert not i.requires_grad
    x = sess.tensor(torch.randn(3), requires_grad=True)
    assert not (x > 0).requires_grad and not x.argmax().requires_grad and not x.long().requires_grad


def test_enable_grad_inside_no_grad(sess):
    x = sess.tensor(torch.randn(2), requires_grad=True)
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
        z = x * 2
    assert y.requires_grad and not z.requires_grad


def test_conversions_and_views(sess):
    t = torch.randn(2, 3)
    x = sess.tensor(t)
    assert x.float().dtype == torch.float32 and x.double().dtype == torch.float64
    assert x.half().dtype == torch.float16 and x.bfloat16().dtype == torch.bfloat16 and x.long().dtype == torch.int64
    assert x.to(torch.float64).dtype == torch.float64
    torch.testing.assert_close(x.T.to_torch(), t.T)
    torch.testing.assert_close(x.mT.to_torch(), t.mT)
    assert len(x) == 2
    rows = list(x)
    assert len(rows) == 2 and torch.equal(rows[1].to_torch(), t[1])
    local = x.cpu()
    assert type(local) is torch.Tensor and not local.requires_grad


@pytest.mark.parametrize("a_dtype, b", [(torch.int64, 2.5), (torch.float16, torch.ones(3, dtype=torch.float32)),
                                        (torch.int32, torch.ones(3, dtype=torch.float64)), (torch.bool, 3)])
def test_type_promotion(sess, a_dtype, b):
    a = torch.ones(3, dtype=a_dtype)
    want = a + b
    got = sess.tensor(a) + (sess.tensor(b) if isinstance(b, torch.Tensor) else b)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.to_torch(), want)


def test_hessian_vector_product(sess):
    t = torch.randn(4, dtype=torch.float64)
    v = torch.randn(4, dtype=torch.float64)
    local = t.clone().requires_grad_()
    (g,) = torch.autograd.grad((local.sin() * local).sum(), local, create_graph=True)
    (hvp,) = torch.autograd.grad(g, local, v)
    x = sess.tensor(t, requires_grad=True)
    (rg,) = torch.autograd.grad((x.sin() * x).sum(), x, create_graph=True)
    (rhvp,) = torch.autograd.grad(rg, x, sess.tensor(v))
    torch.testing.assert_close(rhvp.to_torch(), hvp)


def test_autograd_backward_function(sess):
    x = sess.tensor(torch.randn(3), requires_grad=True)
    torch.autograd.backward([(x * 2).sum()])
    assert x.grad.tolist() == [2.0, 2.0, 2.0]


def test_small_cnn_matches_local_training_step_by_step(sess):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    local, remote = copy.deepcopy(net), sess.module(net)
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    Xr, Yr = sess.tensor(X), sess.tensor(Y)
    opt_l = torch.optim.SGD(local.parameters(), lr=0.05, momentum=0.9)
    opt_r = torch.optim.SGD(remote.parameters(), lr=0.05, momentum=0.9)
    for _ in range(20):
        losses = []
        for model, opt, x, y in ((local, opt_l, X, Y), (remote, opt_r, Xr, Yr)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    sd = remote.state_dict()
    for k, v in local.state_dict().items():
        torch.testing.assert_close(sd[k].cpu(), v, rtol=1e-5, atol=1e-5)


def test_tensor_data_is_queued_and_laid_out_as_torch(sess):
    """``p.data`` reads send nothing until a value is needed (an update loop over parameters is one
    program), and ``.data`` in both directions keeps torch's strides and dtypes."""
    local = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    params = [t.to(sess.device) for t in local]
    sess.sync()
    before = sess.requests
    for p, t in zip(params, local):
        p.data.mul_(0.5)
        t.data.mul_(0.5)
    assert sess.requests == before
    assert all(torch.equal(p.cpu(), t) for p, t in zip(params, local))
    assert params[0].t().data.stride() == local[0].t().data.stride()
    p, lp = params[1], local[1]
    p.data, lp.data = params[2].t(), local[2].t()
    assert (p.shape, p.stride(), p.is_contiguous()) == (lp.shape, lp.stride(), lp.is_contiguous())
    p.data, lp.data = torch.zeros(2, dtype=torch.float64).to(sess.device), torch.zeros(2, dtype=torch.float64)
    assert (p.dtype, p.shape, p.stride()) == (lp.dtype, lp.shape, lp.stride())
    assert torch.equal(p.cpu(), lp)

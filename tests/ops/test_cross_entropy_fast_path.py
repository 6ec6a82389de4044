"""The class losses through the SDK are torch's own, bit for bit: ``F.cross_entropy`` and ``F.nll_loss``
on the server (torch's own entries since the table is torch's surface; they replaced a hand-written
one-node fast path) give local torch's values, gradients and double-backward gradients exactly,
over class indices, 1-d and 2-d inputs, transposed views, weights, ignore_index and reductions."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from remote_autograd import client

from ..bits import assert_same_bits

# (input shape, whether the input is a transposed view); the classes are the last dim
SHAPES = [((64, 10), False), ((5, 3), False), ((1, 4), False), ((7,), False), ((6, 5), True), ((0, 3), False)]
CASES = list(itertools.product(SHAPES, [False, True], [-100, 1], ["mean", "sum", "none"]))


@pytest.fixture(scope="module")
def device():
    with client.connect(transport=client.InProcessTransport()) as sess:
        yield sess.device


def _id(case) -> str:
    (shape, transposed), weighted, ignore_index, reduction = case
    shape = "x".join(map(str, shape)) + ("-T" if transposed else "")
    return f"{shape}{'-w' if weighted else ''}-ii{ignore_index}-{reduction}"


def _inputs(case, dtype, target_dtype=torch.int64, seed=0):
    (shape, transposed), weighted, ignore_index, reduction = case
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(reversed(shape)) if transposed else shape, generator=gen, dtype=dtype)
    x = x.t() if transposed else x
    n_classes = shape[-1]
    target = torch.randint(0, n_classes, shape[:-1], generator=gen).to(target_dtype)
    if target.numel() >= 2:  # ignore_index=1 hits one target at least, and keeps one
        target.view(-1)[0], target.view(-1)[-1] = 1, 0
    weight = torch.rand(n_classes, generator=gen, dtype=dtype) + 0.1 if weighted else None
    return x, target, dict(weight=weight, ignore_index=ignore_index, reduction=reduction)


def _both(device, loss_fn, case, dtype, target_dtype=torch.int64):
    """(local, remote) of: the loss, d loss/dx, and the two gradients of a function of d loss/dx."""
    x, target, kw = _inputs(case, dtype, target_dtype)
    answers = []
    for on in (None, device):
        xs = (x.to(on) if on is not None else x.clone()).requires_grad_()
        t = target.to(on) if on is not None else target
        w = {k: (v.to(on) if isinstance(v, torch.Tensor) and on is not None else v) for k, v in kw.items()}
        loss = loss_fn(xs, t, **w)
        g = torch.ones_like(loss).requires_grad_()
        (dx,) = torch.autograd.grad(loss, xs, g, create_graph=True)
        second = torch.autograd.grad((dx * dx.detach().cos()).sum(), (xs, g))
        answers.append([v.to_torch() if isinstance(v, client.RemoteTensor) else v
                        for v in (loss.detach(), dx.detach(), *second)])
    return answers


def _log_softmax_then_nll(x, target, **kw):
    return F.nll_loss(torch.log_softmax(x, -1), target, **kw)


@pytest.mark.parametrize("loss_fn", [F.cross_entropy, _log_softmax_then_nll], ids=["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_class_losses_are_torch_bit_for_bit(case, dtype, loss_fn, device):
    local, remote = _both(device, loss_fn, case, dtype)
    for got, want in zip(remote, local):
        assert_same_bits(got, want.detach())


def test_everything_ignored_as_torch_and_byte_targets_refused_loudly(device):
    x = torch.randn(4, 3)
    for reduction in ("mean", "sum", "none"):  # the mean of nothing is 0/0, as torch
        want = F.cross_entropy(x, torch.full((4,), 2), ignore_index=2, reduction=reduction)
        got = F.cross_entropy(x.to(device), torch.full((4,), 2).to(device), ignore_index=2, reduction=reduction)
        assert_same_bits(got.to_torch(), want)
    # torch's CPU kernel takes uint8 class indices; its meta kernel, which checks every call first, does not
    with pytest.raises(client.RemoteError, match="Expected dtype int32/int64 for index"):
        F.cross_entropy(x.to(device), torch.zeros(4, dtype=torch.uint8).to(device)).to_torch()

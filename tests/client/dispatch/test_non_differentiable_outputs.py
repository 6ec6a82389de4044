"""An output torch's autograd leaves without a graph, though an input requires grad, says so on the
client too: ``requires_grad`` and ``grad_fn is None`` as torch has them, not the plain rule's "every
floating output of a call with an input that requires grad requires grad" (a silent difference)."""

from __future__ import annotations

import pytest
import torch


def _layer_norm(x, w, b):
    return torch.native_layer_norm(x, [4], w, b, 1e-5)


def _batch_norm(x, w, b):
    return torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)


def _lu(x, w, b):
    return torch.linalg.lu(x[:, :4] @ x[:, :4].mT + torch.eye(3, device=x.device))


def _lu_unpack(x, w, b):
    lu, pivots = torch.linalg.lu_factor(x[:, :3] @ x[:, :3].mT + torch.eye(3, device=x.device))
    return torch.lu_unpack(lu, pivots)


@pytest.mark.parametrize("op", [_layer_norm, _batch_norm, _lu, _lu_unpack], ids=lambda f: f.__name__[1:])
def test_each_output_requires_grad_as_torchs(sess, op):
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    local = [t.requires_grad_() for t in (x.clone(), w.clone(), b.clone())]
    remote = [sess.tensor(t, requires_grad=True) for t in (x, w, b)]
    want, got = op(*local), op(*remote)
    assert [o.requires_grad for o in got] == [o.requires_grad for o in want]
    assert [o.grad_fn is None for o in got] == [o.grad_fn is None for o in want]
    assert any(not o.requires_grad for o in want)  # the case this test is about is there
    for o, w_ in zip(got, want):
        assert torch.allclose(o.to_torch().detach(), w_.detach(), atol=1e-5)
    first = next(o for o, w_ in zip(got, want) if w_.requires_grad)
    first.sum().backward()  # the differentiable output still carries its graph
    assert remote[0].grad is not None

"""The SDK surface against a real server: metadata, values, autograd semantics, errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from remote_autograd import client


def test_metadata_is_local(sess):
    x = sess.tensor(torch.randn(3, 4), requires_grad=True)
    before = sess.requests
    assert isinstance(x, torch.Tensor) and isinstance(x, client.RemoteTensor)
    assert x.shape == (3, 4) and x.size() == torch.Size([3, 4]) and x.size(1) == 4 and x.size(-1) == 4
    assert x.dtype == torch.float32 and x.ndim == 2 and x.dim() == 2 and x.numel() == 12 and len(x) == 3
    assert x.requires_grad and x.is_leaf and x.grad is None and x.grad_fn is None
    assert x.remote_device == sess.remote_device
    y = x * 2
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    assert sess.requests == before, "metadata must not cost a request"


def test_tensor_accepts_tensors_arrays_lists_scalars(sess):
    assert sess.tensor([[1.0, 2.0], [3.0, 4.0]]).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert sess.tensor(np.arange(3, dtype=np.int16)).dtype == torch.int16
    assert sess.tensor(2.5).item() == 2.5
    assert sess.tensor(7, dtype=torch.float64).dtype == torch.float64
    assert torch.equal(sess.tensor(torch.arange(4)).to_torch(), torch.arange(4))


def test_values(sess):
    t = torch.randn(2, 3)
    x = sess.tensor(t)
    assert x.tolist() == t.tolist()
    np.testing.assert_array_equal(x.numpy(), t.numpy())
    assert torch.equal(x.cpu(), t) and torch.equal(x.to("cpu"), t)
    assert x.to(x.device) is x
    s = x.sum()
    assert s.item() == pytest.approx(t.sum().item())
    assert float(s) == pytest.approx(t.sum().item())
    assert f"{s:.3f}" == f"{t.sum().item():.3f}"
    assert bool(sess.tensor(1.0)) is True
    assert repr(x) == repr(t)[:-1] + f", device='{sess.device}')"  # as torch prints a CUDA tensor


def test_numpy_refused_when_requires_grad(sess):
    x = sess.tensor(torch.ones(2), requires_grad=True)
    with pytest.raises(RuntimeError, match="detach"):
        x.numpy()
    np.testing.assert_array_equal(x.detach().numpy(), np.ones(2, dtype=np.float32))


def test_operators_with_numbers_on_either_side(sess):
    t = torch.rand(3) + 0.5
    x = sess.tensor(t)
    for got, want in [(1 - x, 1 - t), (x / 2, t / 2), (2 / x, 2 / t), (x ** 2, t ** 2), (2 ** x, 2 ** t),
                      (-x, -t), (x + 1, t + 1), (3 * x, 3 * t), (x @ x, t @ t), (x - x, t - t)]:
        torch.testing.assert_close(got.to_torch(), want, rtol=0, atol=0)


def test_from_torch_and_to_torch_follow_the_seed_rules(sess):
    t = torch.randn(3, requires_grad=True)
    t.grad = torch.ones(3)
    r = client.RemoteTensor.from_torch(t, sess)
    t.grad.add_(5)  # later changes to the source never reach the copy
    with torch.no_grad():
        t.add_(1)
    back = r.to_torch()
    assert back.requires_grad and back.is_leaf
    torch.testing.assert_close(back.detach(), t.detach() - 1)
    torch.testing.assert_close(back.grad, torch.ones(3))
    assert back.grad.dtype == back.dtype
    plain = client.RemoteTensor.from_torch(torch.zeros(2, dtype=torch.int64), sess)
    assert plain.to_torch().grad is None and not plain.requires_grad
    assert client.RemoteTensor.from_torch(torch.randn(2, requires_grad=True), sess).grad is None


def test_backward_accumulates_and_retain_graph(sess):
    t = torch.randn(4)
    x = sess.tensor(t, requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    torch.testing.assert_close(x.grad.to_torch(), 4 * t)
    with pytest.raises(client.RemoteError, match="second time|freed"):
        y.backward()
        sess.sync()
    x.grad = None
    assert x.grad is None
    (x.sum()).backward()
    torch.testing.assert_close(x.grad.to_torch(), torch.ones(4))


def test_grad_handle_in_place_changes_the_server_grad(sess):
    x = sess.tensor(torch.randn(3), requires_grad=True)
    (x * 3).sum().backward()
    x.grad.zero_()
    assert x.grad.tolist() == [0.0, 0.0, 0.0]
    x.grad.add_(2)
    assert x.to_torch().grad.tolist() == [2.0, 2.0, 2.0]


def test_no_grad_is_honoured(sess):
    x = sess.tensor(torch.randn(3), requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad
    assert not y.to_torch().requires_grad
    with torch.no_grad():
        x.mul_(2)  # allowed on a leaf under no_grad, as in torch
    assert x.is_leaf


def test_in_place_on_leaf_requiring_grad_is_refused(sess):
    x = sess.tensor(torch.randn(3), requires_grad=True)
    with pytest.raises(client.RemoteError, match="leaf Variable"):
        x.add_(1)
        sess.sync()


def test_requires_grad_flags(sess):
    x = sess.tensor(torch.randn(2))
    assert not x.requires_grad
    x.requires_grad_()
    assert x.requires_grad
    (x * 2).sum().backward()
    torch.testing.assert_close(x.grad.to_torch(), torch.full((2,), 2.0))
    x.requires_grad = False
    assert not (x * 2).requires_grad
    with pytest.raises(RuntimeError, match="floating point"):
        sess.tensor(torch.arange(3)).requires_grad_()
    d = (x * 1).detach()
    assert d.is_leaf and not d.requires_grad


def test_unknown_op_raises_not_implemented(sess):
    x = sess.tensor(torch.randn(3, 3))
    with pytest.raises(NotImplementedError, match="torch.geqrf") as info:  # refused: it has no meta kernel
        torch.geqrf(x)
    assert "call it on local copies (`x.detach().cpu()`)" in str(info.value)  # and how to run it anyway
    assert "`.to(x.device)`; no gradient" in str(info.value)


def test_remote_error_carries_code_step_op_and_message(sess):
    a = sess.tensor(torch.randn(2, 3))
    with pytest.raises(client.RemoteError) as info:
        (a @ a).item()
    err = info.value
    assert isinstance(err, RuntimeError) and err.code == "op_error" and err.op == "Tensor.matmul" and err.status == 422
    # refused on meta before any kernel ran: torch's meta kernel's words (the CPU kernel's are "mat1 and
    # mat2 shapes cannot be multiplied (2x3 and 2x3)"; docs/known-differences.md)
    assert "[2, 3] X [2, 3]" in str(err) and "test_client.py" in str(err)


def test_pickle_stores_values_not_the_handle(sess):
    x = sess.tensor(torch.arange(4.0), requires_grad=True)
    back = pickle.loads(pickle.dumps(x))
    assert type(back) is torch.Tensor and back.tolist() == [0.0, 1.0, 2.0, 3.0] and back.requires_grad


def test_every_autograd_function_forward_runs_with_forward_ad_off():
    """refuse_custom_function skips its stack walk while forward-mode AD is on (every op of an optimizer's
    step, under no_grad): torch turns it off around each Function's forward, in both styles."""
    seen = []

    class WithCtx(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(torch._C._is_fwd_grad_enabled())
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g

    class SetupContext(WithCtx):
        @staticmethod
        def forward(x):
            seen.append(torch._C._is_fwd_grad_enabled())
            return x * 2

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

    x = torch.ones(2, requires_grad=True)
    WithCtx.apply(x), SetupContext.apply(x)
    with torch.no_grad():
        WithCtx.apply(x)
        assert torch._C._is_fwd_grad_enabled()
    assert seen == [False, False, False]


def test_custom_ops_by_name(sess):
    x = sess.tensor(torch.tensor([0.4, 1.6, -2.3]), requires_grad=True)
    y = sess.ops.straight_through_round(x)
    assert y.tolist() == [0.0, 2.0, -2.0]
    (y * sess.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(AttributeError):
        sess.ops.no_such_op


def test_autograd_grad_and_double_backward(sess):
    t = torch.randn(3, dtype=torch.float64)
    x = sess.tensor(t, requires_grad=True)
    y = (x ** 3).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    torch.testing.assert_close(g.to_torch().detach(), 3 * t ** 2)
    (h,) = client.grad(g.sum(), x)
    torch.testing.assert_close(h.to_torch(), 6 * t)


def test_mlp_training_by_rebinding_matches_local(sess):
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
    w1, w2 = torch.randn(8, 16, generator=g) * 0.3, torch.randn(16, 1, generator=g) * 0.3
    lr = 0.05

    def train(X, Y, w1, w2, steps=50):
        losses = []
        for _ in range(steps):
            h = torch.relu(X @ w1)
            loss = ((h @ w2 - Y) ** 2).mean()
            loss.backward()
            losses.append(loss.item())
            w1 = (w1 - lr * w1.grad).detach().requires_grad_()
            w2 = (w2 - lr * w2.grad).detach().requires_grad_()
        return losses

    local = train(X, Y, w1.clone().requires_grad_(), w2.clone().requires_grad_())
    remote = train(sess.tensor(X), sess.tensor(Y), sess.tensor(w1, requires_grad=True),
                   sess.tensor(w2, requires_grad=True))
    np.testing.assert_allclose(remote, local, rtol=1e-5)
    assert local[-1] < local[0]

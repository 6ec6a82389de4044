"""A user's ``torch.autograd.Function`` on remote tensors: its forward runs where torch records
nothing (under ``no_grad``/``inference_mode``, or on inputs that need no gradient) and gives local
torch's result; where torch would record it (its backward would have to run inside the server's
autograd) it is refused at the user's line, never run with its gradient lost. Checkpointing:
``use_reentrant=False`` gives local torch's gradients; ``use_reentrant=True`` is refused with what to do.

Each case runs the same code on CPU tensors and on the device."""

from __future__ import annotations

import inspect
import sys

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _line(offset: int = 0) -> str:
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


class Scaled(torch.autograd.Function):
    """``x * w * k``: a saved tensor and a non-tensor argument."""

    @staticmethod
    def forward(ctx, x, w, k):
        ctx.save_for_backward(w)
        ctx.k = k
        return x * w * k

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g * w * ctx.k, None, None


class Through(torch.autograd.Function):
    """Returns its input itself (torch then makes the output a view of it) and a second output."""

    @staticmethod
    def forward(x):
        return x, x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, g, _):
        return g


class AddInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y):
        ctx.mark_dirty(x)
        return x.add_(y)

    @staticmethod
    def backward(ctx, g):
        return g, g


def _gp_mean(train_x, train_y, test_x, lengthscale):
    """A GP's predictive mean through two Functions (gpytorch's RBFCovariance and Solve, in miniature)."""
    class RBF(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, ls):
            return torch.exp(-torch.cdist(a / ls, b / ls).pow(2) / 2)

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("never reached: nothing is recorded")

    class Solve(torch.autograd.Function):
        @staticmethod
        def forward(ctx, k, y):
            return torch.linalg.solve(k, y)

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("never reached: nothing is recorded")

    k = RBF.apply(train_x, train_x, lengthscale) + 1e-3 * torch.eye(len(train_x), dtype=train_x.dtype,
                                                                    device=train_x.device)
    return RBF.apply(test_x, train_x, lengthscale) @ Solve.apply(k, train_y.unsqueeze(-1))


def _calls(device):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
    tx, ty, qx = (torch.randn(6, 2, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64),
                  torch.randn(4, 2, generator=g, dtype=torch.float64))
    ls = torch.tensor([0.7, 1.3], dtype=torch.float64)
    x, w, tx, ty, qx = (t.to(device) for t in (x, w, tx, ty, qx))
    w, ls = w.requires_grad_(), ls.to(device).requires_grad_()  # parameters: they require grad
    return {
        "scaled": lambda: Scaled.apply(x, w, 2.5),
        "through": lambda: Through.apply(w),
        "in place": lambda: AddInPlace.apply(x.clone(), w),
        "gp mean": lambda: _gp_mean(tx, ty, qx, ls),
    }


@pytest.mark.parametrize("where", ["no_grad", "inference_mode"])
def test_a_functions_forward_runs_where_torch_records_nothing(sess, where):
    mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[where]
    local, remote = _calls("cpu"), _calls(sess.device)
    for name in local:
        with mode():
            want, got = local[name](), remote[name]()
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        for w, g in zip(want, got):
            assert g.device == sess.device and g.requires_grad == w.requires_grad, name
            torch.testing.assert_close(g.cpu(), w, msg=name)
    assert sys.getprofile() is None


def test_a_functions_forward_runs_on_inputs_that_need_no_gradient(sess):
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    got = Scaled.apply(x.to(sess.device), y.to(sess.device), 3.0)
    assert not got.requires_grad
    torch.testing.assert_close(got.cpu(), Scaled.apply(x, y, 3.0))
    out, _ = Through.apply(x.to(sess.device))
    torch.testing.assert_close(out.cpu(), x)


def test_a_function_torch_would_record_is_refused_at_the_users_line(sess):
    calls = _calls(sess.device)
    for name in ("scaled", "through", "gp mean"):
        with pytest.raises(RuntimeError, match="torch would record the call") as info:
            calls[name]()
        assert "test_user_functions.py:" in str(info.value) and "sess.ops" in str(info.value), name
    w = torch.randn(3, device=sess.device, requires_grad=True)
    line = _line(2)
    with pytest.raises(RuntimeError, match=r"Scaled\.apply with grad mode on") as info:
        Scaled.apply(w, w, 1.0)
    assert line in str(info.value) and info.traceback[0].lineno + 1 == int(line.rsplit(":", 1)[1])
    assert sys.getprofile() is None, "nothing is left watching"


def test_a_function_whose_output_is_made_without_a_remote_op_is_refused_too(sess):
    """Outputs a forward makes with ``detach()`` or from values it read are refused as well."""
    class Detached(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.detach()

        @staticmethod
        def backward(ctx, g):
            return g

    class FromValues(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.tensor(x.sum().item())

        @staticmethod
        def backward(ctx, g):
            return g.expand(3).to(g.device)

    w = torch.ones(3, device=sess.device, requires_grad=True)
    for fn in (Detached, FromValues):
        with pytest.raises(RuntimeError, match="torch would record the call"):
            fn.apply(w)
        with torch.no_grad():
            assert fn.apply(w).cpu().sum().item() == 3.0


def test_a_local_input_that_requires_grad_makes_the_call_recorded(sess):
    """torch records a call when any tensor input requires grad, a local one among remote ones too."""
    class Mixed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, remote, local):
            return remote * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2, None

    x = torch.ones(3, device=sess.device)
    with pytest.raises(RuntimeError, match="torch would record the call"):
        Mixed.apply(x, torch.ones(1, requires_grad=True))
    assert Mixed.apply(x, torch.ones(1)).cpu().tolist() == [2.0] * 3


def test_a_local_function_that_reads_remote_values_is_an_ordinary_local_node(sess):
    """Local inputs and outputs, the server used inside: torch records it in the client's autograd and
    calls its backward there (which asks the server): nothing is lost, so it runs, with grad on."""
    class OnTheServer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with torch.enable_grad():
                ctx.remote = x.detach().to(sess.device).requires_grad_()
                ctx.out = ctx.remote.sin()
            return ctx.out.detach().cpu()

        @staticmethod
        def backward(ctx, g):
            return torch.autograd.grad(ctx.out, ctx.remote, g.to(sess.device), retain_graph=True)[0].cpu()

    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: OnTheServer.apply(t), (x,), fast_mode=True)
    OnTheServer.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos())


def test_an_outer_function_around_an_inner_one_is_checked_too(sess):
    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return Scaled.apply(x, w, 2.0) + 1  # the inner call runs with grad off: recorded by nobody

        @staticmethod
        def backward(ctx, g):
            return g, g

    x, w = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64, requires_grad=True)
    xr, wr = x.to(sess.device), w.detach().to(sess.device).requires_grad_()
    with pytest.raises(RuntimeError, match=r"Outer\.apply"):
        Outer.apply(xr, wr)
    with torch.no_grad():
        torch.testing.assert_close(Outer.apply(xr, wr).cpu(), Outer.apply(x, w))
    assert sys.getprofile() is None


def test_under_a_profiler_the_call_is_refused_rather_than_guessed(sess):
    """Another profile function (cProfile, a tracer) leaves no way to wait for apply's return: refused."""
    w = torch.ones(3, device=sess.device, requires_grad=True)

    def profiler(frame, event, arg):
        return None

    before = sys.getprofile()
    sys.setprofile(profiler)
    try:
        with torch.no_grad(), pytest.raises(RuntimeError, match="A profiler is active"):
            Scaled.apply(w, w, 1.0)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(before)
    with torch.no_grad():
        assert Scaled.apply(w, w, 1.0).cpu().tolist() == [1.0] * 3


# -- checkpointing -------------------------------------------------------------------------------


def _model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double().to(device)


def _checkpointed_grads(device, use_reentrant):
    model = _model(device)
    x = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    x.requires_grad_()
    loss = checkpoint(model, x, use_reentrant=use_reentrant).pow(2).sum()
    loss.backward()
    return [t.cpu() for t in (loss.detach(), x.grad, *(p.grad for p in model.parameters()))]


def test_checkpoint_without_reentrant_gives_local_torchs_gradients(sess):
    for got, want in zip(_checkpointed_grads(sess.device, False), _checkpointed_grads("cpu", False)):
        torch.testing.assert_close(got, want)


def test_reentrant_checkpoint_says_to_pass_use_reentrant_false(sess):
    with pytest.raises(RuntimeError, match=r"use_reentrant=False.*gradient_checkpointing_kwargs") as info:
        _checkpointed_grads(sess.device, True)
    assert "test_user_functions.py:" in str(info.value)
    model, x = _model(sess.device), torch.randn(2, 4, dtype=torch.float64)
    with torch.no_grad():  # nothing recorded: the forward runs, as torch's
        got = checkpoint(model, x.to(sess.device).requires_grad_(), use_reentrant=True)
        torch.testing.assert_close(got.cpu(), _model("cpu")(x))

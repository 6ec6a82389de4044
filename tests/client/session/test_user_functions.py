"""A user's ``torch.autograd.Function`` on remote tensors: its forward runs where torch records
nothing (under ``no_grad``/``inference_mode``, or on inputs that need no gradient) and gives local
torch's result; where torch would record it, its backward runs inside the server's autograd
(``test_function_backward.py``), and what cannot is refused at the user's line, never run with its
gradient lost. Checkpointing: ``use_reentrant=False`` and ``True`` give local torch's gradients (the
reentrant one's backward, recomputation included, is recorded as a Function's).

Each case runs the same code on CPU tensors and on the device."""

from __future__ import annotations

import functools

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
        ctx.save_for_backward(x, w)
        ctx.k = k
        return x * w * k

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * ctx.k, g * x * ctx.k, None


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


def _recorded_grads(device):
    """Where torch records the calls: their outputs and the gradients of their inputs' leaves."""
    calls = _calls(device)
    found = []
    for name in ("scaled", "through", "in place"):
        outs = calls[name]()
        outs = outs if isinstance(outs, tuple) else (outs,)
        differentiable = [o for o in outs if o.requires_grad]
        found += [o.detach() for o in outs]
        found += torch.autograd.grad(sum((o * o).sum() for o in differentiable), _leaves(calls[name]))
    return found


def _leaves(call):
    """The tensors a call closes over that require grad (its parameters)."""
    cells = [c.cell_contents for c in call.__closure__ or ()]
    return [t for t in cells if isinstance(t, torch.Tensor) and t.requires_grad]


def test_a_function_torch_would_record_gives_local_torchs_result_and_gradients(sess):
    for got, want in zip(_recorded_grads(sess.device), _recorded_grads("cpu"), strict=True):
        torch.testing.assert_close(got.cpu(), want)
    assert sys.getprofile() is None, "nothing is left watching"


def test_a_backward_that_raises_is_refused_at_apply_naming_it(sess):
    """The backward is recorded as ``apply`` returns: one that raises (the GP's here) raises there, at the
    user's line (torch would raise at backward)."""
    with pytest.raises(RuntimeError, match=r"RBF\.backward raised AssertionError as the SDK recorded it") as info:
        _calls(sess.device)["gp mean"]()
    assert "test_user_functions.py:" in str(info.value)
    assert sys.getprofile() is None, "nothing is left watching"


def test_a_function_whose_output_is_made_without_a_remote_op(sess):
    """An output a forward makes with ``detach()`` gets torch's gradient; one made from values it read
    is local, its gradient would be lost: refused."""
    class Detached(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.detach()

        @staticmethod
        def backward(ctx, g):
            return g * 3

    class FromValues(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.tensor(x.sum().item())

        @staticmethod
        def backward(ctx, g):
            return g.expand(3).to(g.device)

    w = torch.ones(3, device=sess.device, requires_grad=True)
    Detached.apply(w).sum().backward()
    assert w.grad.cpu().tolist() == [3.0] * 3
    with pytest.raises(RuntimeError, match="torch would record the call"):
        FromValues.apply(w)
    with torch.no_grad():
        assert FromValues.apply(w).cpu().sum().item() == 3.0


class Mixed(torch.autograd.Function):
    """Of a remote and a local input."""

    @staticmethod
    def forward(ctx, remote, local):
        return remote * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def test_a_local_input_that_requires_grad_makes_the_call_recorded(sess):
    """torch records a call when any tensor input requires grad, a local one among remote ones too."""
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


def test_an_outer_function_around_an_inner_one(sess):
    """The inner call runs with grad off (recorded by nobody); the outer one is a node of the server's graph."""
    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return Scaled.apply(x, w, 2.0) + 1

        @staticmethod
        def backward(ctx, g):
            return g, 3 * g

    x, w = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64, requires_grad=True)
    xr, wr = x.to(sess.device), w.detach().to(sess.device).requires_grad_()
    got, want = Outer.apply(xr, wr), Outer.apply(x, w)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(got.detach().cpu(), want.detach())
    torch.testing.assert_close(wr.grad.cpu(), w.grad)
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


def _checkpointed_grads(device, use_reentrant, run=lambda model: model):
    model = _model(device)
    x = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    x.requires_grad_()
    loss = checkpoint(run(model), x, use_reentrant=use_reentrant).pow(2).sum()
    loss.backward()
    return [t.cpu() for t in (loss.detach(), x.grad, *(p.grad for p in model.parameters()))]


def test_checkpoint_without_reentrant_gives_local_torchs_gradients(sess):
    for got, want in zip(_checkpointed_grads(sess.device, False), _checkpointed_grads("cpu", False)):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("run", [
    lambda model: model,
    lambda model: model.__call__,
    lambda model: functools.partial(nn.Sequential.forward, model),  # Hugging Face's partial(forward, layer, **kw)
    lambda model: functools.partial(model.__call__),
], ids=["module", "method", "partial-of-forward", "partial-of-method"])
def test_reentrant_checkpoint_gives_local_torchs_gradients(sess, run):
    for got, want in zip(_checkpointed_grads(sess.device, True, run), _checkpointed_grads("cpu", True, run),
                         strict=True):
        torch.testing.assert_close(got, want)


def _aliasing_grads(device):
    """A recomputation whose op returns its input itself (a dropout of probability 0): the server's view of it
    is made in the step's grad mode, not the engine's (else the recomputed graph stopped there)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0), nn.Tanh()).double().to(device)
    x = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device).requires_grad_()
    checkpoint(model, x, use_reentrant=True).sum().backward()
    return [t.cpu() for t in (x.grad, *(p.grad for p in model.parameters()))]


def test_reentrant_checkpoint_through_an_op_that_returns_its_input(sess):
    for got, want in zip(_aliasing_grads(sess.device), _aliasing_grads("cpu"), strict=True):
        torch.testing.assert_close(got, want)


class _Block(nn.Module):
    """A transformer-ish block with dropout, called the way Hugging Face's gradient checkpointing calls it
    (``checkpoint(layer.__call__, hidden, use_reentrant=True)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.norm, self.drop = nn.Linear(6, 6), nn.LayerNorm(6), nn.Dropout(0.5)

    def forward(self, h):
        return h + self.drop(self.fc(self.norm(h)).tanh())


def _blocks_run(sess, checkpointed: bool, use_reentrant: bool = True):
    torch.manual_seed(0)
    blocks = nn.ModuleList([_Block(), _Block()]).double().to(sess.device)
    sess.manual_seed(7)
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(sess.device)
    h = x.requires_grad_()
    for block in blocks:
        h = checkpoint(block.__call__, h, use_reentrant=use_reentrant) if checkpointed else block(h)
    loss = h.pow(2).mean()
    loss.backward()
    after = torch.rand(3, dtype=torch.float64, device=sess.device)  # the generator as the backward left it
    return [t.cpu() for t in (loss.detach(), x.grad, *(p.grad for p in blocks.parameters()), after)]


def test_reentrant_checkpoint_redraws_the_forwards_dropout_as_torch_does_on_cuda(sess):
    """torch keeps a CUDA device's random state at the forward and sets it for the recomputation (then puts
    the generator back): the same masks, so the gradients of the run without checkpointing, and the same
    numbers drawn after it."""
    for got, want in zip(_blocks_run(sess, True), _blocks_run(sess, False), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_reentrant_checkpoint_refuses_autograd_grad_as_torch(sess):
    for device in ("cpu", sess.device):
        model = _model(device)
        x = torch.randn(2, 4, dtype=torch.float64).to(device).requires_grad_()
        loss = checkpoint(model, x, use_reentrant=True).sum()
        with pytest.raises(RuntimeError, match=r"When use_reentrant=True, torch.utils.checkpoint is incompatible "
                                               r"with \.grad\(\)"):
            torch.autograd.grad(loss, x)[0].cpu()


def test_reentrant_checkpoint_of_a_function_reading_another_tensor_is_refused(sess):
    w = torch.randn(4, 4, dtype=torch.float64, device=sess.device, requires_grad=True)
    x = torch.randn(2, 4, dtype=torch.float64, device=sess.device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"use_reentrant=True\): the checkpointed function reads a remote tensor "
                                           "that is neither its argument") as info:
        checkpoint(lambda t: t @ w, x, use_reentrant=True)
    assert "test_user_functions.py:" in str(info.value)
    model = _model(sess.device)
    with torch.no_grad():  # nothing recorded: the forward runs, as torch's
        got = checkpoint(model, x, use_reentrant=True)
        torch.testing.assert_close(got.cpu(), _model("cpu")(x.detach().cpu()))

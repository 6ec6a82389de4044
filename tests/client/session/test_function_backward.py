"""A user's ``torch.autograd.Function`` applied to remote tensors where torch records it: its backward,
recorded as ``apply`` returns, runs inside the server's backward (``capture/_user_functions``,
``service/engine/user_functions``). Each case runs the same code on CPU tensors and on the device, in
float64, and compares values and gradients; the backwards that cannot run on the server are refused at
the user's line, naming the Function."""

from __future__ import annotations

import inspect
import re
import sys

import pytest
import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.autograd.gradcheck import GradcheckError

from .test_user_functions import AddInPlace, Mixed


def _line(offset: int = 0) -> str:
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


def _assert_same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None
        else:
            torch.testing.assert_close(g.cpu() if g.device.type != "cpu" else g, w)


class CustomAdd(torch.autograd.Function):
    """The example this project started from: ``x + alpha * y``, backward ``(g, alpha * g, None)``."""

    @staticmethod
    def forward(ctx, input1, input2, alpha=1):
        ctx.alpha = alpha
        return input1 + alpha * input2

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, ctx.alpha * grad_out, None


def _custom_add(device):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, 4, generator=g, dtype=torch.float64).to(device).requires_grad_() for _ in range(2))
    out = CustomAdd.apply(x.tanh(), y, 2.5)  # an input that is no leaf: its leaf gets the gradient
    loss = (out * out).sum()
    loss.backward()
    return loss.detach(), x.grad, y.grad


def test_the_seeds_custom_add_gives_local_torchs_gradients(any_sess):
    _assert_same(_custom_add(any_sess.device), _custom_add("cpu"))


@pytest.mark.backends("tenants")
def test_the_seeds_custom_add_in_a_tenant_process(sess):
    _assert_same(_custom_add(sess.device), _custom_add("cpu"))


class RoundSTE(torch.autograd.Function):
    """A straight-through quantiser: rounds in the forward, passes the gradient through unchanged."""

    @staticmethod
    def forward(ctx, x, scale):
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, g):
        return g, None


def _ste_training(device, compiled=lambda fn: fn):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(16, 4, generator=g, dtype=torch.float64), torch.randn(16, 1, generator=g, dtype=torch.float64)
    x, t = x.to(device), t.to(device)
    @compiled
    def loss_of(x, t):
        h = model[1](model[0](x))
        return ((model[2](RoundSTE.apply(h, 4.0)) - t) ** 2).mean()

    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = loss_of(x, t)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [*losses, *(p.detach() for p in model.parameters())]


def test_a_straight_through_estimator_trains_as_on_the_cpu(sess):
    _assert_same(_ste_training(sess.device), _ste_training("cpu"))


class Cube(torch.autograd.Function):
    """Saves its input: twice differentiable through the saved tensor."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 3 * x ** 2 * g


class Exp(torch.autograd.Function):
    """Saves its output (torch hands it back with this node as its history)."""

    @staticmethod
    def forward(ctx, x):
        out = x.exp()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return g * out


class WrongCube(Cube):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x ** 2 * g


def test_saved_tensors_pass_gradcheck_and_gradgradcheck(sess):
    x = torch.randn(5, dtype=torch.float64).to(sess.device).requires_grad_()
    for fn in (Cube, Exp):  # torch's own checks, on the device: numerical against the server's backward
        assert torch.autograd.gradcheck(fn.apply, (x,), fast_mode=True, check_undefined_grad=False), fn.__name__
        assert torch.autograd.gradgradcheck(fn.apply, (x,), fast_mode=True, check_undefined_grad=False), fn.__name__
    with pytest.raises(GradcheckError):  # the check sees a wrong backward
        torch.autograd.gradcheck(WrongCube.apply, (x,), fast_mode=True, check_undefined_grad=False)


class Everything(torch.autograd.Function):
    """``needs_input_grad``, a non-tensor and a tensor attribute on ctx, a non-differentiable output,
    an output left unused (its grad materialized as zeros), two outputs."""

    @staticmethod
    def forward(ctx, x, w, mode):
        ctx.mode, ctx.w = mode, w
        ctx.save_for_backward(x)
        idx = x.argmax(-1)
        ctx.mark_non_differentiable(idx)
        return x * w, x.sin(), idx

    @staticmethod
    def backward(ctx, g_mul, g_sin, _):
        (x,) = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = g_mul * ctx.w + g_sin * x.cos()
        if ctx.needs_input_grad[1] and ctx.mode == "both":
            gw = (g_mul * x).sum(0)
        return gx, gw, None


class Setup(torch.autograd.Function):
    """``setup_context`` style, returning an input itself (torch makes the output a view of it)."""

    @staticmethod
    def forward(x, k):
        return x, x * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, g_same, g_scaled):
        return g_same + g_scaled * ctx.k, None


def _ctx_cases(device):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64).to(device).requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64).to(device).requires_grad_()
    frozen = torch.randn(4, generator=g, dtype=torch.float64).to(device)
    results = []
    for mode, weight in (("both", w), ("x only", w), ("frozen", frozen)):
        mul, _unused_sin, idx = Everything.apply(x, weight, mode)
        assert not idx.requires_grad and idx.dtype == torch.int64
        wrt = (x, weight) if weight.requires_grad else (x,)
        results += [idx, *torch.autograd.grad(mul.pow(2).sum(), wrt, allow_unused=True)]
    same, scaled = Setup.apply(x, 3.0)
    assert same.requires_grad and not same.is_leaf
    results += torch.autograd.grad((same * scaled).sum(), x)
    return results


def test_ctx_attributes_needs_input_grad_and_non_differentiable_outputs(sess):
    _assert_same(_ctx_cases(sess.device), _ctx_cases("cpu"))


class Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()


def test_once_differentiable_gives_its_gradient_and_refuses_a_second_as_torch(sess):
    for device in ("cpu", sess.device):
        x = torch.linspace(-1, 1, 5, dtype=torch.float64).to(device).requires_grad_()
        v = torch.ones(5, dtype=torch.float64).to(device).requires_grad_()  # grads that require grad
        (gx,) = torch.autograd.grad(Once.apply(x), x, v, create_graph=True)
        torch.testing.assert_close(gx.detach().cpu(), torch.linspace(-1, 1, 5, dtype=torch.float64).cos())
        with pytest.raises(RuntimeError, match="trying to differentiate twice a function that was marked with "
                                               "@once_differentiable"):
            gx.sum().backward()
            gx.cpu()  # pipelined: the error reaches the user where a value is needed


def _dirty(device):
    w = torch.arange(3.0, dtype=torch.float64).to(device).requires_grad_()
    x = torch.ones(3, dtype=torch.float64).to(device)
    y = AddInPlace.apply(x, w)
    assert y is x and x.requires_grad and not x.is_leaf
    (y * y).sum().backward()
    return x.detach(), w.grad


def test_mark_dirty_rebases_the_inputs_history(sess):
    _assert_same(_dirty(sess.device), _dirty("cpu"))


def test_a_backward_that_reads_a_remote_tensor_it_was_not_given_is_refused(sess):
    scale = torch.full((3,), 2.0, device=sess.device)

    class Closure(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * scale

        @staticmethod
        def backward(ctx, g):
            return g * scale  # neither saved nor on ctx

    x = torch.ones(3, device=sess.device, requires_grad=True)
    queued = len(sess._queue)
    with pytest.raises(RuntimeError, match=r"Closure\.backward reads a remote tensor it was not given: save it "
                                           r"with ctx\.save_for_backward") as info:
        Closure.apply(x)
    assert "test_function_backward.py:" in str(info.value)
    assert [s.get("op") for s in sess._queue[queued:] if s["kind"] != "set_requires_grad"] == ["Tensor.mul"], \
        "the forward's op alone reached the queue"


def test_the_same_function_on_the_same_layouts_defines_its_template_once(sess):
    x = torch.randn(3, dtype=torch.float64, device=sess.device, requires_grad=True)
    before = len(sess._templates)
    for _ in range(3):
        Cube.apply(x).sum().backward()
    assert len(sess._templates) == before + 1
    Cube.apply(torch.randn(4, dtype=torch.float64, device=sess.device, requires_grad=True))
    assert len(sess._templates) == before + 2  # another layout: another template
    torch.testing.assert_close(x.grad.cpu(), 9 * x.detach().cpu() ** 2)


def _twice(device):
    x = torch.linspace(-1, 1, 4, dtype=torch.float64).to(device).requires_grad_()
    out = CustomAdd.apply(x, x, 2.0)  # one tensor as two inputs: its gradients add up
    (out * out).sum().backward()
    return out.detach(), x.grad


def test_one_tensor_passed_as_two_inputs(sess):
    _assert_same(_twice(sess.device), _twice("cpu"))


class UncheckedAssign(torch.autograd.Function):
    """torchdiffeq's ``_UncheckedAssign``: writes a solution step into a scratch tensor through ``.data`` (past
    the version counter) and returns the scratch itself, not marked dirty (torch makes the output a view)."""

    @staticmethod
    def forward(ctx, scratch, value, index):
        ctx.index = index
        scratch.data[index] = value
        return scratch

    @staticmethod
    def backward(ctx, grad_scratch):
        return grad_scratch, grad_scratch[ctx.index], None


def _solution(device):
    v = torch.linspace(0, 1, 3, dtype=torch.float64).to(device).requires_grad_()
    w = torch.ones(3, dtype=torch.float64).to(device).requires_grad_()
    solution = torch.zeros(4, 3, dtype=torch.float64, device=device)
    solution = UncheckedAssign.apply(solution, v * 2, 0)
    solution = UncheckedAssign.apply(solution, v * w, 1)
    loss = (solution ** 2).sum()
    loss.backward()
    return loss.detach(), v.grad, w.grad, solution.detach()


def test_torchdiffeqs_unchecked_assign(sess):
    _assert_same(_solution(sess.device), _solution("cpu"))


class RBF(torch.autograd.Function):
    """An RBF covariance with its own gradient (gpytorch's ``RBFCovariance`` in miniature)."""

    @staticmethod
    def forward(ctx, x1, x2, lengthscale):
        diff = x1[:, None, :] - x2[None, :, :]
        covar = torch.exp(-0.5 * (diff / lengthscale).pow(2).sum(-1))
        ctx.save_for_backward(x1, x2, lengthscale, covar)
        return covar

    @staticmethod
    def backward(ctx, g):
        x1, x2, lengthscale, covar = ctx.saved_tensors
        diff = x1[:, None, :] - x2[None, :, :]
        weighted = (g * covar)[..., None]
        g_ls = (weighted * diff.pow(2) / lengthscale.pow(3)).sum((0, 1))
        g_x = weighted * diff / lengthscale.pow(2)
        return -g_x.sum(1), g_x.sum(0), g_ls


class Solve(torch.autograd.Function):
    """``A^-1 b`` saving its solution (gpytorch's ``Solve`` in miniature)."""

    @staticmethod
    def forward(ctx, a, b):
        x = torch.linalg.solve(a, b)
        ctx.save_for_backward(a, x)
        return x

    @staticmethod
    def backward(ctx, g):
        a, x = ctx.saved_tensors
        g_b = torch.linalg.solve(a.mT, g)
        return -g_b @ x.mT, g_b


def _gp_fit(device):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 2, generator=g, dtype=torch.float64), torch.randn(8, 1, generator=g, dtype=torch.float64)
    x, y = x.to(device), y.to(device)
    log_ls = torch.zeros(2, dtype=torch.float64).to(device).requires_grad_()
    opt = torch.optim.Adam([log_ls], lr=0.1)
    eye = torch.eye(8, dtype=torch.float64, device=device)
    losses = []
    for _ in range(3):  # an exact GP's marginal likelihood, fitted
        opt.zero_grad()
        covar = RBF.apply(x, x, log_ls.exp()) + 0.1 * eye
        loss = 0.5 * (y * Solve.apply(covar, y)).sum() + 0.5 * torch.logdet(covar)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [*losses, log_ls.detach()]


def test_an_exact_gp_fits_through_its_own_functions_as_on_the_cpu(sess):
    _assert_same(_gp_fit(sess.device), _gp_fit("cpu"))


def _dirty_non_leaf(device):
    w = torch.linspace(-1, 1, 3, dtype=torch.float64).to(device).requires_grad_()
    y = AddInPlace.apply(w * 2, w)  # an input with a history, written in place and marked dirty
    (y * y).sum().backward()
    return y.detach(), w.grad


def test_mark_dirty_on_an_input_with_a_history(sess):
    """torch's C++ sees a remote non-leaf as a leaf (its history is on the server): its check of a dirty
    input must not refuse what torch allows."""
    _assert_same(_dirty_non_leaf(sess.device), _dirty_non_leaf("cpu"))


def test_a_refused_inner_function_leaves_the_outer_inputs_as_they_were(sess):
    """The inner call's refusal, raised as its apply returns, ends the watch of the outer one too: what the
    outer one changed for its forward is put back all the same."""
    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            with torch.enable_grad():  # the inner call is recorded: a local input that requires grad, refused
                return Mixed.apply(x, torch.ones(1, requires_grad=True))

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.ones(3, dtype=torch.float64, device=sess.device, requires_grad=True) * 2  # no leaf
    with pytest.raises(RuntimeError, match=r"Mixed\.apply .*torch would record the call"):
        Outer.apply(x)
    with torch._C.DisableTorchFunctionSubclass():
        assert torch.Tensor.requires_grad.__get__(x), "torch's own flag of the input as the SDK's"
    out = CustomAdd.apply(x, x, 1.0)
    assert out.requires_grad
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), torch.full((3,), 4.0, dtype=torch.float64))


class TwoOutputs(torch.autograd.Function):
    """torch's own example of ``set_materialize_grads(False)``: the backward adds the grads that came (torch
    passes None for an output no gradient reaches) and marks which came in its result."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        (x,) = ctx.saved_tensors
        grad = torch.zeros_like(x)
        if g1 is not None:
            grad = grad + 2 * g1
        if g2 is not None:
            grad = grad + 3 * g2 + 100  # a None read as zeros would add it silently
        return grad


class FirstOnly(torch.autograd.Function):
    """A backward that cannot take its second grad as None: torch raises at the backward that passes None."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        return g1 * 2 + (0 if g2 is None else g2 * 3)


def _unmaterialized(function, device, use):
    x = torch.arange(3.0, dtype=torch.float64).to(device).requires_grad_()
    a, b = function.apply(x)
    sum(o.sum() for o, used in zip((a, b), use) if used).backward()
    return (x.grad,)


@pytest.mark.parametrize("use", [(True, False), (False, True), (True, True)])
def test_set_materialize_grads_false_gives_none_where_torch_does(sess, use):
    _assert_same(_unmaterialized(TwoOutputs, sess.device, use), _unmaterialized(TwoOutputs, "cpu", use))


def test_a_pattern_of_none_grads_the_backward_cannot_take_raises_at_the_backward(sess):
    _assert_same(_unmaterialized(FirstOnly, sess.device, (True, False)), _unmaterialized(FirstOnly, "cpu", (True, False)))
    with pytest.raises(TypeError):
        _unmaterialized(FirstOnly, "cpu", (False, True))
    with pytest.raises(RuntimeError, match=r"set_materialize_grads\(False\), and no gradient reaches output\(s\) \[0\]"):
        _unmaterialized(FirstOnly, sess.device, (False, True))[0].cpu()  # (the backward answers at the sync)


class WrongShape(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g.sum(0, keepdim=True)


def test_a_gradient_of_the_wrong_shape_raises_torchs_error_naming_the_function(sess):
    words = "Function WrongShapeBackward returned an invalid gradient at index 0 - got [1, 3] but expected shape"
    for device in ("cpu", sess.device):
        x = torch.ones(2, 3).to(device).requires_grad_()
        with pytest.raises(RuntimeError, match=re.escape(words)):
            WrongShape.apply(x).sum().backward()
            x.grad.cpu()  # (remotely, the backward answers at the sync)

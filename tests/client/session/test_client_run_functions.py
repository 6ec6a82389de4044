"""A user's ``torch.autograd.Function`` whose backward reads values on the client: it runs there, staged
between the server's backwards (``dispatch/_client_run``, ``handlers/_staged``). Each case runs the same code
on CPU tensors and on the device, in float64, and compares gradients; the forms not supported raise at the
call, naming the Function."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.function import once_differentiable

from .test_function_backward import CustomAdd, _assert_same


class Branchy(torch.autograd.Function):
    """A backward that branches on a value of its incoming gradient (a recorded backward cannot)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if g.abs().max().item() > 1:  # a clipped gradient, only where it is large
            return g.clamp(-1, 1) * ctx.scale + x * 0, None
        return g * ctx.scale, None


class Twice(torch.autograd.Function):
    """Two outputs, one saved; its backward reads whether any gradient reaches the first."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y, x * 3

    @staticmethod
    def backward(ctx, g_exp, g_three):
        (y,) = ctx.saved_tensors
        if bool((g_exp == 0).all()):  # a value read: only the second output's gradient flows
            return g_three * 3
        return g_exp * y + g_three * 3


def _leaves(device, n=2):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(4, generator=g, dtype=torch.float64).to(device).requires_grad_() for _ in range(n)]


def _one(device, scale):
    w, _ = _leaves(device)
    loss = Branchy.apply(w * 2, scale).pow(2).sum()
    loss.backward()
    return [w.grad]


@pytest.mark.parametrize("scale", [0.1, 5.0], ids=["small", "clipped"])
def test_a_backward_that_branches_on_a_value_gives_torchs_gradients(sess, scale):
    _assert_same(_one(sess.device, scale), _one("cpu", scale))


def test_gradcheck_through_a_client_run_backward(sess):
    x = torch.randn(5, dtype=torch.float64).to(sess.device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: Twice.apply(t)[0] + 0, (x,), fast_mode=True, check_undefined_grad=False)


def _chained(device):
    w, v = _leaves(device)
    a, b = Twice.apply(w)
    c = Branchy.apply(a * v, 4.0)  # a later node fed by the first, and the first's other output around it
    loss = c.sum() + (b * v).sum()
    loss.backward()
    return [w.grad, v.grad]


def test_two_client_run_nodes_chained(sess):
    _assert_same(_chained(sess.device), _chained("cpu"))


def _mixed(device):
    w, v = _leaves(device)
    h = CustomAdd.apply(w, v, 2.0)  # recorded: runs inside the server's backward
    y = Branchy.apply(h.sin(), 3.0)
    loss = (y * w).sum() + w.pow(2).sum()  # w reached through the client-run node and around it
    loss.backward()
    grads = [w.grad.clone(), v.grad.clone()]
    loss2 = Branchy.apply(v, 0.5).sum()
    grads += torch.autograd.grad(loss2, [v, w], allow_unused=True)
    return grads


def test_mixed_with_a_recorded_function_and_a_leaf_reached_through_and_around(any_sess):
    _assert_same(_mixed(any_sess.device), _mixed("cpu"))


def _shared(device):
    w, v = _leaves(device)
    h = w.exp()  # saves its result: walked by the first stage (around the node) and by the node's own
    loss = Branchy.apply(h, 3.0).sum() + (h * v).sum()
    loss.backward()
    return [w.grad, v.grad]


def test_a_part_of_the_graph_walked_through_and_around_a_client_run_node(sess):
    _assert_same(_shared(sess.device), _shared("cpu"))


def _freed_around(device):
    w, v = _leaves(device)
    e = v.exp()
    loss = Branchy.apply(w, 2.0).sum() + e.sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        e.sum().backward()  # the part around the node was freed, as torch frees it
        v.grad.sum().item()  # (on the device, the error comes with the answer)
    return [w.grad, v.grad]


def test_a_backward_frees_the_graph_around_a_client_run_node_as_torch(sess):
    _assert_same(_freed_around(sess.device), _freed_around("cpu"))


def _with_inputs(device):
    w, v = _leaves(device)
    loss = Branchy.apply(w * v, 3.0).sum() + v.sum()
    loss.backward(inputs=[w])  # only w's .grad, through the node
    return [w.grad, v.grad]


def test_backward_with_inputs_through_a_client_run_node(sess):
    _assert_same(_with_inputs(sess.device), _with_inputs("cpu"))


def _retained(device):
    w, _ = _leaves(device)
    loss = Twice.apply(w)[0].sum()
    loss.backward(retain_graph=True)
    loss.backward()
    return [w.grad]


def test_retain_graph_lets_a_second_backward_run_and_a_freed_graph_raises_as_torch(sess):
    _assert_same(_retained(sess.device), _retained("cpu"))
    w, _ = _leaves(sess.device)
    loss = Twice.apply(w)[0].sum()
    loss.backward()
    with pytest.raises(RuntimeError, match=r"Trying to backward through the graph a second time.*through Twice"):
        loss.backward()


def test_create_graph_through_a_client_run_backward_raises_naming_the_function(sess):
    w, _ = _leaves(sess.device)
    loss = Branchy.apply(w, 2.0).sum()
    with pytest.raises(RuntimeError, match=r"create_graph=True through Branchy, whose backward runs on the client"):
        loss.backward(create_graph=True)


class Needs(torch.autograd.Function):
    """``needs_input_grad`` and ``once_differentiable``, a non-tensor argument, a backward that reads a value."""

    @staticmethod
    def forward(ctx, x, w, power):
        ctx.save_for_backward(x, w)
        ctx.power = power
        return x * w ** power

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        assert not torch.is_grad_enabled()
        gx = g * w ** ctx.power if ctx.needs_input_grad[0] else None
        gw = g * x * ctx.power * w ** (ctx.power - 1) if ctx.needs_input_grad[1] else None
        if float(g.sum()) < 0:  # a value read, where the sign of the sum makes no difference
            return gx, gw, None
        return gx, gw, None


def _needs(device):
    w, v = _leaves(device)
    frozen = v.detach()
    out = Needs.apply(frozen, w, 2) + Needs.apply(w, frozen, 3)
    out.sum().backward()
    return [w.grad]


def test_needs_input_grad_and_once_differentiable_as_torch(sess):
    _assert_same(_needs(sess.device), _needs("cpu"))


SEEN: list = []


def test_hooks_in_a_staged_backward_raise_naming_the_function(sess):
    w, v = _leaves(sess.device)
    loss = Branchy.apply(w, 2.0).sum() + v.sum()
    handle = v.register_hook(lambda g: g * 2)  # it would run once per stage, on part of its gradient
    with pytest.raises(RuntimeError, match=r"with hooks on the session's tensors or modules through Branchy"):
        loss.backward(retain_graph=True)
    handle.remove()
    loss.backward()
    assert w.grad is not None and v.grad is not None


class Unmaterialized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g2, g3):
        seen = [g is None for g in (g2, g3)]
        out = torch.zeros_like(g2 if g2 is not None else g3)
        if g2 is not None and g2.sum().item() != 0:
            out = out + g2 * 2
        if g3 is not None:
            out = out + g3 * 3
        SEEN.append(seen)
        return out


def _unmaterialized(device):
    w, _ = _leaves(device)
    a, _b = Unmaterialized.apply(w)
    SEEN.clear()
    a.sum().backward()
    return [w.grad, torch.tensor(SEEN)]


def test_set_materialize_grads_false_passes_none_where_torch_does(sess):
    _assert_same(_unmaterialized(sess.device), _unmaterialized("cpu"))


def _compiled_loss(device):
    w, _ = _leaves(device)
    loss_of = torch.compile(lambda y: (y * y).sum(), backend="remote") if device != "cpu" else (lambda y: (y * y).sum())
    for scale in (0.3, 3.0):
        loss_of(Branchy.apply(w * 1.5, scale)).backward()  # the compiled output depends on the node: staged
    return [w.grad]


def test_a_compiled_loss_of_a_client_run_output_backwards_through_it(sess):
    _assert_same(_compiled_loss(sess.device), _compiled_loss("cpu"))

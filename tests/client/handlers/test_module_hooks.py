"""Module full backward hooks on remote tensors (``register_full_backward_hook``, ``_pre_hook`` and the global
ones): they run after the server's backward on the gradients torch would give them, in torch's order
(``handlers/_node_hooks``, ``service/engine/tensor_hooks``). Each case runs the same code on CPU tensors and
on the device, in float64, and compares."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn
from torch.nn.modules import module as module_hooks


def _line(offset: int = 0) -> str:
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


class _Pair(nn.Module):
    """Two tensor inputs (one needing no grad) and a non-tensor one; two outputs, the second unused by the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, mask, scale):
        h = self.lin(x) * mask
        return h * scale, h.detach() + 1


def _calls(device):
    """Every hook kind on a small model, over steps whose input needs a grad or not, with an optimizer:
    the calls (which module, which kind, the gradients' values and Nones) in the order they came."""
    torch.manual_seed(0)
    pair, head = _Pair().double().to(device), nn.Linear(4, 1).double().to(device)
    opt = torch.optim.SGD([*pair.parameters(), *head.parameters()], lr=0.1)
    calls = []

    def note(kind, name):
        def hook(module, *grads):
            calls.append((kind, name, [[None if g is None else g.detach().cpu() for g in gs] for gs in grads]))
        return hook

    pair.register_full_backward_hook(note("hook", "pair"))
    pair.register_full_backward_pre_hook(note("pre", "pair"))
    head.register_full_backward_hook(note("hook", "head"))
    handle = module_hooks.register_module_full_backward_pre_hook(
        lambda m, go: calls.append(("global pre", type(m).__name__, go[0].norm().item())))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64).to(device)
    mask = (torch.rand(6, 4, generator=g) > 0.3).double().to(device)
    try:
        for step in range(3):
            opt.zero_grad()
            xs = x.clone().requires_grad_(step != 1)  # step 1: only the parameters need a grad
            out, aside = pair(xs, mask, 2.0)
            loss = head(out.tanh()).pow(2).mean()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (torch warns when no input needs a grad)
                loss.backward()
            opt.step()
            calls.append(("loss", loss.item()))
    finally:
        handle.remove()
    return calls, [p.detach().cpu() for p in (*pair.parameters(), *head.parameters())]


def _same(got, want) -> None:
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), (got, want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12)
    else:
        assert got == want


def test_module_backward_hooks_see_torchs_gradients_in_torchs_order(sess):
    got, want = _calls(sess.device), _calls("cpu")
    assert len(want[0]) == 21 and [c[0] for c in want[0][:6]] == ["global pre", "hook", "global pre", "pre", "global pre", "hook"]
    _same(got, want)


def _store_per_module(device):
    """An observing hook that keeps the gradients on the module (as Opacus keeps its per-sample gradients),
    used after the backward to change the parameters."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).double().to(device)

    def keep(module, grad_input, grad_output):
        module.kept = grad_output[0].detach()

    for layer in (model[0], model[2]):
        layer.register_full_backward_hook(keep)
    x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    for _ in range(2):
        model(x).pow(2).sum().backward()
        with torch.no_grad():
            for layer in (model[0], model[2]):
                layer.bias -= 0.1 * layer.kept.sum(0)
    return [model[0].kept, model[2].kept, *(p.detach() for p in model.parameters())]


def test_a_hook_that_stores_its_gradients_on_the_module_trains_as_on_the_cpu(sess):
    for got, want in zip(_store_per_module(sess.device), _store_per_module("cpu"), strict=True):
        torch.testing.assert_close(got.cpu(), want)


def _replacing(device):
    """Hooks that return new gradients (run inside the server's backward): a pre-hook that clamps the
    gradients a module is given, a full hook that scales the gradient of its input by a factor that changes
    between steps, a global hook that passes on None (no gradient); and a lambda that keeps the gradients it
    is given (they are the gradients after the step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    factor = {"k": 0.5}
    kept = []
    model[2].register_full_backward_pre_hook(lambda m, go: (go[0].clamp(-0.2, 0.2),))
    model[2].register_full_backward_hook(lambda m, gi, go: (gi[0] * factor["k"],))
    model[0].register_full_backward_hook(lambda m, gi, go: kept.append(go))
    x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2)).to(device)
    found = []
    for _ in range(3):
        opt.zero_grad()
        loss = model(x.clone().requires_grad_()).pow(2).sum()
        loss.backward()
        opt.step()
        factor["k"] *= 3
        found += [loss.detach(), *(p.grad.clone() for p in model.parameters())]
    return [*found, *(go[0] for go in kept), *(p.detach() for p in model.parameters())]


def test_module_hooks_that_return_new_gradients_change_them_as_torchs_do(sess):
    for got, want in zip(_replacing(sess.device), _replacing("cpu"), strict=True):
        torch.testing.assert_close(got.cpu(), want)


def _input_grads_with_none(device):
    torch.manual_seed(0)
    model = nn.Linear(3, 3).double().to(device)
    handle = module_hooks.register_module_full_backward_hook(lambda m, gi, go: (None,))
    try:
        x = torch.ones(2, 3, dtype=torch.float64, device=device, requires_grad=True)
        w = torch.ones(2, 3, dtype=torch.float64, device=device, requires_grad=True)
        (model(x) * w).sum().backward()
    finally:
        handle.remove()
    return x.grad, w.grad, model.weight.grad


def test_a_global_hook_that_passes_no_gradient_on_leaves_it_none(sess):
    got, want = _input_grads_with_none(sess.device), _input_grads_with_none("cpu")
    assert got[0] is None and want[0] is None
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g.cpu(), w)


def test_a_module_hook_that_reads_values_and_returns_new_gradients_raises_at_the_backward(sess):
    model = nn.Linear(3, 3).double().to(sess.device)
    model.register_full_backward_hook(lambda m, gi, go: (gi[0] / gi[0].norm().item(),))
    loss = model(torch.ones(2, 3, dtype=torch.float64, device=sess.device, requires_grad=True)).sum()
    line = _line(2)
    with pytest.raises(RuntimeError, match="returned new gradients") as info:
        loss.backward()
    assert line in str(info.value)


def test_the_hooks_of_a_graph_no_longer_held_are_forgotten(sess):
    model = nn.Linear(3, 3).to(sess.device)
    model.register_full_backward_hook(lambda m, gi, go: None)
    x = torch.ones(2, 3, device=sess.device, requires_grad=True)
    for _ in range(4):
        model(x).sum().backward()
    assert 0 < len(sess._node_hooks) <= 4  # this call's two nodes, at most the last call's two besides


def test_a_module_hook_under_no_grad_is_not_set_up(sess):
    calls = []
    model = nn.Linear(3, 3).to(sess.device)
    model.register_full_backward_hook(lambda *args: calls.append(args))
    with torch.no_grad():  # torch sets no backward hook up without grad: the forward runs, as torch's
        model(torch.randn(2, 3, device=sess.device, requires_grad=True))
    assert calls == [] and not sess._node_hooks


def _compiled(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double().to(device)
    seen = []

    def keep(module, grad_input, grad_output):
        seen.append(grad_output[0].detach())

    model[0].register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.5,))
    model[2].register_full_backward_hook(keep)
    x = torch.ones(2, 3, dtype=torch.float64).to(device).requires_grad_()
    step = torch.compile(lambda x: model(x).pow(2).sum(), backend="remote" if device != "cpu" else "eager")
    step(x).backward()
    return [x.grad, model[0].weight.grad, *seen]


def test_a_compiled_forward_meets_the_module_hooks_as_eager_code_does(sess, fresh_dynamo):
    for got, want in zip(_compiled(sess.device), _compiled("cpu"), strict=True):
        torch.testing.assert_close(got.cpu(), want)

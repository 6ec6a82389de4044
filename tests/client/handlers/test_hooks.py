"""``Tensor.register_hook`` on remote tensors: each ``backward()``/``torch.autograd.grad`` records the hooks
anew and the server runs them inside its backward (``handlers/_hooks``, ``service/engine/tensor_hooks``).
Each case runs the same code on CPU tensors and on the device, in float64, and compares."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn


def _line(offset: int = 0) -> str:
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


def _training(device):
    """A clipping hook on a parameter whose bound changes between steps (a hook read anew at each backward),
    a scaling hook on an activation, then the first hook removed."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, t = (torch.randn(8, 4, generator=g, dtype=torch.float64).to(device),
            torch.randn(8, 1, generator=g, dtype=torch.float64).to(device))
    bound = {"clip": 0.05}
    handle = model[0].weight.register_hook(lambda grad: grad.clamp(-bound["clip"], bound["clip"]))
    seen = []
    found = []
    for step in range(4):
        if step == 3:
            handle.remove()
        opt.zero_grad()
        h = model[1](model[0](x))
        h.register_hook(lambda grad: grad * 0.5)
        loss = ((model[2](h) - t) ** 2).mean()
        loss.backward()
        opt.step()
        bound["clip"] *= 2
        seen.append(loss.detach())
        found += [p.grad.clone() for p in model.parameters()]
    return [*seen, *found, *(p.detach() for p in model.parameters())]


def test_hooks_train_as_on_the_cpu(sess):
    for got, want in zip(_training(sess.device), _training("cpu"), strict=True):
        torch.testing.assert_close(got.cpu(), want)


def _grads_with_hooks(device):
    w = torch.linspace(-1, 1, 5, dtype=torch.float64).to(device).requires_grad_()
    y = w.exp()
    y.register_hook(lambda grad: grad + 1)  # a hook on a non-leaf: the gradient flowing on
    w.register_hook(lambda grad: None)  # returns nothing: the gradient as it was
    w.register_hook(lambda grad: grad * 3)  # hooks of one tensor run in order
    return torch.autograd.grad((y * y).sum(), w)


def test_hooks_run_in_autograd_grad_in_order(sess):
    torch.testing.assert_close(_grads_with_hooks(sess.device)[0].cpu(), _grads_with_hooks("cpu")[0])


def _observed(device, grad_call: bool = False):
    """Hooks that read the gradient's values (a norm logged, a NaN check returning the gradient as pyro's
    does, a print's reading) beside one that changes a gradient, over two backward calls; a tensor the
    second backward does not reach is not observed there."""
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64).to(device).requires_grad_()
    v = torch.randn(3, dtype=torch.float64).to(device).requires_grad_()
    seen = []
    w.register_hook(lambda grad: seen.append(("w norm", grad.norm().item())))
    v.register_hook(lambda grad: seen.append(("v", grad.tolist())))
    h = w * 2
    h.register_hook(lambda grad: grad * 3)  # changes the gradient: recorded, runs inside the server's backward
    z = h * w + v
    z.register_hook(lambda grad: seen.append(("z nan", bool(torch.isnan(grad).any()))) or grad)
    if grad_call:
        grads = torch.autograd.grad(z.sum(), [w, v])
    else:
        z.sum().backward()
        grads = (w.grad.clone(),)
    (w * w).sum().backward()  # v and z not reached
    return seen, [g.cpu() for g in (*grads, w.grad)]


@pytest.mark.parametrize("grad_call", [False, True], ids=["backward", "autograd.grad"])
def test_hooks_that_read_values_run_on_the_gradients_kept_for_them_in_torchs_order(sess, grad_call):
    (seen, grads), (want_seen, want_grads) = _observed(sess.device, grad_call), _observed("cpu", grad_call)
    assert seen == want_seen and len(seen) == 4
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_a_hook_that_reads_values_and_changes_the_gradient_is_refused_at_the_backward(sess):
    w = torch.ones(3, dtype=torch.float64, device=sess.device, requires_grad=True)
    w.register_hook(lambda grad: grad / grad.norm().item())  # needs a value here, and returns a new gradient
    loss = (w * 2).sum()
    line = _line(2)
    with pytest.raises(RuntimeError, match=r"reads the gradient's values and returns a new gradient") as info:
        loss.backward()
    assert line in str(info.value)


def test_a_hook_that_reads_another_remote_tensor_is_refused(sess):
    w = torch.ones(3, dtype=torch.float64, device=sess.device, requires_grad=True)
    mask = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64, device=sess.device)
    w.register_hook(lambda grad: grad * mask)
    with pytest.raises(RuntimeError, match="reads a remote tensor it is not given"):
        (w * 2).sum().backward()


def test_a_hook_on_a_tensor_that_needs_no_grad_is_refused_as_torch(sess):
    for device in ("cpu", sess.device):
        with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
            torch.ones(2, device=device).register_hook(lambda grad: grad)


def _compiled_step(device):
    torch.manual_seed(0)
    model = nn.Linear(4, 2).double().to(device)
    model.weight.register_hook(lambda grad: grad.clamp(-0.01, 0.01))
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)

    def step():
        loss = model(x).pow(2).sum()
        loss.backward()
        return loss.detach()

    compiled = torch.compile(step, backend="remote" if device != "cpu" else "eager")
    return [compiled(), model.weight.grad.clone(), model.bias.grad.clone()]


def test_a_compiled_step_meets_the_hooks_as_eager_code_does(sess):
    """The hooks run on the server as without torch.compile (recorded in eager mode: dynamo stays out of the
    recording); a graph whose backward would skip them is no template."""
    import torch._dynamo

    want = _compiled_step("cpu")
    for in_the_graph in (False, True):  # the backward a graph break, or in the graph (trace_autograd_ops)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(trace_autograd_ops=in_the_graph):
            got = _compiled_step(sess.device)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g.cpu(), w)


def _optimizer_in_backward(device):
    """torch's "optimizer step in backward" idiom: one optimizer per parameter, looked up by the parameter
    its post-accumulate hook is given, which clamps its ``.grad``, steps and frees it; the order torch calls
    the hooks in, and the ``.grad`` each sees, noted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)).double().to(device)
    optimizers = {p: torch.optim.SGD([p], lr=0.1, momentum=0.9) for p in model.parameters()}
    names = {p: name for name, p in model.named_parameters()}
    seen = []

    def step(p):
        seen.append((names[p], p.grad.clone()))
        p.grad.clamp_(-0.05, 0.05)
        optimizers[p].step()
        optimizers[p].zero_grad()  # (set_to_none: the .grad freed inside backward)

    handles = [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)
    losses = []
    for k in range(3):
        if k == 2:
            handles[0].remove()  # 0.weight: accumulated as before, no longer stepped
        loss = model(x).pow(2).mean()
        loss.backward()
        losses.append(loss.detach())
    return seen, [*losses, *(p.detach() for p in model.parameters()), model[0].weight.grad]


def test_post_accumulate_grad_hooks_step_each_parameter_in_backward_as_on_the_cpu(sess):
    (seen, got), (want_seen, want) = _optimizer_in_backward(sess.device), _optimizer_in_backward("cpu")
    assert [name for name, _ in seen] == [name for name, _ in want_seen] and len(seen) == 11
    for (_, g), (_, w) in zip(seen, want_seen):
        torch.testing.assert_close(g.cpu(), w)
    assert got[-1] is not None  # the unhooked weight's .grad, kept as torch keeps it
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w)


def test_post_accumulate_grad_hooks_run_only_where_torch_accumulates(sess):
    """Not in autograd.grad, not for a leaf a backward's ``inputs`` leave out; on a non-leaf: torch's error."""
    for device in ("cpu", sess.device):
        calls = []
        w = torch.ones(3, dtype=torch.float64, device=device, requires_grad=True)
        v = torch.ones(3, dtype=torch.float64, device=device, requires_grad=True)
        for t in (w, v):
            t.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.sum().item()))
        torch.autograd.grad((w * v * 2).sum(), [w, v])
        (w * v * 3).sum().backward(inputs=[v])
        assert calls == [9.0], device
        with pytest.raises(RuntimeError, match="post accumulate grad hooks cannot be registered on non-leaf"):
            (w * 2).register_post_accumulate_grad_hook(lambda p: None)
        w.register_post_accumulate_grad_hook(lambda p: p)  # the parameter itself passes torch's check
        w.sum().backward()
        w.register_post_accumulate_grad_hook(lambda p: p * 2)
        with pytest.raises(RuntimeError, match="should return None"):
            w.sum().backward()


def _kept_by_hooks(device):
    """Hooks that keep the gradient they are given (a list's append, the idiom for inspecting gradients),
    one of them also changing it."""
    w = torch.linspace(-1, 1, 4, dtype=torch.float64).to(device).requires_grad_()
    kept = []
    y = w * 3
    y.register_hook(lambda grad: kept.append(grad))
    w.register_hook(lambda grad: kept.append(grad) or grad * 2)
    (y * y).sum().backward()
    return [*kept, w.grad]


def test_a_gradient_a_hook_keeps_is_the_gradient_after_the_backward(sess):
    for got, want in zip(_kept_by_hooks(sess.device), _kept_by_hooks("cpu"), strict=True):
        torch.testing.assert_close(got.cpu(), want)


def test_a_post_accumulate_hook_that_reads_a_grad_torch_fills_later_is_refused(sess):
    """torch calls the bias's hook before the weight's gradient is accumulated (the hook would see the
    weight's old .grad); the SDK runs the hooks after the backward, so that read raises. Its own .grad,
    and that of a leaf accumulated before it, are read as torch's."""
    model = nn.Linear(3, 1).double().to(sess.device)
    order = []
    model.weight.register_post_accumulate_grad_hook(lambda p: order.append(("w", model.bias.grad.sum().item())))
    model.bias.register_post_accumulate_grad_hook(lambda p: order.append(("b", p.grad.sum().item())))
    x = torch.ones(2, 3, dtype=torch.float64, device=sess.device)
    model(x).sum().backward()
    assert order == [("b", 2.0), ("w", 2.0)]  # as on the CPU: the bias first
    line = _line(1)  # the hook's own line names the read
    model.bias.register_post_accumulate_grad_hook(lambda p: model.weight.grad)
    with pytest.raises(RuntimeError, match="accumulates after the hooked one") as info:
        model(x).sum().backward()
    assert line in str(info.value)


def _hooked_activation(device, variant: str):
    """A hook on an activation used as people write it: the name rebound after, ``retain_grad`` around it,
    a gradient changed in place."""
    x = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(2, 3).to(device).requires_grad_()
    h = x.sin() * 2
    if variant == "retain_first":
        h.retain_grad()
    h.register_hook((lambda g: g.mul_(3)) if variant == "in_place" else (lambda g: g * 3))
    if variant == "retain_after":
        h.retain_grad()
    kept = h
    if variant == "rebound":
        h = h * h  # the hooked tensor is no longer named: torch keeps its hook with the graph
        kept = None
    (h * h).sum().backward()
    return [x.grad] + ([kept.grad] if variant.startswith("retain") else [])


@pytest.mark.parametrize("variant", ["rebound", "retain_first", "retain_after", "in_place"])
def test_a_hooked_activation_gives_torchs_gradients(sess, variant):
    # each failed before: the hook dropped with its name, retain_grad keeping the gradient before the hook
    # (torch's runs last), a hook that changes its gradient in place and returns it taken as no change
    for got, want in zip(_hooked_activation(sess.device, variant), _hooked_activation("cpu", variant), strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_a_hooked_tensor_no_longer_named_is_let_go_once_a_backward_ran_its_hooks(sess):
    x = torch.ones(3, dtype=torch.float64, device=sess.device, requires_grad=True)
    h = x * 2
    h.register_hook(lambda g: g * 3)
    h = h.sum()
    h.backward(retain_graph=True)  # the graph kept: a second backward runs the hook again
    assert len(sess._hook_kept) == 1
    h.backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 12.0, dtype=torch.float64))
    assert not sess._hook_kept
    for case in ("leaves the gradient alone", "removed"):
        h = x * 2
        handle = h.register_hook((lambda g: None) if case.startswith("leaves") else (lambda g: g * 3))
        del h
        assert len(sess._hook_kept) == 1
        if case == "removed":
            handle.remove()
        (x * 1).sum().backward()  # a backward that does not reach it
        assert not sess._hook_kept, case  # nothing runs its hooks there: nothing to keep it for


def test_a_template_whose_program_failed_is_sent_again(sess):
    x = torch.ones(3, dtype=torch.float64, device=sess.device, requires_grad=True)
    for attempt in range(2):
        h = x * 2
        h.register_hook(lambda g: g * 5)  # the same template both times
        if attempt == 0:
            bad = x[torch.tensor([7])]  # fails on the server, in the program that defines the template
            with pytest.raises(RuntimeError, match="index 7 is out of bounds"):
                h.sum().backward()
                x.grad.cpu()
            del bad
        else:
            h.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 10.0, dtype=torch.float64))



def test_batched_grads_are_refused_naming_the_argument(sess):
    """``is_grads_batched=True`` runs the backward under vmap (``jacobian(..., vectorize=True)`` too): refused at
    the call (it was sent unbatched, and the server refused the grads' shape at the next sync)."""
    x = torch.linspace(-1, 1, 4, device=sess.device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"is_grads_batched=True\) on remote tensors"):
        torch.autograd.grad(x.sin(), x, torch.eye(4, device=sess.device), is_grads_batched=True)
    with pytest.raises(RuntimeError, match="is_grads_batched"):
        torch.autograd.functional.jacobian(torch.sin, x.detach(), vectorize=True)

"""Cases that used to diverge from torch without a word: each is now exact, or a loud error that
names the line of the user's code that caused it."""

from __future__ import annotations

import inspect

import re

import pytest
import torch
from torch import nn

from remote_autograd import client
from remote_autograd.client.session._unsupported import user_name


def _here(offset: int = 0) -> str:
    """``file:line`` of the caller's line (plus ``offset``), as errors name it."""
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


def test_a_module_left_on_the_client_raises_torchs_device_error(sess):
    w = torch.randn(3, 3, device=sess.device, requires_grad=True)
    local = nn.Linear(3, 3)  # minGPT's case: a module left behind on the client
    for grad_mode in (torch.enable_grad, torch.no_grad):  # never a silent upload of its weights
        with grad_mode(), pytest.raises(RuntimeError, match=f"same device, but found at least two devices, "
                                                           f"{sess.device} and cpu!"):
            local(w)


def test_a_0d_local_tensor_that_requires_grad_used_with_remote_ones_is_refused(sess):
    w = torch.randn(3, device=sess.device, requires_grad=True)
    scale = torch.tensor(2.0, requires_grad=True)  # allowed beside remote tensors as a constant: never its grad
    line = _here(2)
    with pytest.raises(RuntimeError, match="local tensor that requires grad") as info:
        w * scale
    assert line in str(info.value) and ".to(device)" in str(info.value)
    with torch.no_grad():  # without a graph it is only a constant: torch's result
        torch.testing.assert_close((w * scale).cpu(), w.cpu() * scale)


def test_uploading_a_tensor_that_requires_grad_is_refused_and_a_leaf_can_be_made_there(sess):
    x = torch.randn(2, requires_grad=True)
    line = _here(2)
    with pytest.raises(RuntimeError, match="not differentiable") as info:
        x.to(sess.device)
    assert line in str(info.value)
    y = x.detach().to(sess.device).requires_grad_()
    (y * 2).sum().backward()
    assert torch.equal(y.grad.cpu(), torch.full((2,), 2.0))


def test_a_download_requires_grad_like_torch_and_a_backward_through_it_is_refused(sess):
    w = torch.randn(3, device=sess.device, requires_grad=True)
    line = _here(1)
    y = w.cpu()
    assert y.requires_grad and not y.is_leaf
    with pytest.raises(RuntimeError, match="moves are not differentiable") as info:
        (y * torch.ones(3, requires_grad=True)).sum().backward()
    assert line in str(info.value)
    assert w.grad is None
    assert not w.detach().cpu().requires_grad


def test_model_to_device_after_sess_module_stays_on_the_server(sess):
    torch.manual_seed(0)
    model = sess.module(nn.Linear(4, 2))
    model.to(sess.device)  # minGPT's Trainer does this
    assert all(p.device == sess.device for p in model.parameters())
    before = sess.requests
    model(torch.randn(3, 4, device=sess.device)).sum().item()
    assert sess.requests > before, "the model ran on the server"


def test_moving_to_another_device_or_session_is_refused(sess, server_url):
    t = torch.ones(2, device=sess.device)
    model = nn.Linear(2, 2).to(sess.device)
    for target in ("cuda", "cuda:0", "mps"):
        with pytest.raises(RuntimeError, match="moves only to the client"):
            t.to(target)
        with pytest.raises(RuntimeError):
            model.to(target)
    assert model.weight.device == sess.device, "a refused move leaves the model where it was"
    with client.connect(server_url) as other:
        with pytest.raises(RuntimeError, match="do not move between sessions"):
            t.to(other.device)
        with pytest.raises(RuntimeError, match=f"found at least two devices, {sess.device} and {other.device}!"):
            t + torch.ones(2, device=other.device)


def test_data_is_a_detached_alias_sharing_the_server_storage(sess):
    p = nn.Parameter(torch.arange(4.0, device=sess.device))
    d = p.data
    assert not d.requires_grad and d.device == sess.device
    d.add_(10)
    assert torch.equal(p.detach().cpu(), torch.arange(4.0) + 10)
    p.data.mul_(2)
    assert torch.equal(p.detach().cpu(), (torch.arange(4.0) + 10) * 2)
    p.data = torch.zeros(2, 3, dtype=torch.float64, device=sess.device)  # shape and dtype may change, as in torch
    assert p.shape == (2, 3) and p.dtype == torch.float64 and p.requires_grad and isinstance(p, nn.Parameter)
    assert torch.equal(p.detach().cpu(), torch.zeros(2, 3, dtype=torch.float64))
    (p * 3).sum().backward()
    assert torch.equal(p.grad.cpu(), torch.full((2, 3), 3.0, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="same device"):
        p.data = torch.zeros(2, 3, dtype=torch.float64)


def test_a_module_backward_hook_of_the_old_kind_is_refused(sess):
    model = nn.Linear(3, 3).to(sess.device)
    model.register_backward_hook(lambda *args: None)
    with pytest.raises(AttributeError, match="register_backward_hook puts one on its output's grad_fn"):
        model(torch.randn(2, 3, device=sess.device))


def test_a_parameter_hook_set_before_the_move_is_refused_not_dropped(sess):
    """A clipping hook on a local parameter used to be dropped by model.to(device) without a word."""
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    handle = model[2].weight.register_hook(lambda g: g.clamp(-0.1, 0.1))
    line = _here(2)
    with pytest.raises(RuntimeError, match=r"parameter '2\.weight' has a hook \(Tensor\.register_hook\)") as info:
        model.to(sess.device)
    assert line in str(info.value) and "clip_grad_norm_" in str(info.value)
    assert all(p.device.type == "cpu" for p in model.parameters()), "a refused move moves nothing"
    handle.remove()
    model.to(sess.device)
    assert all(p.device == sess.device for p in model.parameters())
    head = nn.Linear(2, 2)
    head.bias.register_post_accumulate_grad_hook(lambda p: None)  # optimizer-in-backward's hook
    with pytest.raises(RuntimeError, match=r"'bias' has a hook \(Tensor\.register_post_accumulate_grad_hook\)"):
        sess.module(head)


def test_forward_hooks_that_read_values_run(sess):
    seen = []
    model = nn.Linear(3, 2).to(sess.device)
    model.register_forward_hook(lambda m, i, o: seen.append(o.detach().cpu()))
    out = model(torch.ones(1, 3, device=sess.device))
    assert len(seen) == 1 and torch.equal(seen[0], out.detach().cpu())


@pytest.mark.parametrize("called, transform", [
    ("torch.func.grad", lambda w, x: torch.func.grad(lambda v: (x @ v).sum())(w)),
    ("torch.func.vmap", lambda w, x: torch.vmap(lambda r: r * w)(x)),
    ("torch.func.grad", lambda w, x: torch.func.jacrev(lambda v: x @ v)(w)),
    ("jacfwd", lambda w, x: torch.func.jacfwd(lambda v: x @ v)(w)),
    ("torch.func transforms", lambda w, x: torch.vmap(torch.func.grad(lambda v, r: r @ v), in_dims=(None, 0))(w, x)),
])
def test_function_transforms_are_refused_naming_the_transform(sess, called, transform):
    # the remote tensor inside a transform's wrappers said "found at least two devices, remote:0 and remote:0"
    w, x = torch.randn(3, device=sess.device), torch.randn(2, 3, device=sess.device)
    with pytest.raises(RuntimeError, match=f"{re.escape(called)}.* remote tensors.*loss.backward"):
        transform(w, x)
    assert torch.equal(x.cpu() @ w.cpu(), (x @ w).cpu())  # and the session goes on


def test_functional_call_is_no_transform_and_runs(sess):
    model, local = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
    local.load_state_dict(model.state_dict())
    model.to(sess.device)
    x = torch.randn(4, 3, dtype=torch.float64)
    params = dict(model.named_parameters())
    torch.func.functional_call(model, params, (x.to(sess.device),)).pow(2).sum().backward()
    torch.func.functional_call(local, dict(local.named_parameters()), (x,)).pow(2).sum().backward()
    torch.testing.assert_close(model.weight.grad.cpu(), local.weight.grad)


def test_errors_name_what_the_user_wrote():
    assert user_name(torch._VF.lstm) == "nn.LSTM"
    assert user_name(torch.Tensor.data.__get__) == "Tensor.data"
    assert user_name(torch.Tensor.is_xpu.__get__) == "Tensor.is_xpu"
    assert user_name(torch.Tensor.register_hook) == "Tensor.register_hook"


def test_the_custom_op_hint_only_where_a_custom_op_is_the_answer(sess):
    w = torch.randn(3, device=sess.device)
    with pytest.raises(RuntimeError) as info:
        w.pin_memory()
    assert "custom op" not in str(info.value)
    assert w.is_xpu is False and w.is_cuda is False  # DCGAN's check: answered, not an error
    with pytest.raises(NotImplementedError, match="custom ops are registered on the server"):
        torch.randn(3, 3, device=sess.device).geqrf()  # a torch function the table lacks: a custom op is an answer


def test_a_like_factory_asked_for_another_device_is_refused(sess):
    x = torch.ones(2, device=sess.device)
    assert torch.zeros_like(x, device=sess.device).device == sess.device
    with pytest.raises(RuntimeError, match="device=cpu"):
        torch.zeros_like(x, device="cpu")


def test_torch_compile_with_its_default_backend_is_refused_naming_the_remote_backend(sess):
    """inductor compiles kernels for this machine: refused at the first call, the message saying what to do."""
    w = torch.ones(3, device=sess.device)
    with pytest.raises(Exception, match='backend="remote"') as refused:  # dynamo's BackendCompilerFailed
        torch.compile(lambda x: x * 2 + 1)(w)
    assert "inductor" in str(refused.value)


def test_saved_tensors_hooks_around_a_remote_graph_are_refused(sess):
    """The server saves what its backward needs: hooks that would change those tensors are refused, not skipped."""
    w = torch.randn(3, device=sess.device, requires_grad=True)
    line = _here(3)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 0, lambda t: t):
        with pytest.raises(RuntimeError, match="saved_tensors_hooks") as info:
            w * w
        with torch.no_grad():  # nothing saved, nothing to refuse
            w * w
    assert line in str(info.value)
    with torch.autograd.graph.save_on_cpu():  # moves saved tensors, changes no value: torch's gradient
        (w * w).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * w.detach().cpu())

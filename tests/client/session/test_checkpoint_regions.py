"""``torch.utils.checkpoint(..., use_reentrant=False)`` on remote tensors: the server drops what the checkpointed
function's ops save and recomputes it at the backward (``service/engine/checkpoint_regions.py``), so the session
holds less after the forward, and the gradients are local torch's bit for bit (the same steps run again).

Each form runs the same code on CPU tensors and on the device: nested checkpoints, ``checkpoint_sequential``, a
function that reads a value (its region spans two programs), BatchNorm (torch's recomputation updates the running
statistics again), ``autograd.grad`` then a second backward through a retained graph; dropout redraws the forward's
numbers; a user Function and a compiled graph inside the function are applied again; torch's own error for an input
changed in place; what is refused, loudly."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from remote_autograd.client import RemoteError

from .test_user_functions import _blocks_run


def _x(device, *shape):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(device)


def _plain(function, *args, use_reentrant):
    """``checkpoint``'s stand-in for the same forms run without checkpointing."""
    return function(*args)


def _mlp(device, width=8):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 4)).double().to(device)


# Each form: (model, its input, its output) on ``device``, checkpointed with ``ck`` (``checkpoint`` or ``_plain``);
# 32 rows of 64 features, so that what a checkpoint drops outweighs the generator state each region keeps.


def _module(device, ck):
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()
    return model, x, ck(model, x, use_reentrant=False)


def _nested(device, ck):
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()

    def outer(h):
        h = model[0](h).sin()
        return ck(lambda t: model[2](model[1](t)), h, use_reentrant=False).cos() + h[:, :4]

    return model, x, ck(outer, x, use_reentrant=False)


def _nested_first(device, ck):
    """The outer function's first op is the inner checkpoint's."""
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()
    return model, x, ck(lambda h: ck(model, h, use_reentrant=False) * h, x, use_reentrant=False)


def _sequential(device, ck):
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4)), nn.Tanh()).double().to(device)
    x = _x(device, 32, 64).requires_grad_()
    return model, x, checkpoint_sequential(model, 2, x, use_reentrant=False) if ck is checkpoint else model(x)


def _reads_a_value(device, ck):
    """``.item()`` inside the function sends the queue: its region spans two programs."""
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()

    def f(h):
        h = model[0](h)
        return model[2](model[1](h) * (2.0 if h.sum().item() > 0 else -2.0))

    return model, x, ck(f, x, use_reentrant=False)


def _batch_norm(device, ck):
    """torch's recomputation updates the running statistics again: so does the server's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.BatchNorm1d(64), nn.Tanh()).double().to(device)
    x = _x(device, 32, 4).requires_grad_()
    return model, x, ck(model, x, use_reentrant=False)


class _Rounded(torch.autograd.Function):
    """A straight-through estimator: a user Function inside the checkpointed function is applied again."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _user_function(device, ck):
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()
    return model, x, ck(lambda h: _Rounded.apply(model(h) * 3).sin() * h, x, use_reentrant=False)


def _compiled(device, ck):
    """A graph compiled with the remote backend, called inside the checkpointed function (its run recomputed)."""
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()
    part = torch.compile(lambda t: t.sin() * 2, backend="remote") if device != "cpu" else (lambda t: t.sin() * 2)
    return model, x, ck(lambda h: part(model(h)).cos(), x, use_reentrant=False)


@pytest.mark.parametrize("form", [_module, _nested, _nested_first, _sequential, _reads_a_value, _batch_norm,
                                  _user_function, _compiled], ids=lambda f: f.__name__.strip("_"))
def test_gradients_are_local_torchs_bit_for_bit_and_the_forward_holds_less(sess, form):
    kept = []  # every run's tensors alive to the end: none is freed while a later forward is measured

    def run(device, ck):
        before = sess.stats()["bytes"] if device != "cpu" else 0
        model, x, out = form(device, ck)
        held = sess.stats()["bytes"] - before if device != "cpu" else 0
        loss = out.pow(2).sum()
        loss.backward()
        kept.append((model, x))
        return held, [t.detach().cpu() for t in (loss, x.grad, *model.parameters(),
                                                  *(p.grad for p in model.parameters()), *model.buffers())]

    held, got = run(sess.device, checkpoint)
    plain, _ = run(sess.device, _plain)
    assert held < plain
    for got_one, want in zip(got, run("cpu", checkpoint)[1], strict=True):
        torch.testing.assert_close(got_one, want, rtol=0, atol=0)


class _ReadsAValue(torch.autograd.Function):
    """Its backward reads a value: it runs on the client, in a staged backward (``handlers/_staged``)."""

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * (2.0 if g.sum().item() > 0 else 1.0)


def _client_run(device, ck):
    model = _mlp(device, 64)
    x = _x(device, 32, 4).requires_grad_()
    return model, x, ck(lambda h: _ReadsAValue.apply(model(h)).sin() * h, x, use_reentrant=False)


def test_a_client_run_function_inside_the_function_gives_the_plain_runs_gradients(sess):
    """The staged backward's gradients differ from the CPU's in the last bits already (known-differences); with
    the function checkpointed they are the same as without, bit for bit, and the forward holds less."""
    runs = {}
    for ck in (checkpoint, _plain):
        before = sess.stats()["bytes"]
        model, x, out = _client_run(sess.device, ck)
        held = sess.stats()["bytes"] - before
        out.pow(2).sum().backward()
        runs[ck] = held, [t.detach().cpu() for t in (x.grad, *(p.grad for p in model.parameters()))], model
    assert runs[checkpoint][0] < runs[_plain][0]
    for got, want in zip(runs[checkpoint][1], runs[_plain][1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_autograd_grad_then_a_second_backward_recompute_each_time(any_sess):
    def run(device):
        model, x, out = _module(device, checkpoint)
        loss = out.pow(2).sum()
        (gx,) = torch.autograd.grad(loss, x, retain_graph=True)
        loss.backward()
        return [t.cpu() for t in (gx, x.grad, *(p.grad for p in model.parameters()))]

    for got, want in zip(run(any_sess.device), run("cpu"), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_dropout_draws_the_forwards_numbers_again(sess):
    """The region's generator state is kept at its open and set for the recomputation, then put back (torch's
    ``preserve_rng_state``): the same masks as without checkpointing, and the same numbers drawn after."""
    for got, want in zip(_blocks_run(sess, True, use_reentrant=False), _blocks_run(sess, False), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _held_after_forward(sess, checkpointed: bool) -> tuple[int, list]:
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(3)])
    blocks = blocks.to(sess.device)
    h = x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).to(sess.device).requires_grad_()
    gc.collect()  # an earlier call's handles in cycles (a grad's handle and its owner) freed now, not mid-forward
    before = sess.stats()["bytes"]
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False) if checkpointed else block(h)
    held = sess.stats()["bytes"] - before
    h.pow(2).mean().backward()
    return held, [t.cpu() for t in (x.grad, *(p.grad for p in blocks.parameters()))]


def test_the_session_holds_less_after_a_checkpointed_forward(sess):
    """What a block's ops save (its input, GELU's input and output: 64x32 + 2 x 64x128 floats) is dropped; each
    block's input is kept, as torch keeps it, and the generator's state at its start (the test server's device is
    the CPU: an mt19937 state). Measured by the server's count of the session's bytes."""
    plain, plain_grads = _held_after_forward(sess, False)
    kept, grads = _held_after_forward(sess, True)
    assert plain == 3 * (64 * 32 + 2 * 64 * 128) * 4
    assert kept == 3 * (64 * 32 * 4 + torch.Generator().get_state().numel())
    for got, want in zip(grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_input_changed_in_place_after_the_forward_raises_torchs_error(sess):
    for device, error in (("cpu", RuntimeError), (sess.device, RemoteError)):
        x = _x(device, 3, 4).requires_grad_()
        h = x * 2
        y = checkpoint(torch.sin, h, use_reentrant=False)
        h.add_(1)
        with pytest.raises(error, match="modified by an inplace operation"):
            y.sum().backward()
            x.grad.cpu()


def test_context_fn_and_debug_are_refused_at_the_functions_first_op(sess):
    x = _x(sess.device, 3, 4).requires_grad_()
    with pytest.raises(RuntimeError, match=r"context_fn \(selective checkpointing\) or debug=True is not supported"):
        checkpoint(torch.sin, x, use_reentrant=False, debug=True)
    assert torch.equal(checkpoint(torch.sin, x, use_reentrant=False).cpu(), x.detach().cpu().sin())


def test_a_backward_inside_the_function_is_refused_and_the_session_goes_on(any_sess):
    x = _x(any_sess.device, 3, 4).requires_grad_()

    def f(t):
        (g,) = torch.autograd.grad(t.sin().sum(), t, create_graph=True)
        return g * t

    with pytest.raises(RemoteError, match=r"torch.autograd.grad inside the function of torch.utils.checkpoint"):
        checkpoint(f, x, use_reentrant=False).sum().backward()
        x.grad.cpu()
    (x * 2).sum().backward()  # the region was closed: a backward runs again
    assert torch.equal(x.grad.cpu(), torch.full((3, 4), 2.0, dtype=torch.float64))


def test_a_program_failing_inside_the_function_leaves_no_region_open(sess):
    """The step that closes the region was queued after the failing one, so it never ran: it is sent again."""
    x = _x(sess.device, 3, 4).requires_grad_()
    bad = torch.tensor([7])  # out of range: only the server's value check knows

    def f(t):
        return t.sin()[bad]

    y = checkpoint(f, x, use_reentrant=False)
    with pytest.raises(RemoteError, match="out of bounds|out of range"):
        y.sum().item()
    (x * 3).sum().backward()  # a backward inside a region still open would be refused
    assert torch.equal(x.grad.cpu(), torch.full((3, 4), 3.0, dtype=torch.float64))


class _Saving(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_a_function_saving_tensors_inside_the_checkpointed_function_is_refused_naming_why(sess):
    x = _x(sess.device, 3, 4).requires_grad_()
    with pytest.raises(RuntimeError, match=r"recomputing its function on the client, which reads a tensor a "
                                           r"torch.autograd.Function saved .* Apply the Function outside"):
        checkpoint(lambda t: _Saving.apply(t.sin()), x, use_reentrant=False)
    (_Saving.apply(x.sin()).sum()).backward()  # outside it: the Function runs as anywhere
    torch.testing.assert_close(x.grad.cpu(), (2 * x.detach().sin() * x.detach().cos()).cpu())

"""No stale replay, ever: a compiled step that reads a Python value gets this call's value, never the one
it was compiled with. For each kind of value a step can read, the same compiled function runs as the value
changes, beside local eager torch: dynamo's guards recompile (or lift the value into an input: a float, an
int, then a template's scalar), and every result equals torch's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

SCALE = 2.0  # a global the compiled function reads


def _linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def _x(rows: int = 5) -> torch.Tensor:
    return torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows))


def _both(sess, fn, change, calls: int = 4, module=_linear) -> None:
    """``fn(model, x, k)`` compiled for the remote model and run eagerly on a local twin, ``change(k, model)``
    changing the value between calls: outputs and parameters (and grads) equal bit for bit."""
    local, remote = module(), module().to(sess.device)
    compiled = torch.compile(fn, backend="remote")
    for k in range(calls):
        change(k, local), change(k, remote)
        torch.manual_seed(k), sess.manual_seed(k)
        want = fn(local, _x(), k)
        got = compiled(remote, _x().to(sess.device), k)
        assert torch.equal(got.detach().cpu(), want.detach()), k
        assert got.requires_grad == want.requires_grad, k
        for r, l in zip(remote.parameters(), local.parameters()):
            assert torch.equal(r.detach().cpu(), l.detach()), k
            assert (r.grad is None) == (l.grad is None), k
            if l.grad is not None:
                assert torch.equal(r.grad.cpu(), l.grad), k


def _sgd_step(model, x, k):
    loss = model(x).square().mean()
    model.opt.zero_grad()
    loss.backward()
    model.opt.step()
    return loss.detach()


def _with_sgd(module):
    def build():
        m = module()
        m.opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        m.sched = torch.optim.lr_scheduler.StepLR(m.opt, step_size=1, gamma=0.5)
        return m
    return build


def test_a_learning_rate_set_by_a_scheduler(sess):
    _both(sess, _sgd_step, lambda k, m: m.sched.step() if k else None, module=_with_sgd(_linear))


def test_a_learning_rate_set_by_hand(sess):
    def set_lr(k, m):
        m.opt.param_groups[0]["lr"] = [0.1, 0.05, 0.3, 0.01][k]
    _both(sess, _sgd_step, set_lr, module=_with_sgd(_linear))


def test_an_optimizers_state_replaced_by_a_loaded_checkpoint(sess):
    """The momentum buffers are attributes of the optimizer's graph, which the SDK reads once per graph
    (``CompiledGraph.attrs``): new ones, from ``load_state_dict``, are a recompile, never the old tensors."""
    def change(k, m):
        if k == 1:
            m.saved = copy.deepcopy(m.opt.state_dict())
        if k == 3:
            m.opt.load_state_dict(m.saved)
    _both(sess, _sgd_step, change, calls=5, module=_with_sgd(_linear))


def test_a_python_float_and_a_python_int_in_the_loss(sess):
    def fn(model, x, k):
        loss = (model(x) * (0.5 + k / 3)).sum() + k  # a float, and an int, that change every call
        loss.backward()
        return loss.detach()
    _both(sess, fn, lambda k, m: None)


def test_a_global_the_function_reads(sess):
    def fn(model, x, k):
        return model(x) * SCALE

    def change(k, m):
        global SCALE
        SCALE = [2.0, 3.0, 0.5, -1.0][k]
    _both(sess, fn, change)


def test_train_and_eval(sess):
    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))

    def fn(model, x, k):
        return model(x)

    _both(sess, fn, lambda k, m: m.train(k % 2 == 0), module=build)  # dropout's draws: the session's generator


def test_requires_grad_toggled(sess):
    def fn(model, x, k):
        model.weight.grad = model.bias.grad = None
        loss = model(x).sum()
        loss.backward()
        return loss.detach()
    _both(sess, fn, lambda k, m: m.weight.requires_grad_(k % 2 == 0))


def test_no_grad_around_the_call(sess):
    local, remote = _linear(), _linear().to(sess.device)
    compiled = torch.compile(lambda m, x: m(x) * 2, backend="remote")
    for grad in (True, False, True):
        with torch.set_grad_enabled(grad):
            got, want = compiled(remote, _x().to(sess.device)), local(_x()) * 2
        assert got.requires_grad == want.requires_grad == grad
        assert torch.equal(got.detach().cpu(), want.detach())
        if grad:  # the server recorded a graph: a backward through the output reaches the parameters
            got.sum().backward(), want.sum().backward()
            assert torch.equal(remote.weight.grad.cpu(), local.weight.grad)


@pytest.mark.parametrize("dynamic", [None, False], ids=["automatic-dynamic", "static"])
def test_a_changed_batch_shape(sess, dynamic):
    """Rows 5, 7, 3, 9: a recompile, then (automatic dynamic shapes) one graph of any batch size whose
    outputs' shapes each call works out; or (dynamic=False) a graph per shape."""
    local, remote = _linear(), _linear().to(sess.device)

    def fn(model, x):
        b = x.size(0)
        h = model(x).view(b, 3, 1).expand(b, 3, 2).reshape(b, 6)  # sizes computed from the input's
        return h.sum(1, keepdim=True) / b

    compiled = torch.compile(fn, backend="remote", dynamic=dynamic)
    for rows in (5, 7, 3, 9):
        got, want = compiled(remote, _x(rows).to(sess.device)), fn(local, _x(rows))
        assert got.shape == want.shape == (rows, 1)
        assert torch.equal(got.detach().cpu(), want.detach())

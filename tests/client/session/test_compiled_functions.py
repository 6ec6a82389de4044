"""A user's ``torch.autograd.Function`` inside ``torch.compile(..., backend="remote")``: dynamo traces it into
``autograd_function_apply``, whose runtime Function keeps what the forward saved in a closure
(``client/dispatch/_closure_saved``); its backward runs inside the server's, as an eager call's does. Each
case against the same code on the CPU compiled with ``backend="eager"`` (dynamo's own form of the Function)."""

from __future__ import annotations

import pytest
import torch

from .test_function_backward import Cube, CustomAdd, _assert_same, _ste_training

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _compiled(device):
    return lambda fn: torch.compile(fn, backend="eager" if device == "cpu" else "remote")


def _custom_add(device):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(3, 4, generator=g, dtype=torch.float64).to(device).requires_grad_() for _ in range(2))

    @_compiled(device)
    def loss_of(x, y):
        out = CustomAdd.apply(x.tanh(), y, 2.5)
        return (out * out).sum()

    loss = loss_of(x, y)
    loss.backward()
    return loss.detach(), x.grad, y.grad


@pytest.mark.filterwarnings("ignore:torch.compile\\(backend=\"remote\"\\)")
def test_the_seeds_custom_add_compiled(sess):
    _assert_same(_custom_add(sess.device), _custom_add("cpu"))


@pytest.mark.filterwarnings("ignore:torch.compile\\(backend=\"remote\"\\)")
def test_a_straight_through_estimator_compiled_trains_as_on_the_cpu(sess):
    _assert_same(_ste_training(sess.device, _compiled(sess.device)), _ste_training("cpu", _compiled("cpu")))


def _cube_grads(device):
    x = torch.tensor([0.5, -1.5, 2.0], dtype=torch.float64).to(device).requires_grad_()
    y = _compiled(device)(lambda x: Cube.apply(x).sum())(x)
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    # dynamo's form has no double backward: torch says so at the call, the server at the next read
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(g.sum(), x)[0].tolist()
    return y.detach(), g.detach()


@pytest.mark.filterwarnings("ignore:torch.compile\\(backend=\"remote\"\\)")
def test_a_function_that_saves_its_input_compiled(sess):
    # its saved input is in the closure of dynamo's backward: it read "a remote tensor it was not given"
    _assert_same(_cube_grads(sess.device), _cube_grads("cpu"))

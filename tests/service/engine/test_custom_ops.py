"""Operator-supplied custom ops: registration checks, and calling them through the SDK."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from remote_autograd import client
from remote_autograd.service.ops import OP_TABLE, OpRegistrationError, load_op_modules

from ...conftest import start_server
from ...servers import ROOT


@pytest.mark.parametrize("module, check", [("tests.op_modules.wrong_grad", "gradcheck"),
                                           ("tests.op_modules.wrong_shape", r"invalid gradient.*check: backward")])
def test_a_failing_op_is_refused_naming_the_check(module, check):
    with pytest.raises(OpRegistrationError, match=check):
        load_op_modules([module])
    assert not any(e.name.startswith("test_bad") for e in OP_TABLE)


def test_a_server_refuses_to_start_with_a_broken_op():
    proc = subprocess.run([sys.executable, "-m", "remote_autograd.service", "--port", "1"], cwd=ROOT, capture_output=True, text=True,
                          env={"REMOTE_AUTOGRAD_OP_MODULES": "tests.op_modules.wrong_grad", "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert proc.returncode != 0 and "test_bad_cube" in proc.stderr and "gradcheck" in proc.stderr


def test_a_registered_op_is_listed_and_callable():
    with start_server(REMOTE_AUTOGRAD_OP_MODULES="tests.op_modules.good") as url, client.connect(url) as sess:
        assert "test_swish" in dir(sess.ops)
        t = torch.randn(5, dtype=torch.float64)
        x = sess.tensor(t, requires_grad=True)
        y = sess.ops.test_swish(x)
        y.sum().backward()
        local = t.clone().requires_grad_()
        torch.nn.functional.silu(local).sum().backward()
        torch.testing.assert_close(y.to_torch().detach(), torch.nn.functional.silu(t))
        torch.testing.assert_close(x.grad.to_torch(), local.grad)


def test_clip_grad_example(sess):
    x = sess.tensor(torch.ones(4), requires_grad=True)
    (sess.ops.clip_grad(x, 1.0) * 10).sum().backward()
    g = x.grad.to_torch()
    assert torch.linalg.vector_norm(g).item() == pytest.approx(1.0, rel=1e-4)

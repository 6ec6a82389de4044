"""The SDK asks the server to omit the metadata it infers (``omit_known_meta`` on every program),
and still reads what only the server knows: the outputs of ``out_many`` calls, which grads of an
``allow_unused`` grad are None, and a backward's ``no_grad``. Each case is checked against local
torch, pipelined and eager, over a recording transport."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

from remote_autograd import client

from ..device.test_device import ProgramRecorder


@pytest.fixture(params=["pipelined", "eager"])
def recorded(request) -> Iterator[tuple[client.Session, ProgramRecorder]]:
    recorder = ProgramRecorder()
    with client.connect(transport=recorder, pipeline=request.param == "pipelined") as sess:
        yield sess, recorder


def _scenario(device, sync=lambda: None) -> dict:
    """Results by name, from the same code on either device (``sync``: the session's, for the one
    read that needs the server's answer first; see below)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, generator=g, dtype=torch.float64).to(device).requires_grad_()
    z = torch.randn(6, generator=g, dtype=torch.float64).to(device).requires_grad_()
    picked = x[x > 0]  # a boolean mask: the shape only the server knows (out_many)
    nonzero = torch.where(x > 0.5)  # out_many with a tuple of outputs
    loss = picked.pow(2).sum()
    used, unused = torch.autograd.grad(loss, [x, z], allow_unused=True, retain_graph=True)
    zeros = torch.autograd.grad(loss, [x, z], materialize_grads=True, retain_graph=True)[1]
    u = torch.randn(4, generator=g, dtype=torch.float64).to(device).requires_grad_()
    (torch.linalg.vector_norm(u, 0) + loss).backward()  # u is reached, yet gets no grad (no_grad)
    sync()  # u.grad is None only once the answer says so: before, a handle (docs/known-differences.md)
    x.data.mul_(2.0)
    w = torch.ones(3, dtype=torch.float64).to(device)
    w.requires_grad_()  # set_requires_grad
    (w * 3).sum().backward()
    return {"picked": picked, "nonzero": nonzero, "used": used, "unused": unused, "zeros": zeros, "u.grad": u.grad,
            "x.grad": x.grad, "x": x.detach(), "w.grad": w.grad}


def _same(r, want) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(r, torch.Tensor) and r.dtype == want.dtype and torch.equal(r.cpu().detach(), want)
    if isinstance(want, tuple):
        return type(r) is tuple and len(r) == len(want) and all(_same(a, b) for a, b in zip(r, want))
    return r is None and want is None


def test_the_sdk_omits_known_meta_and_reads_what_only_the_server_knows(recorded):
    sess, recorder = recorded
    remote, local = _scenario(sess.device, sess.sync), _scenario("cpu")
    for name, want in local.items():
        assert _same(remote[name], want), (name, remote[name], want)
    assert local["unused"] is None and local["u.grad"] is None  # None kept as None, not zeros
    assert local["picked"].numel() not in (0, 6) and len(local["nonzero"]) == 1
    sess.sync()
    assert recorder.bodies and all(body["omit_known_meta"] is True for body in recorder.bodies)

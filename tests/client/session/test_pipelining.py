"""Pipelining: queued steps, one request per value needed, and the same meaning as eager."""

from __future__ import annotations

import gc
import sys

import pytest
import torch

from remote_autograd import client
from remote_autograd.client.dispatch import _infer

from ...conftest import start_server

pytestmark = pytest.mark.backends("inprocess", "tenants", "ray")  # layout-free: the same on either backend


def _workload(sess):
    g = torch.Generator().manual_seed(1)
    x = sess.tensor(torch.randn(5, 4, generator=g))
    w = sess.tensor(torch.randn(4, 3, generator=g), requires_grad=True)
    b = sess.tensor(torch.randn(3, generator=g), requires_grad=True)
    h = torch.tanh(x @ w + b)
    loss = (h * h).mean() + torch.sigmoid(h).sum() / 3 - (1 - h).exp().mean()
    loss.backward()
    return loss.to_torch(), w.grad.to_torch(), b.grad.to_torch(), h.to_torch()


def test_eager_and_pipelined_are_bitwise_identical(server_url):
    with client.connect(server_url, pipeline=True) as p, client.connect(server_url, pipeline=False) as e:
        for a, b in zip(_workload(p), _workload(e)):
            assert torch.equal(a, b)


def test_a_chain_of_50_ops_and_item_is_one_request(sess):
    x = sess.tensor(torch.rand(16) + 1)
    sess.sync()
    before = sess.requests
    y = x
    for i in range(50):
        y = y * 1.01 if i % 2 else y + 0.5
    value = y.item() if y.numel() == 1 else y.sum().item()
    assert sess.requests - before == 1
    ref = torch.rand(0)  # keep the local reference computation explicit
    t = x.to_torch()
    for i in range(50):
        t = t * 1.01 if i % 2 else t + 0.5
    assert value == pytest.approx(t.sum().item(), rel=1e-6)
    del ref


def test_reading_grad_never_flushes(sess):
    w = sess.tensor(torch.randn(3), requires_grad=True)
    frozen = sess.tensor(torch.randn(3), requires_grad=True)
    unused = sess.tensor(torch.randn(3), requires_grad=True)
    sess.sync()
    before = sess.requests
    (w * 2 + frozen.detach()).sum().backward()
    assert w.grad is not None and frozen.grad is None and unused.grad is None
    w.grad.zero_()
    w.grad = None
    assert w.grad is None
    assert sess.requests == before
    sess.sync()
    assert sess.requests == before + 1


def test_error_surfaces_with_the_users_line(any_sess):
    # A shape error: meta inference fails, so even a pipelined session sends now and raises here.
    sess = any_sess
    a = sess.tensor(torch.randn(2, 3))
    good = a * 2
    with pytest.raises(client.RemoteError) as first:
        a @ a
    assert first.value.op == "Tensor.matmul" and first.value.code == "op_error"  # the spelling called
    assert "test_pipelining.py" in first.value.where
    torch.testing.assert_close(good.to_torch(), a.to_torch() * 2)


def test_queued_failure_marks_later_results(sess):
    a = sess.tensor(torch.randn(2, 3))
    b = sess.tensor(torch.randn(3))
    c = a + b
    d = torch.nn.functional.relu(c)
    e = torch.nn.functional.relu(d)
    sess.sync()
    # a failure the client cannot foresee: the server's tensor is gone
    sess._transport.request("POST", f"/v1/sessions/{sess.id}/programs",
                            {"id": "external-free", "steps": [{"kind": "free", "ids": [d._id]}]})
    f = e * 2
    g = d * 2  # fails on the server: d was freed behind our back
    h = g + 1
    with pytest.raises(client.RemoteError) as info:
        sess.sync()
    assert info.value.code == "unknown_tensor" and info.value.op == "Tensor.mul"
    assert "g = d * 2" not in str(info.value) and "test_pipelining.py" in info.value.where
    with pytest.raises(client.RemoteError):
        h.item()
    torch.testing.assert_close(f.to_torch(), torch.relu(torch.relu(a.to_torch() + b.to_torch())) * 2)


def test_dropped_tensors_are_freed(sess):
    baseline = sess.stats()["tensors"]
    x = sess.tensor(torch.randn(100))
    for _ in range(20):
        y = (x * 2).exp().sum()
        y.item()
    del x, y
    gc.collect()
    sess.sync()
    assert sess.stats()["tensors"] == baseline


def test_a_tensor_whose_grad_was_read_is_freed_when_dropped_as_in_torch(sess):
    """No cycle between a tensor's handle and its grad's: dropped, both go at once, garbage collector or not."""
    baseline = sess.stats()["bytes"]
    gc.disable()
    try:
        p = torch.ones(1000, device=sess.device, requires_grad=True)
        (p * 2).sum().backward()
        g = p.grad
        assert g is p.grad and torch.equal(g.cpu(), torch.full((1000,), 2.0))
        del g
        assert p.grad is not None  # made again on reading
        del p
        assert sess.stats()["bytes"] == baseline
    finally:
        gc.enable()


def test_queue_flushes_at_the_session_step_limit():
    with start_server(REMOTE_AUTOGRAD_MAX_STEPS_PER_PROGRAM="8") as url, client.connect(url) as sess:
        assert sess.limits["max_steps_per_program"] == 8
        x = sess.tensor(torch.ones(3))
        for _ in range(30):
            x = x + 1
        assert x.tolist() == [31.0, 31.0, 31.0]
        assert sess.requests >= 5


CASES = [
    ((2, 3), torch.float32, (3,), torch.float32),
    ((2, 1), torch.float32, (1, 4), torch.float64),
    ((), torch.float64, (2, 2), torch.float32),
    ((4,), torch.float16, (4,), torch.float32),
    ((4,), torch.bfloat16, (), torch.float32),
    ((4,), torch.float16, 1.5, None),
    ((4,), torch.int64, 2.5, None),
    ((4,), torch.int32, (4,), torch.float16),
    ((0, 3), torch.float32, (3,), torch.float32),
    ((3, 1, 2), torch.float32, (4, 1), torch.float32),
    ((2,), torch.bool, 1.0, None),
    ((2,), torch.uint8, (2,), torch.float32),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_elementwise_metadata_rules_agree_with_torch(case):
    shape_a, dtype_a, b, dtype_b = case
    ta = torch.zeros(shape_a, dtype=dtype_a)
    tb = torch.zeros(b, dtype=dtype_b) if dtype_b is not None else b
    want = torch.add(ta, tb)
    operand_b = (tuple(b), dtype_b) if dtype_b is not None else b
    got = _infer.elementwise([(shape_a, dtype_a), operand_b])
    if got is None:  # integer results are left to the meta device
        assert not (want.dtype.is_floating_point or want.dtype.is_complex)
    else:
        assert got == [(tuple(want.shape), want.dtype)]


def test_metadata_of_every_routed_call_matches_torch(sess):
    x = torch.randn(2, 3)
    r = sess.tensor(x)
    for fn in (lambda t: t.sum(1), lambda t: t.reshape(3, 2), lambda t: t.transpose(0, 1), lambda t: t @ t.T,
               lambda t: t.mean(), lambda t: 2 ** t, lambda t: t.long() + 1):
        want, got = fn(x), fn(r)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        torch.testing.assert_close(got.to_torch(), want)


@pytest.mark.parametrize("shapes", [[(2, 3), (3,)], [(2, 1), (1, 4)], [(), (2, 2)], [(0, 3), (3,)], [(3, 1, 2), (4, 1)],
                                    [(2, 3), (4,)], [(0,), (2,)], [(5,)], [(1,), (0,)], [(2, 1, 3), (2, 4, 3), (4, 1)]],
                         ids=str)
def test_hand_written_broadcast_agrees_with_torch(shapes):
    try:
        want = tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        want = None
    assert _infer.broadcast(shapes) == want


def test_a_failure_inside_torch_code_names_the_users_exact_line(sess):
    """Steps queued by torch's own code (an optimizer's step) name the user's line that called it, read
    when the step was queued, not where the user's code is when the error arrives."""
    w = sess.tensor(torch.randn(3), requires_grad=True)
    (w * 2).sum().backward()
    opt = torch.optim.SGD([w], lr=0.1)
    sess.sync()
    sess._transport.request("POST", f"/v1/sessions/{sess.id}/programs",
                            {"id": "external-free", "steps": [{"kind": "free", "ids": [w._id]}]})
    line = sys._getframe().f_lineno + 1
    opt.step()
    other = w.grad * 3  # noqa: F841  (the user's code has moved on when the error arrives)
    with pytest.raises(client.RemoteError) as info:
        sess.sync()
    assert info.value.where == f"{__file__}:{line}"

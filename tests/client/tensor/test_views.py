"""Views share memory with their base exactly as in torch; shape-changing in-place ops.

Every case runs the same function on local torch tensors and on RemoteTensors and
compares values, grads, requires_grad / is_leaf, ``_version``, shape and strides, or
the error torch raises (same type, same message).
"""

from __future__ import annotations

import pytest
import torch

from remote_autograd import client
from remote_autograd.client.tensor._views import UNKNOWN
from remote_autograd.service.ops import OP_TABLE

C = torch.arange(12.0).reshape(3, 4) / 7  # a fixed weight so gradients are not all ones


def _weighted(t: torch.Tensor, weight: torch.Tensor = C) -> torch.Tensor:
    """``(t * weight).sum()`` with the weight on ``t``'s device (a loss to backward from)."""
    return (t * weight.to(t.device)).sum()


def _inputs(sess, specs):
    """Local and remote copies of ``specs``: (tensor, requires_grad) pairs."""
    local = [t.clone().requires_grad_(rg) for t, rg in specs]
    remote = [sess.tensor(t.clone(), requires_grad=rg) for t, rg in specs]
    return local, remote


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)] if isinstance(out, (list, tuple)) else []


def _same(remote, local, what=""):
    assert isinstance(remote, client.RemoteTensor), what
    assert remote.shape == local.shape and remote.dtype == local.dtype, what
    assert (remote.requires_grad, remote.is_leaf) == (local.requires_grad, local.is_leaf), what
    assert remote._version == local._version, what
    if remote._strides is not UNKNOWN:  # a result computed from a non-contiguous input: only the server knows
        assert remote.stride() == local.stride() and remote.is_contiguous() == local.is_contiguous(), what
    torch.testing.assert_close(remote.to_torch().detach(), local.detach(), rtol=0, atol=0, msg=what)


def both(sess, fn, *specs, backward=None):
    """``fn(*tensors)`` on local and remote tensors; every tensor it returns (and the inputs) must agree.
    ``backward(outputs)``: a scalar whose backward is run on both; the inputs' grads must agree."""
    local, remote = _inputs(sess, specs)
    lo, ro = _flat(fn(*local)), _flat(fn(*remote))
    assert len(lo) == len(ro)
    for i, (r, l) in enumerate(zip(ro + remote, lo + local)):
        _same(r, l, f"tensor {i}")
    if backward is not None:
        backward(lo).backward()
        backward(ro).backward()
        for r, l in zip(remote, local):
            if l.grad is None:
                assert r.grad is None
            else:
                torch.testing.assert_close(r.grad.to_torch(), l.grad)


def same_error(sess, fn, *specs, error=RuntimeError):
    """``fn`` raises on local torch; the remote run raises the same type with the same message."""
    local, remote = _inputs(sess, specs)
    with pytest.raises(error) as want:
        fn(*local)
    message = str(want.value).splitlines()[0].split(": [")[0]  # the tensor's description names torch's node
    with pytest.raises(error) as got:
        out = fn(*remote)
        sess.sync()  # a server-side error comes back with the program
        del out
    assert message in str(got.value)
    return got.value


def _base():
    return torch.arange(12.0).reshape(3, 4)


# (name, view of a (3, 4) tensor); each must be a view in torch too
VIEWS = [
    ("int", lambda y: y[1]), ("slice", lambda y: y[1:, ::2]), ("none-ellipsis", lambda y: y[None, ..., 2]),
    ("select", lambda y: y.select(1, 2)), ("narrow", lambda y: y.narrow(0, 1, 2)),
    ("view", lambda y: y.view(2, 6)), ("reshape", lambda y: y.reshape(6, 2)), ("view_as", lambda y: y.view_as(C.t())),
    ("flatten", lambda y: y.flatten()), ("unflatten", lambda y: y.unflatten(1, (2, 2))),
    ("transpose", lambda y: y.transpose(0, 1)), ("permute", lambda y: y.permute(1, 0)), ("t", lambda y: y.t()),
    ("T", lambda y: y.T), ("mT", lambda y: y.mT), ("unsqueeze", lambda y: y.unsqueeze(1)),
    ("squeeze", lambda y: y[None].squeeze(0)), ("diagonal", lambda y: y.diagonal()),
    ("unbind", lambda y: y.unbind(1)[2]), ("split", lambda y: y.split(2)[1]), ("chunk", lambda y: y.chunk(2, 1)[0]),
    ("detach", lambda y: y.detach()), ("view-of-view", lambda y: y.t()[1:].select(1, 0)),
    ("contiguous", lambda y: y.contiguous()),
]


@pytest.mark.parametrize("make", [m for _, m in VIEWS], ids=[n for n, _ in VIEWS])
def test_in_place_on_a_view_changes_the_base_and_back(sess, make):
    def fn(y):
        v = make(y)
        v.mul_(2)  # seen by y
        y.add_(1)  # seen by v
        w = make(y)
        w.sub_(0.5)
        return y, v, w
    both(sess, fn, (_base(), False))


def test_expand_is_a_view_and_refuses_in_place_writes_like_torch(sess):
    both(sess, lambda y: (y[:, :1].expand(3, 5), y.add_(1), y[:, :1].expand(3, 5)), (_base(), False))
    same_error(sess, lambda y: y[:1].expand(3, 4).add_(1), (_base(), False))


def test_a_copy_is_not_a_view(sess):
    both(sess, lambda y: (y[[0, 2]].add_(1), y[y > 3].mul_(2), y.t().reshape(-1).add_(1), y), (_base(), False))


def test_in_place_with_grad_through_a_view_gives_torchs_grads(sess):
    def fn(x, w):
        y = x * 1
        v = y[1]
        v.mul_(w)  # y's grad_fn becomes torch's CopySlices
        u = y[:, 2]
        return y, v, u

    both(sess, fn, (_base(), True), (torch.randn(4), True), backward=lambda outs: _weighted(outs[0]))


def test_a_base_without_grad_gets_it_from_a_view_written_in_place(sess):
    def fn(y, w):
        older = y[0]
        y[:, 1].add_(w)  # the leaf y (no grad) becomes a non-leaf that requires grad, and so do its views
        return older, y.t()

    both(sess, fn, (torch.zeros(3, 4), False), (torch.randn(3), True),
         backward=lambda outs: _weighted(outs[1], C.t()) + outs[0].sum())


def test_in_place_on_the_base_with_grad_reaches_existing_views(sess):
    def fn(z, w):
        y = z * 1  # no grad
        u = y[0]
        y.add_(w)
        return y, u

    both(sess, fn, (_base(), False), (torch.randn(3, 4), True), backward=lambda outs: (outs[1] * 3).sum())


def test_two_views_written_in_turn(sess):
    def fn(x, a, b):
        y = x.clone()
        y[0].mul_(a)
        y.t()[1].add_(b)
        return y, y.diagonal()

    both(sess, fn, (_base(), True), (torch.randn(4), True), (torch.randn(3), True),
         backward=lambda outs: _weighted(outs[0]) + outs[1].pow(2).sum())


def test_detach_shares_memory_but_not_the_graph(sess):
    def fn(x, w):
        y = x * 2
        d = y.detach()
        d.add_(1)  # changes y's values, not its graph
        d.mul_(w)  # d now has its own graph
        return y, d

    both(sess, fn, (_base(), True), (torch.randn(4), True), backward=lambda outs: _weighted(outs[0]) + outs[1].sum())


def test_view_of_a_leaf_that_requires_grad_in_place_is_torchs_error(sess):
    same_error(sess, lambda w: w[0].add_(1), (_base(), True))
    same_error(sess, lambda w: w.t().mul_(2), (_base(), True))
    same_error(sess, lambda w: w.add_(1), (_base(), True))


def test_views_from_unbind_refuse_in_place_with_grad_like_torch(sess):
    same_error(sess, lambda x, w: (x * 1).unbind(0)[1].mul_(w), (_base(), True), (torch.randn(4), True))


def test_saved_value_modified_through_a_view_is_torchs_error_at_backward(sess):
    def fn(x):
        y = x.sigmoid()  # saves its output
        y[0].mul_(2)
        return y.sum().backward()

    same_error(sess, fn, (_base(), True))


def test_versions_count_in_place_ops_on_every_alias(sess):
    def fn(y):
        v, d = y[0], y.detach()
        v.add_(1)
        d.zero_()
        y[1] = 3.0
        y.t().mul_(2)
        return y, v, d

    both(sess, fn, (_base(), False))


def test_no_grad_writes_through_views_are_exact(sess):
    def fn(w):
        with torch.no_grad():
            w[0].mul_(0.5)  # allowed under no_grad, as in an optimizer
            w.t()[1].add_(1)
        return w,

    both(sess, fn, (_base(), True), backward=lambda outs: _weighted(outs[0]))


# -- shape-changing in-place ops --------------------------------------------------------------------

SHAPE_INPLACE = [
    ("squeeze_", lambda y: y.unsqueeze(0).squeeze_(0)), ("squeeze_all", lambda y: y[None, :, None].squeeze_()),
    ("unsqueeze_", lambda y: y.unsqueeze_(1)), ("t_", lambda y: y.t_()), ("transpose_", lambda y: y.transpose_(0, 1)),
    ("swapaxes_", lambda y: y.swapaxes_(1, 0)), ("as_strided_", lambda y: y.as_strided_((2, 2), (1, 4))),
    ("t_-then-view-fails-like-torch", lambda y: y.t_().reshape(-1)),
]


@pytest.mark.parametrize("make", [m for _, m in SHAPE_INPLACE], ids=[n for n, _ in SHAPE_INPLACE])
def test_shape_changing_in_place_ops_follow_torch(sess, make):
    def fn(x):
        y = x * 1
        out = make(y)
        return y, out, y + C.reshape(y.shape).to(y.device) if y.numel() == 12 else y

    both(sess, fn, (_base(), True), backward=lambda outs: (outs[0] * outs[0]).sum())


def test_resize_where_torch_allows_it(sess):
    both(sess, lambda y: (y.resize_(4, 3), y.resize_(2, 2)), (_base(), False))
    same_error(sess, lambda w: w.resize_(12), (_base(), True))
    same_error(sess, lambda w: w.t_(), (_base(), True))
    with pytest.raises(client.RemoteError, match="expects a tensor with <= 2 dimensions, but self is 3D"):
        sess.tensor(_base())[None].t_()  # torch's meta check and message (t_ for the CPU kernel's t_())
        sess.sync()
    same_error(sess, lambda y: y.squeeze_(3), (_base(), False), error=(IndexError, RuntimeError))


def test_resize_that_would_grow_is_refused_loudly(sess):
    y = sess.tensor(_base())
    with pytest.raises(client.RemoteError, match="uninitialised"):
        y.resize_(5, 5)
        sess.sync()


def test_reshape_of_an_unknown_layout_refuses_in_place_with_grad_loudly(sess):
    x = sess.tensor(_base())
    w = sess.tensor(torch.randn(12), requires_grad=True)
    r = (x.t() + 1).reshape(-1)  # a copy on the server; the client cannot know without asking
    with pytest.raises(RuntimeError, match="may share memory"):
        r.add_(w)
    product = x.t() * w.view(4, 3)
    s = product.reshape(-1)  # already depends on w, like everything it may alias
    s.add_(w)  # changes nothing the client knows either way: allowed
    local_w = w.to_torch().detach()
    torch.testing.assert_close(s.to_torch().detach(), (_base().t() * local_w.view(4, 3)).reshape(-1) + local_w)
    # without a graph the write is exact either way
    both(sess, lambda y: ((y.t() + 1).reshape(-1).add_(1), y), (_base(), False))


# -- the server's aliasing is torch's, op by op ----------------------------------------------------


def _tensors(v):
    if isinstance(v, torch.Tensor):
        yield v
    elif isinstance(v, (list, tuple, dict)):
        for x in (v.values() if isinstance(v, dict) else v):
            yield from _tensors(x)


def _shares(out: torch.Tensor, inputs: list) -> bool:
    ptr = out.untyped_storage().data_ptr()
    return ptr != 0 and any(i.untyped_storage().data_ptr() == ptr for i in inputs)


def test_every_table_op_aliases_its_inputs_exactly_when_torch_does():
    """An entry of our own that copied where torch gives a view (or the reverse) would make writes diverge
    silently. (torch's own ops of the surface alias as torch does by construction: each spelling runs the
    torch callable itself; tests/ops/test_opinfo_remote.py runs them through the SDK.)"""
    checked = 0
    for entry in OP_TABLE:
        if entry.reference is None or entry.inplace:
            continue
        for i, sample in enumerate(entry.samples):
            args, kwargs = sample.materialise(torch.float64, seed=i)
            ref_args, ref_kwargs = sample.materialise(torch.float64, seed=i)
            torch.manual_seed(0)
            ours = list(_tensors(entry.fn(*args, **kwargs)))
            torch.manual_seed(0)
            theirs = list(_tensors(entry.reference(*ref_args, **ref_kwargs)))
            inputs, ref_inputs = list(_tensors([args, kwargs])), list(_tensors([ref_args, ref_kwargs]))
            assert [_shares(o, inputs) for o in ours] == [_shares(t, ref_inputs) for t in theirs], \
                f"{entry.name} sample {i}"
            checked += 1
    assert checked > 50


def test_an_in_place_op_through_one_alias_is_seen_through_every_other(sess):
    y = client.RemoteTensor.from_torch(_base(), sess)
    v, d = y[0], y.detach()
    other = client.RemoteTensor.from_torch(_base(), sess)
    d.add_(1)
    torch.testing.assert_close(v.to_torch(), _base()[0] + 1)
    torch.testing.assert_close(y.to_torch(), _base() + 1)
    torch.testing.assert_close(other.to_torch(), _base())  # memory of its own: untouched

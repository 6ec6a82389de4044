"""Generated from the op table: every op through the SDK and a real server, against local torch.

Each sample is uploaded, the op is called through its torch spelling (so routing
and client-side shape inference are exercised too), backward runs on the server
and the gradients come back; values and every input's grad must equal local torch.
"""

from __future__ import annotations

import pytest
import torch

from remote_autograd import client
from remote_autograd.client._core import call_op
from remote_autograd.service.ops import OP_TABLE, T

pytestmark = pytest.mark.optable

ENTRIES = [e for e in OP_TABLE if not e.name.startswith("_test") and e.reference is not None and not e.variants]


def _random_on_noncontiguous(entry, sample) -> bool:
    """A random op on a non-contiguous input: uploads are contiguous, and torch's mask follows memory order."""
    return not entry.exact and any(isinstance(a, T) and a.noncontiguous for a in (*sample.args, *sample.kwargs.values()))


def _moves_to_a_device(entry, sample) -> bool:
    """``.to("cpu")``, ``.type("torch.DoubleTensor")`` (a CPU type): a move off the server, which gives a local
    tensor (tests/client/device/test_device.py and test_device_module.py cover moves)."""
    return entry.name in ("to", "type") and any(isinstance(a, str) for a in (*sample.args, *sample.kwargs.values()))


CASES = [(e, i) for e in ENTRIES for i, sample in enumerate(e.samples)
         if not _random_on_noncontiguous(e, sample) and not _moves_to_a_device(e, sample)]


def _torch_callable(entry, sample):
    """The entry's plainest torch spelling that accepts this sample (tests only: names are our own)."""
    names = sorted(entry.torch_names, key=lambda n: (n.startswith("torch.Tensor."), "__" in n, n.endswith("_")))
    for func in _candidates(names):
        args, kwargs = sample.materialise(torch.float32)
        if entry.inplace:
            args = (args[0].detach(), *args[1:])
        try:
            func(*args, **kwargs)
        except (TypeError, RuntimeError):
            continue
        return func
    return None


def _candidates(names):
    for name in names:
        if name.endswith("_") and not name.endswith("__"):
            continue
        obj = torch
        try:
            for part in name.split(".")[1:]:
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if name.endswith(".__get__"):
            continue
        if name.startswith("torch.Tensor.__r"):
            continue
        yield obj


def _to_remote(v, sess):
    if isinstance(v, torch.Tensor):
        return client.RemoteTensor.from_torch(v, sess)
    if isinstance(v, list):
        return [_to_remote(x, sess) for x in v]
    if isinstance(v, tuple):
        return tuple(_to_remote(x, sess) for x in v)
    return v


def _leaves(v, out):
    if isinstance(v, torch.Tensor) and v.requires_grad:
        out.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _leaves(x, out)
    return out


def _outputs(res):
    """The op's outputs as a list, without the ``None``s of optional outputs (attention weights)."""
    return [o for o in res if o is not None] if isinstance(res, (tuple, list)) else [res]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].name}-{c[1]}")
def test_op_matches_local_torch(case, sess):
    entry, i = case
    sample = entry.samples[i]
    func = _torch_callable(entry, sample)
    args, kwargs = entry.samples[i].materialise(torch.float32, seed=i)
    ref_args, ref_kwargs = entry.samples[i].materialise(torch.float32, seed=i)
    r_args, r_kwargs = _to_remote(list(args), sess), {k: _to_remote(v, sess) for k, v in kwargs.items()}
    sess.manual_seed(0)
    torch.manual_seed(0)
    inputs = _leaves(r_args, []) + _leaves(list(r_kwargs.values()), [])
    ref_inputs = _leaves(ref_args, []) + _leaves(list(ref_kwargs.values()), [])
    writes_list = isinstance(r_args[0], list)  # torch._foreach_X_(tensors, ...)
    if entry.inplace and not writes_list:  # in place on a leaf that requires grad is refused (as in torch)
        r_args[0] = r_args[0] * 1
    if func is None:
        remote = _outputs(call_op(sess, entry.name, r_args, r_kwargs))
    else:
        remote = _outputs(func(*r_args, **r_kwargs))
    if entry.inplace:  # compare the written target(s) (torch's __setitem__ returns None)
        remote = list(r_args[0]) if writes_list else [r_args[0]]
    local = _outputs(entry.reference(*ref_args, **ref_kwargs))
    assert len(remote) == len(local)
    for r, l in zip(remote, local):
        assert r.shape == l.shape and r.dtype == l.dtype, "client-side metadata differs from torch"
        assert r.requires_grad == l.requires_grad
    outs = [(r, l) for r, l in zip(remote, local) if l.requires_grad]
    if inputs and outs and entry.differentiable:
        seeds = [torch.randn(l.shape, generator=torch.Generator().manual_seed(3)) for _, l in outs]
        torch.autograd.backward([l for _, l in outs], seeds)
        torch.autograd.backward([r for r, _ in outs], [seed.to(r.device) for seed, (r, _) in zip(seeds, outs)])
    for r, l in zip(remote, local):  # one more program: values (and grads below)
        r = r.to_torch() if isinstance(r, client.RemoteTensor) else r  # torch keeps some on the CPU (batch_sizes)
        torch.testing.assert_close(r.detach(), l.detach(), rtol=1e-5, atol=1e-6, equal_nan=True)
    for r, l in zip(inputs, ref_inputs):
        if l.grad is None:
            assert r.grad is None
        else:
            assert r.grad is not None, "the server's leaf got no grad where torch's did"
            torch.testing.assert_close(r.grad.to_torch(), l.grad, rtol=1e-5, atol=1e-6)


# A few ops of each kind also run through a front on the Ray backend: the program reaches a
# worker actor as bytes and the answer comes back encoded; the op table and runner are the same.
RAY_OPS = {"getitem", "setitem", "straight_through_round", "clip_grad", "type", "zeros", "randn", "set_data"}


@pytest.mark.backends("ray")
@pytest.mark.parametrize("case", [c for c in CASES if c[0].name in RAY_OPS], ids=lambda c: f"{c[0].name}-{c[1]}")
def test_op_matches_local_torch_on_the_ray_backend(case, sess):
    test_op_matches_local_torch(case, sess)

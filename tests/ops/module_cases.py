"""One ``torch.nn`` module of torch's ``module_db`` on the remote device against local torch.

``run(sess, info)`` builds the module from each of its first samples (float32, or float64 where
torch's float32 samples do not run; seeded alike), moves one copy
to the remote device (``module.to(device)``), runs both forward in training mode, and compares
the outputs, the buffers after forward (running statistics) and, after one backward with fixed
output grads, the input grads and every parameter's grad. Outcomes as in ``opinfo_cases``.
"""

from __future__ import annotations

import copy

import torch
from torch.utils._pytree import tree_leaves, tree_map

from . import opinfo_cases

SAMPLES = 2


def _inputs(info, dtype: torch.dtype) -> list:
    try:
        return info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                       training=True)[:SAMPLES]
    except Exception:
        return []


def _floats(out) -> list[torch.Tensor]:
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]


def _one(sess, info, module_input) -> opinfo_cases.Outcome:
    ctor, fwd = module_input.constructor_input, module_input.forward_input
    torch.manual_seed(0)
    try:
        local = info.module_cls(*ctor.args, **ctor.kwargs)
    except Exception as exc:
        return opinfo_cases.Outcome("local", opinfo_cases._first_line(exc))
    remote = copy.deepcopy(local)
    local_in = tree_map(opinfo_cases._local, (list(fwd.args), dict(fwd.kwargs)))
    torch.manual_seed(0)
    try:
        want = local(*local_in[0], **local_in[1])
    except Exception as exc:
        return opinfo_cases.Outcome("local", opinfo_cases._first_line(exc))
    try:
        remote.to(sess.device)
        remote_in = tree_map(opinfo_cases._remote(sess.device), (list(fwd.args), dict(fwd.kwargs)))
        torch.manual_seed(0)
        got = remote(*remote_in[0], **remote_in[1])
        opinfo_cases._compare(got, want, "output")
        for (name, b), (_, lb) in zip(remote.named_buffers(), local.named_buffers()):
            opinfo_cases._compare(b, lb, f"buffer {name}")
        _compare_backward(got, want, remote_in, local_in, remote, local)
    except Exception as exc:
        why = opinfo_cases._why_refused(exc)
        return opinfo_cases.Outcome("refused", why) if why else opinfo_cases.Outcome("fail", opinfo_cases._first_line(exc))
    return opinfo_cases.Outcome("pass")


def _compare_backward(got, want, remote_in, local_in, remote, local) -> None:
    pairs = [(g, w) for g, w in zip(tree_leaves(got), tree_leaves(want))
             if isinstance(w, torch.Tensor) and w.requires_grad]
    if not pairs:
        return
    gen = torch.Generator().manual_seed(3)
    seeds = [torch.randn(w.shape, generator=gen, dtype=w.dtype) for _, w in pairs]
    torch.autograd.backward([w for _, w in pairs], seeds)
    torch.autograd.backward([g for g, _ in pairs], [s.to(g.device) for (g, _), s in zip(pairs, seeds)])
    for i, (r, l) in enumerate(zip(opinfo_cases._grad_inputs(remote_in), opinfo_cases._grad_inputs(local_in))):
        _same_grad(r.grad, l.grad, f"input {i}")
    for (name, p), (_, lp) in zip(remote.named_parameters(), local.named_parameters()):
        _same_grad(p.grad, lp.grad, f"parameter {name}")


def _same_grad(got, want, what: str) -> None:
    if want is None:
        assert got is None or not opinfo_cases._fetch(got).any(), f"{what}: a grad where torch has none"
        return
    assert got is not None, f"{what}: no grad where torch has one"
    torch.testing.assert_close(opinfo_cases._fetch(got), want, equal_nan=True, msg=lambda m: f"{what} grad: {m}")


def run(sess, info) -> opinfo_cases.Outcome:
    local_error = "it has no CPU samples"
    for dtype in (torch.float32, torch.float64):  # float64 where torch's float32 samples do not run
        outcome, local_error, ran = opinfo_cases.over_samples(_inputs(info, dtype), lambda s: _one(sess, info, s))
        if outcome is not None:
            return outcome
        if ran:
            return opinfo_cases.Outcome("pass")
    return opinfo_cases.Outcome("fail", f"local torch fails with the SDK imported: {local_error}")

"""Generated from the op table: every entry of our own (an ``autograd.Function`` or session op) in-process.

For each op and each of its samples: forward values equal the reference torch
function and every differentiable input's gradient equals torch's (our own entries are
custom by design: none claims an exact gradient; an operator's op module that does is
gradchecked when it registers, ``service/ops/_checks.py``). A new op without samples fails here.
"""

from __future__ import annotations

import pytest
import torch

from remote_autograd.service.ops import OP_TABLE

pytestmark = pytest.mark.optable

# Only our own Functions: torch's own ops are checked against local torch remotely, on torch's own
# samples (test_opinfo_remote.py) and ours (test_ops_remote.py), never against themselves in one process
ENTRIES = [e for e in OP_TABLE if not e.name.startswith("_test") and e.kind == "function"]
CASES = [(e, i) for e in ENTRIES for i in range(len(e.samples))]
# Custom ops (no torch reference: a straight-through estimator, the session's seed) are
# checked by tests of their own; only cases that can apply are generated.
REFERENCED = [c for c in CASES if c[0].reference is not None]


def _id(case) -> str:
    entry, i = case
    return f"{entry.name}-{i}"


def _call(fn, args, kwargs):
    """The op's outputs as a tuple, without the ``None``s of optional outputs (attention weights)."""
    out = fn(*args, **kwargs)
    return tuple(o for o in out if o is not None) if isinstance(out, (tuple, list)) else (out,)


def _grad_inputs(args, kwargs) -> list[torch.Tensor]:
    found = []

    def walk(v):
        if isinstance(v, torch.Tensor) and v.requires_grad:
            found.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    walk(list(args))
    walk(list(kwargs.values()))
    return found


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_every_op_has_samples(entry):
    assert entry.samples, f"op {entry.name} declares no sample inputs"


@pytest.mark.parametrize("case", REFERENCED, ids=_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_forward_and_grads_match_torch(case, dtype):
    entry, i = case
    args, kwargs = entry.samples[i].materialise(dtype, seed=i)
    ref_args, ref_kwargs = entry.samples[i].materialise(dtype, seed=i)
    torch.manual_seed(0)
    ours = _call(entry.fn, args, kwargs)
    torch.manual_seed(0)
    theirs = _call(entry.reference, ref_args, ref_kwargs)
    assert len(ours) == len(theirs)
    for o, t in zip(ours, theirs):
        assert o.dtype == t.dtype and o.shape == t.shape
        torch.testing.assert_close(o, t, rtol=1e-5, atol=1e-6, equal_nan=True)
    inputs, ref_inputs = _grad_inputs(args, kwargs), _grad_inputs(ref_args, ref_kwargs)
    outs = [o for o in ours if o.requires_grad]
    if not inputs or not outs or not entry.differentiable:
        return
    ref_outs = [t for t in theirs if t.requires_grad]
    seeds = [torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(7)) for o in outs]
    got = torch.autograd.grad(outs, inputs, seeds, allow_unused=True)
    want = torch.autograd.grad(ref_outs, ref_inputs, seeds, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or not g.any()
            continue
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)

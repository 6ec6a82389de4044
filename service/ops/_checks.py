"""Registration checks for operator-supplied ops (``REMOTE_AUTOGRAD_OP_MODULES``).

Each sample runs through forward and backward; every gradient must have its
input's shape and dtype; an op that declares an exact gradient must pass
``gradcheck`` in float64. A failing op is removed from the table and refused
with a message naming the op, the sample and the check.
"""

from __future__ import annotations

import torch

from ._registry import OpEntry


class OpRegistrationError(RuntimeError):
    """An operator-supplied op failed a registration check."""


def check_entry(entry: OpEntry) -> None:
    """Raise ``OpRegistrationError`` naming the failed check; returns quietly when the op is sound."""
    if not entry.samples:
        raise OpRegistrationError(f"op {entry.name!r} refused: it declares no sample inputs (check: samples)")
    for index, sample in enumerate(entry.samples):
        where = f"op {entry.name!r}, sample {index}"
        args, kwargs = sample.materialise(torch.float64, seed=index)
        try:
            out = entry.fn(*args, **kwargs)
        except Exception as exc:
            raise OpRegistrationError(f"{where} refused: forward raised {type(exc).__name__}: {exc} (check: forward)")
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.requires_grad]
        grad_outs = [o for o in outs if o.requires_grad]
        if not entry.differentiable or not inputs or not grad_outs:
            continue
        try:
            grads = torch.autograd.grad(grad_outs, inputs, [torch.ones_like(o) for o in grad_outs], allow_unused=True)
        except Exception as exc:
            raise OpRegistrationError(f"{where} refused: backward raised {type(exc).__name__}: {exc} (check: backward)")
        for i, (x, g) in enumerate(zip(inputs, grads)):
            if g is not None and (g.shape != x.shape or g.dtype != x.dtype):
                raise OpRegistrationError(
                    f"{where} refused: gradient {i} has shape {list(g.shape)} and dtype {g.dtype}, but its input has "
                    f"{list(x.shape)} and {x.dtype} (check: gradient shape/dtype)")
        if entry.exact:
            _gradcheck(entry, where, args, kwargs, inputs)


def _gradcheck(entry: OpEntry, where: str, args, kwargs, inputs) -> None:
    positions = [i for i, a in enumerate(args) if any(a is x for x in inputs)]
    names = [k for k, v in kwargs.items() if any(v is x for x in inputs)]

    def f(*new):
        a, k = list(args), dict(kwargs)
        for pos, t in zip(positions + names, new):
            if isinstance(pos, int):
                a[pos] = t
            else:
                k[pos] = t
        return entry.fn(*a, **k)

    ordered = [args[p] for p in positions] + [kwargs[n] for n in names]
    try:
        ok = torch.autograd.gradcheck(f, ordered, raise_exception=False)
    except Exception:
        ok = False
    if not ok:
        raise OpRegistrationError(
            f"{where} refused: declared exact=True but its gradient does not pass gradcheck in float64 "
            "(check: gradcheck; declare exact=False for estimators such as straight-through)")

"""What the server needs to know of an op, found by running it: the second half of the generator.

Each probe runs the recorded calls of an op (``_record.Call``) on CPU and answers one question
the server and the client act on:

- ``outputs``: ``"tensor"`` (returns tensors), ``"inplace"`` (returns None but writes its first
  argument: ``__setitem__``, ``torch._foreach_add_``), ``"value"`` (a Python value: not a server op),
  ``"factory"`` (no tensor argument: the SDK's device kernels make these).
- ``random``: outputs differ between two seeds of the default generator.
- ``uninitialised``: outputs differ between two runs with the same seed (``empty_like``): the server
  zero-fills them, since memory a session receives never shows another's data.
- ``generator``: the callable takes a ``generator=`` argument (the session's is passed).
- ``meta``: ``"ok"`` when torch's meta kernels derive the real outputs' shapes and dtypes;
  ``"data_dependent"`` when the outputs' shapes change with the input values (``nonzero``,
  ``unique``); ``"missing"`` when meta fails and nothing says the shape depends on values.
- ``differentiable``: a floating output requires grad when the floating inputs do.
- ``index_args``: an integer tensor besides the first argument (an index: an in-place form then runs
  on a copy, so an index out of range cannot leave a half-written tensor).
- ``relayout`` (``changes_layout``): an in-place spelling changes its target's shape or strides (``t_``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ._record import Call


def _tensors(value: Any) -> list[torch.Tensor]:
    return [v for v in tree_leaves(value) if isinstance(v, torch.Tensor)]


def _fresh(value: Any, fill: str | None = None, requires_grad: bool | str = False, device: str | None = None) -> Any:
    """A copy of every tensor in ``value`` (``fill``: all ``"zeros"``, or ``"distinct"`` values; on
    ``device``; floating ones requiring grad, or only the ``"first"``)."""
    first = [requires_grad == "first"]

    def one(v):
        if not isinstance(v, torch.Tensor):
            return v
        t = v.detach().clone()
        if fill == "zeros":
            t.zero_()
        elif fill == "distinct" and t.numel():
            values = torch.arange(1, t.numel() + 1)  # no zero: nonzero(distinct) differs from nonzero(zeros)
            t.copy_((values % 2 if t.dtype == torch.bool else values).reshape(t.shape))
        if device is not None:
            t = t.to(device)
        if requires_grad and (t.is_floating_point() or t.is_complex()):
            if requires_grad is True or first[0]:
                t.requires_grad_(True)
                first[0] = False
        return t
    return tree_map(one, value)


def _run(call: Call, fn: Callable | None = None, **how) -> Any:
    args, kwargs = _fresh((call.args, call.kwargs), **how)
    return (fn or call.func)(*args, **kwargs)


def _seeded(call: Call, seed: int, fn: Callable | None = None) -> Any:
    torch.manual_seed(seed)
    with torch.no_grad():
        return _run(call, fn)


def _same(a: Any, b: Any) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if x.layout != torch.strided or y.layout != torch.strided:
            continue
        if not torch.equal(_bits(x), _bits(y)):  # bit for bit: NaNs alike, any dtype
            return False
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().resolve_conj().resolve_neg()
    return t.new_empty(t.shape).copy_(t).reshape(-1).view(torch.uint8)  # fresh strides: any layout views


def _shapes(value: Any) -> list[tuple]:
    return [(tuple(t.shape), t.dtype) for t in _tensors(value)]


def outputs_kind(call: Call) -> str:
    if not _tensors((call.args, call.kwargs)):
        return "factory"
    try:
        out = _seeded(call, 0)
    except Exception:
        return "failed"
    if _tensors(out):
        return "tensor"
    return "inplace" if out is None and _tensors(call.args[:1]) else "value"


def runs(calls: list[Call]) -> bool:
    for call in calls:
        try:
            _seeded(call, 0)
            return True
        except Exception:
            continue
    return False


def randomness(calls: list[Call]) -> tuple[bool, bool]:
    """(random, uninitialised) over the calls that run: random when a call draws from the default
    generator (its state moves) or its outputs follow the seed. Each call is also tried with a
    zero float made 0.5 and a False made True, one at a time (``dropout=0.0``, ``training=False``)."""
    random = uninitialised = False
    for call in calls:
        try:
            first, drew = _drawing(call)
            again, other = _seeded(call, 0), _seeded(call, 1)
        except Exception:
            continue
        if not _same(first, again):
            uninitialised = True
        elif drew or not _same(first, other) or any(_draws(c) for c in _switched_on(call)):
            random = True
    return random and not uninitialised, uninitialised


def _drawing(call: Call) -> tuple[Any, bool]:
    state = torch.manual_seed(0).get_state()
    with torch.no_grad():
        out = _run(call)
    return out, not torch.equal(torch.default_generator.get_state(), state)


def _draws(call: Call) -> bool:
    try:
        return _drawing(call)[1]
    except Exception:
        return False


def _switched_on(call: Call) -> list[Call]:
    """The call with one argument switched on: a 0.0 made 0.5, a False made True."""
    def on(v):
        return 0.5 if type(v) is float and v == 0.0 else True if v is False else None
    found = []
    for i, a in enumerate(call.args):
        if on(a) is not None:
            found.append(Call(call.func, (*call.args[:i], on(a), *call.args[i + 1:]), call.kwargs))
    for k, v in call.kwargs.items():
        if on(v) is not None:
            found.append(Call(call.func, call.args, {**call.kwargs, k: on(v)}))
    return found


def takes_generator(calls: list[Call]) -> bool:
    for call in calls:
        try:
            with torch.no_grad():
                _run(call, lambda *a, **k: call.func(*a, **k, generator=torch.Generator().manual_seed(0)))
            return True
        except Exception:
            continue
    return False


def meta_facts(calls: list[Call]) -> dict[str, Any]:
    """``meta``: ``data_dependent`` when any call's output shapes follow its values; else ``ok`` when
    meta derived the real outputs of some call (``meta_partial`` when it failed on others: the server
    then refuses those calls, loudly); else ``missing``. ``meta_derives_some`` for a data-dependent op
    whose other forms meta derives (``where(c, x, y)`` but not ``where(c)``)."""
    dependent = failed = derived = False
    for call in calls:
        try:
            real = _seeded(call, 0)
        except Exception:
            continue
        dependent = dependent or _varies_with_values(call, real)
        try:
            with torch.no_grad():
                meta = _run(call, device="meta")
        except Exception:
            failed = True
            continue
        if _shapes(meta) == _shapes(real):
            derived = True
        else:
            failed = True  # a meta kernel that disagrees with the real one cannot vouch for it
    if dependent:
        return {"meta": "data_dependent", **({"meta_derives_some": True} if derived else {})}
    if derived:
        return {"meta": "ok", **({"meta_partial": True} if failed else {})}
    return {"meta": "missing"}


def _varies_with_values(call: Call, real: Any) -> bool:
    for fill in ("zeros", "distinct"):
        try:
            with torch.no_grad():
                other = _run(call, fill=fill)
        except Exception:
            continue
        if _shapes(other) != _shapes(real):
            return True
    return False


def differentiable(calls: list[Call]) -> bool:
    """A floating output requires grad when the floating inputs do (or only the first of them, for ops
    that refuse a gradient to some argument: ``soft_margin_loss``'s target)."""
    for call in calls:
        if not any(t.is_floating_point() or t.is_complex() for t in _tensors((call.args, call.kwargs))):
            continue
        for how in ({"requires_grad": True}, {"requires_grad": "first"}):
            try:
                out = _run(call, **how)
            except Exception:
                continue
            if any(t.requires_grad for t in _tensors(out)):
                return True
    return False


def index_args(calls: list[Call]) -> bool:
    for call in calls:
        rest = _tensors((call.args[1:], call.kwargs))
        if any(not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool) for t in rest):
            return True
    return False


def changes_layout(inplace_fn: Callable, calls: list[Call]) -> bool:
    """Whether ``inplace_fn`` (an in-place spelling) gives its target another shape or strides."""
    for call in calls:
        if not call.args or not isinstance(call.args[0], torch.Tensor):
            continue
        args, kwargs = _fresh((call.args, call.kwargs))
        target = args[0]
        before = (target.shape, target.stride())
        try:
            with torch.no_grad():
                inplace_fn(*args, **kwargs)
        except Exception:
            continue
        return (target.shape, target.stride()) != before
    return False

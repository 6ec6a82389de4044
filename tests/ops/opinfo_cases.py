"""One OpInfo of torch's ``op_db`` through the SDK against local torch, on torch's own samples.

``run(sess, opinfo)`` moves the OpInfo's first samples (float32 where it takes them) to the remote
device, calls the OpInfo's own ``op`` on them (so routing, client-side metadata and the server's
entry are all exercised), and compares the outputs and the gradients of every input that
requires grad with the same call on local torch; then each of its other variants (method,
operators, in-place forms, aliases) without grad, outputs and every input after the call. ``gradcheck(sess, opinfo)`` runs a float64
``gradcheck(fast_mode=True)`` of the op computed remotely (forward and backward on the server).

Outcomes: ``pass``; ``refused`` (the server's table refuses the op on purpose: the reason is the
surface's own, or torch runs none of its samples on a CPU); ``fail`` (with the error). The test
(``test_opinfo_remote.py``) holds each OpInfo to the outcome docs/ops.md reports for it, and
``python -m tests.ops.opinfo_cases --write docs/ops.md`` refreshes that report.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves, tree_map

from remote_autograd import client
from remote_autograd.service.ops import surface
from remote_autograd.service.ops._derive_record import sample_dtype

SAMPLES = 2
_SURFACE = surface.load()
_REFUSED = {n: op["why"] for op in _SURFACE["refused"].values() for n in op["names"]}
_VALUES = set(_SURFACE["values"])
# ops whose values torch leaves unset (the server gives zeros): only their metadata is compared
_UNSET = {name for name, op in _SURFACE["ops"].items() if op.get("uninitialised")} | {
    n.removeprefix("torch.") for n in _SURFACE["factories"] if n.startswith("torch.empty")}


@dataclass(frozen=True)
class Outcome:
    status: str  # "pass", "refused" or "fail" ("local" for one sample torch itself refuses)
    detail: str = ""


def _samples(opinfo, dtype: torch.dtype, requires_grad: bool) -> list:
    try:
        return list(itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad), SAMPLES))
    except Exception:
        return []


def _why_refused(exc: Exception) -> str | None:
    """The surface's reason when the SDK refused a name it lists as refused, denied or a Python value;
    or what the wire cannot carry (a dtype outside proto/dtypes.py, a Python object)."""
    text = str(exc)
    if "has no wire encoding" in text or "cannot send an argument of type" in text:
        return f"the wire cannot carry it: {text.splitlines()[0]}"
    name = text.split(" is not supported", 1)[0].strip()
    full = "torch." + name if name.startswith("Tensor.") else name
    if full not in _REFUSED and "torch.functional." + full[6:] in _REFUSED:  # the SDK says torch.istft
        name = full = "torch.functional." + full[6:]
    if full in _REFUSED:
        return f"{name}: {_REFUSED[full]}"
    for pattern, why in _SURFACE["deny"].items():
        if fnmatch.fnmatchcase(full, pattern):
            return f"{name}: {why}"
    if full in _VALUES:
        return f"{name}: returns a Python value, which the server's table does not serve"
    if "is not supported on a remote tensor:" in text:  # calls a proxy cannot honour (data_ptr, hooks)
        return text
    return None


def _local(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone().requires_grad_(v.requires_grad)
    return v


def _remote(device):
    def move(v):
        if isinstance(v, torch.Tensor):
            return v.detach().to(device).requires_grad_(v.requires_grad)
        if isinstance(v, (str, torch.device)) and str(v) == "cpu":  # a factory's device=: the remote one
            return device
        return v
    return move


def _fetch(v):
    return v.to_torch().detach() if isinstance(v, client.RemoteTensor) else v


def _grad_inputs(tree) -> list:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def _compare(got, want, what: str, values: bool = True) -> None:
    got_leaves, want_leaves = tree_leaves(got), tree_leaves(want)
    assert len(got_leaves) == len(want_leaves), f"{what}: {len(got_leaves)} values, torch gives {len(want_leaves)}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"{what} {i}: {type(g).__name__}, torch gives a tensor"
            assert g.requires_grad == w.requires_grad, f"{what} {i}: requires_grad={g.requires_grad}, torch's " \
                                                       f"{w.requires_grad}"
            g = _fetch(g)
            assert g.shape == w.shape and g.dtype == w.dtype, f"{what} {i}: {g.dtype}{list(g.shape)}, torch " \
                                                              f"{w.dtype}{list(w.shape)}"
            if values:
                torch.testing.assert_close(g, w.detach(), equal_nan=True, msg=lambda m: f"{what} {i}: {m}")
        else:
            assert g == w, f"{what} {i}: {g!r}, torch gives {w!r}"


def _one(sess, opinfo, sample) -> Outcome | None:
    """A refusal naming torch's own error when torch itself refuses the sample here (nothing to compare)."""
    local = tree_map(_local, (sample.input, list(sample.args), dict(sample.kwargs)))
    torch.manual_seed(0)
    try:
        want = opinfo.op(local[0], *local[1], **local[2])
    except Exception as exc:
        return Outcome("local", _first_line(exc))
    try:
        remote = tree_map(_remote(sess.device), (sample.input, list(sample.args), dict(sample.kwargs)))
        torch.manual_seed(0)
        got = opinfo.op(remote[0], *remote[1], **remote[2])
        _compare(got, want, "output", values=opinfo.name not in _UNSET)
        _compare_grads(got, want, remote, local)
    except Exception as exc:
        why = _why_refused(exc)
        return Outcome("refused", why) if why is not None else Outcome("fail", _first_line(exc))
    return Outcome("pass")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _compare_grads(got, want, remote_args, local_args) -> None:
    local_in, remote_in = _grad_inputs(local_args), _grad_inputs(remote_args)
    pairs = [(g, w) for g, w in zip(tree_leaves(got), tree_leaves(want))
             if isinstance(w, torch.Tensor) and w.requires_grad]
    if not local_in or not pairs:
        return
    gen = torch.Generator().manual_seed(3)
    seeds = [torch.randn(w.shape, generator=gen, dtype=w.dtype) if w.is_floating_point() or w.is_complex()
             else None for _, w in pairs]
    pairs = [(g, w, s) for (g, w), s in zip(pairs, seeds) if s is not None]
    try:
        want_grads = torch.autograd.grad([w for _, w, _ in pairs], local_in, [s for *_, s in pairs],
                                         allow_unused=True)
    except RuntimeError:  # torch refuses this gradient itself (linalg.eig's phase): nothing to compare
        return
    got_grads = torch.autograd.grad([g for g, _, _ in pairs], remote_in,
                                    [s.to(g.device) for g, _, s in pairs], allow_unused=True)
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        if w is None:
            assert g is None or not _fetch(g).any(), f"grad {i}: the server gives one, torch none"
            continue
        assert g is not None, f"grad {i}: torch gives one, the server none"
        torch.testing.assert_close(_fetch(g), w, equal_nan=True, msg=lambda m: f"grad {i}: {m}")


def _variants(opinfo) -> list:
    """Each variant OpInfo declares besides ``op``: the method, the operators, the in-place forms, the
    aliases'."""
    found = [opinfo.method_variant, opinfo.operator_variant, opinfo.inplace_variant, opinfo.inplace_operator_variant]
    for alias in opinfo.aliases:
        found += [alias.op, alias.method_variant, alias.inplace_variant]
    return [fn for fn in found if fn is not None and fn is not opinfo.op]


def _only_tensors(tree) -> list:
    return [v for v in tree_leaves(tree) if isinstance(v, torch.Tensor)]


def _variant(sess, fn, sample) -> Outcome | None:
    """One variant on a sample, without grad: its outputs, and every input after it (an in-place form
    writes its first argument; no other form may write anything), against local torch."""
    call = (sample.input, list(sample.args), dict(sample.kwargs))
    with torch.no_grad():
        local = tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, call)
        torch.manual_seed(0)
        try:
            want = fn(local[0], *local[1], **local[2])
        except Exception:
            return None
        try:
            remote = tree_map(lambda v: _remote(sess.device)(v.detach()) if isinstance(v, torch.Tensor) else
                              _remote(sess.device)(v), call)
            torch.manual_seed(0)
            got = fn(remote[0], *remote[1], **remote[2])
            what = f"{getattr(fn, '__name__', fn)}"
            _compare(got, want, what)
            _compare(_only_tensors(remote), _only_tensors(local), f"{what}: the inputs after it")
        except Exception as exc:
            why = _why_refused(exc)
            return Outcome("refused", why) if why is not None else Outcome("fail", _first_line(exc))
    return Outcome("pass")


def over_samples(samples, one, more=lambda sample: ()) -> tuple[Outcome | None, str, bool]:
    """``one(sample)`` on each sample (then ``more(sample)``'s outcomes): the first outcome that is not a
    pass (or None), the last error of local torch's own (a sample it refuses is skipped), whether any ran."""
    local_error, ran = "it has no CPU samples", False
    for sample in samples:
        outcome = one(sample)
        if outcome.status == "local":
            local_error = outcome.detail
            continue
        ran = True
        for outcome in (outcome, *more(sample)):
            if outcome is not None and outcome.status != "pass":
                return outcome, local_error, ran
    return None, local_error, ran


def run(sess, opinfo) -> Outcome:
    why = _why_refused(NotImplementedError(f"torch.{opinfo.name} is not supported"))
    if why is not None and not opinfo.name.startswith("torch."):  # denied by name (sparse.mm, aten internals)
        return Outcome("refused", why)
    dtype = sample_dtype(opinfo)
    if dtype is None:
        return Outcome("refused", "torch lists no CPU dtype for it")
    requires_grad = opinfo.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
    variants = _variants(opinfo) if opinfo.name not in _UNSET else ()
    outcome, local_error, ran = over_samples(_samples(opinfo, dtype, requires_grad), lambda s: _one(sess, opinfo, s),
                                             lambda s: (_variant(sess, fn, s) for fn in variants))
    if outcome is not None:
        return outcome
    if ran:
        return Outcome("pass")
    if "CUDA" in local_error or "no CPU samples" in local_error:
        return Outcome("refused", f"local torch runs none of its samples on a CPU: {local_error}")
    return Outcome("fail", f"local torch fails with the SDK imported: {local_error}")


class _OnTheServer(torch.autograd.Function):
    """``fn`` computed remotely as one local function: forward on the server, its floating outputs
    downloaded; backward by ``torch.autograd.grad`` on the server. What ``gradcheck`` checks."""

    @staticmethod
    def forward(ctx, sess, fn, *inputs):
        with torch.enable_grad():  # the remote graph is recorded (we run inside a Function's forward)
            remote = [x.detach().to(sess.device).requires_grad_() for x in inputs]
            outs = [o for o in tree_leaves(fn(*remote)) if isinstance(o, torch.Tensor) and o.dtype == torch.float64]
        ctx.sess, ctx.remote, ctx.outs = sess, remote, outs
        local = tuple(o.to_torch().detach() for o in outs)
        # what torch leaves without a graph (batch norm's saved mean) gradcheck leaves out, as on torch's own
        ctx.mark_non_differentiable(*(t for t, o in zip(local, outs) if not o.requires_grad))
        return local

    @staticmethod
    def backward(ctx, *grads):
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if o.requires_grad and g is not None]
        got = torch.autograd.grad([o for o, _ in pairs], ctx.remote, [g.to(ctx.sess.device) for _, g in pairs],
                                  allow_unused=True, retain_graph=True) if pairs else [None] * len(ctx.remote)
        return None, None, *(None if g is None else g.to_torch() for g in got)


def gradcheck(sess, opinfo) -> Outcome:
    """float64 ``gradcheck(fast_mode=True)`` of the op on the server, on its first sample."""
    samples = _samples(opinfo, torch.float64, True)[:1]
    if not samples:
        return Outcome("refused", "no float64 sample")
    sample = samples[0]
    args = (sample.input, list(sample.args), dict(sample.kwargs))
    inputs = _grad_inputs(args)
    if not inputs:
        return Outcome("pass")

    device = _remote(sess.device)

    def on_server(*new):
        it = iter(new)
        a = tree_map(lambda v: next(it) if isinstance(v, torch.Tensor) and v.requires_grad else device(v), args)
        return opinfo.gradcheck_wrapper(opinfo.op, a[0], *a[1], **a[2])  # OpInfo's (a Hermitian input, ...)

    try:
        ok = torch.autograd.gradcheck(lambda *xs: _OnTheServer.apply(sess, on_server, *xs), inputs, fast_mode=True,
                                      check_undefined_grad=False, check_batched_grad=False, raise_exception=True)
    except Exception as exc:
        why = _why_refused(exc)
        return Outcome("refused", why) if why is not None else Outcome("fail", _first_line(exc))
    return Outcome("pass" if ok else "fail")

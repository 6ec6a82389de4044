"""``torch.func`` in a template: per-sample gradients (``vmap(grad(f))``) run by torch's own functorch.

Dynamo inlines ``torch.func.vmap`` and ``grad`` into a flat graph: the client records functorch's calls
as ``functorch`` steps (``proto/SPEC.md`` §4) around ordinary calls. A *region* runs from a
``vmap_enter`` or ``grad_enter`` to its exit (regions nest); a *span*, from an outermost region's
enter to its exit or on to the last step that reads a tensor made in it (``vjp``'s pullback reads the
grad region's graph after it closed). ``Scopes`` finds and checks a template's spans once, when it is
defined (``Template.build``): regions balanced, each tensor step in a region of its kind, and only
calls this module can give to functorch (no other step kind, no entry whose arguments the server checks
by a contract or by their values, no autocast, in place only on a tensor of the span).

``run_region`` runs a span as one step, as torch's ``vmap``/``grad`` would: the nesting levels are the
server's own (``vmap_increment_nesting``/``grad_increment_nesting``, context managers whose exit pops the
interpreter), never the client's traced constants, and every level entered is left before the step
returns or raises (functorch's interpreter stack is per thread: a level left behind would transform
whatever the worker thread runs next). The span's tensors are functorch's wrappers, which the per-step
machinery (the meta check of each call, the byte ledger, plans) cannot read: the span runs first on
meta stand-ins of what it reads (torch's own argument checks and batching rules; its work counted and
held to the step's budget; the bytes of its tensors below the wrappers, as if none were freed before its
end, reserved; ``region_memo``: a run with the layouts of one before takes its answer), then on the real
tensors; only what later steps read is kept, under its names. A grad
region runs without the saved-tensor hooks that count the graph's bytes (functorch refuses them; its
graph dies with the region), so what a span with one keeps may not require grad.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch._functorch.eager_transforms import _autograd_grad, enable_inplace_requires_grad, grad_increment_nesting
from torch._functorch.vmap import vmap_increment_nesting

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import CallStep, FunctorchStep

from .. import ops as _ops
from ..ops._context import CURRENT, RunContext, current
from ..sessions.store import CustomTensor
from . import region_memo, step_cost
from .values import bound, resolve_args, resolve_kwargs, resolve_value, store_made

_ENTERS = {"vmap_enter": "vmap", "grad_enter": "grad"}
_EXITS = {"vmap_exit": "vmap", "grad_exit": "grad"}
_INTO = {"add_batch_dim": "vmap", "wrap_for_grad": "grad"}
_OUT_OF = {"remove_batch_dim": "vmap", "unwrap_for_grad": "grad"}
_META = torch.device("meta")
_GRAD_HOOKS_REFUSED = ("torch.func.{grad, vjp, jacrev, hessian} don't yet support saved tensor hooks. Please open "
                       "an issue with your use case.")


def reads(step: FunctorchStep) -> list[str]:
    """The names a functorch step reads."""
    found = [] if step.id is None else [step.id]
    return found + list(step.outputs) + list(step.inputs) + list(step.grad_outputs or ())


class Scopes:
    """A template's spans of torch.func steps, found and checked as ``Template.build`` reads its steps
    (``step``, then ``finish``); raises the ``ProtocolError`` that ``bad(index, message)`` makes.

    A span runs from a region's enter to its exit, and on to the last step that reads a tensor made
    inside it (``vjp``'s and ``jacrev``'s ``autograd_grad`` reads the grad region's graph after it closed,
    from inside a vmap region: one span then holds both, and the calls between them)."""

    def __init__(self, bad) -> None:
        self.bad = bad
        self.kinds: list[str] = []  # the regions open at the step being read, outermost first
        self.spans: list[list[int]] = []  # [first, last] step of each span
        self.made_in: dict[str, int] = {}  # a name made in a span (and not brought out of it) -> its span
        self.open: int | None = None  # the span the step being read is in
        self.steps: list[tuple] = []  # per step: (the step, the regions open at it, the names it reads, writes)

    def step(self, index: int, step: Any, read: list[str], writes: list[str]) -> None:
        hits = [self.made_in[name] for name in read if name in self.made_in]
        if hits and min(hits) != self.open:  # a tensor of a span read after it: the span goes on to here
            first = min(hits)
            del self.spans[first + 1:]
            self.made_in = {name: min(span, first) for name, span in self.made_in.items()}
            self.open = first
        kind = type(step)
        self.steps.append((step, tuple(self.kinds), read, writes))
        if kind is FunctorchStep and step.fn in _ENTERS:
            if step.fn == "vmap_enter" and (step.batch is None or step.randomness is None):
                raise self.bad(index, "vmap_enter takes batch and randomness")
            if self.open is None:
                self.spans.append([index, index])
                self.open = len(self.spans) - 1
            self.kinds.append(_ENTERS[step.fn])
        elif kind is FunctorchStep and step.fn in _EXITS:
            if not self.kinds or self.kinds[-1] != _EXITS[step.fn]:
                raise self.bad(index, f"functorch {step.fn} closes no {_EXITS[step.fn]} region")
            self.kinds.pop()
        elif kind is FunctorchStep and not self.kinds and not (step.fn == "autograd_grad" and self.open is not None):
            # vjp's pullback is functorch's autograd.grad after its grad region closed: in its span
            raise self.bad(index, f"functorch {step.fn} outside a torch.func region")
        if self.open is not None:
            self.spans[self.open][1] = index
            brought_out = kind is FunctorchStep and step.fn in _OUT_OF and len(self.kinds) == 1
            if not brought_out:
                self.made_in.update((name, self.open) for name in writes)
        if not self.kinds:
            self.open = None

    def finish(self, outputs: list[str]) -> list[tuple[int, int, list[str], list[str]]]:
        """Each span (first step, last step, the names it keeps: those read after it, or outputs; the names
        it reads from outside it), its steps checked."""
        if self.kinds:
            raise self.bad(None, f"a torch.func {self.kinds[-1]} region is never closed")
        found = []
        for first, last in self.spans:
            local: set[str] = set()
            outer: list[str] = []
            for index in range(first, last + 1):
                step, kinds, read, writes = self.steps[index]
                self._check(index, step, kinds, local)
                outer += [name for name in read if name not in local and name not in outer]
                local.update(writes)
            later = {name for _, _, read, _ in self.steps[last + 1:] for name in read} | set(outputs)
            found.append((first, last, [name for name in sorted(local) if name in later], outer))
        return found

    def _check(self, index: int, step: Any, kinds: tuple, local: set[str]) -> None:
        kind = type(step)
        if kind is FunctorchStep:
            fn = step.fn
            if fn in _ENTERS or fn in _EXITS:
                return
            wanted = _INTO.get(fn) or _OUT_OF.get(fn) or ("grad" if fn == "requires_grad" else None)
            if wanted is not None and kinds[-1] != wanted:
                raise self.bad(index, f"functorch {fn} inside a {kinds[-1]} region")
            if fn in _INTO or fn in _OUT_OF or fn == "requires_grad":
                if step.id is None or len(step.out) != (0 if fn == "requires_grad" else 1):
                    raise self.bad(index, f"functorch {fn} takes id and {'no' if fn == 'requires_grad' else 'one'} out")
            if fn in ("add_batch_dim", "remove_batch_dim") and step.dim is None:
                raise self.bad(index, f"functorch {fn} takes dim")
            if fn == "autograd_grad" and (not step.outputs or len(step.out) != len(step.inputs)):
                raise self.bad(index, "functorch autograd_grad takes outputs and one out per input")
            return
        if kind is not CallStep:
            raise self.bad(index, f"a {step.kind} step inside a torch.func region is not supported")
        found = _ops.OP_TABLE.resolve(step.op)
        if found is None:
            return  # Template.build answers it (unknown op)
        why = None
        if found.entry.check is not None:
            why = "an op whose arguments the server checks itself"
        elif step.autocast:
            why = "autocast"
        elif found.inplace and not (found.writes and _target(step) in local):
            why = "an in-place call on a tensor made outside it"
        if why is not None:
            raise self.bad(index, f"{step.op}: {why} inside a torch.func region is not supported")


def _target(step: CallStep) -> str | None:
    first = step.args[0] if step.args else None
    return first.get("ref") if isinstance(first, dict) and len(first) == 1 else None


# -- running one ------------------------------------------------------------------------------


class _Scope:
    """Where a region's steps find tensors (``values.resolve_args`` asks ``tensor(name).value``): its own,
    else the session's (as meta stand-ins on the meta pass)."""

    tensors = MappingProxyType({})  # where ``resolve_args`` looks a name up first: here, none (it asks ``tensor``)

    def __init__(self, session, meta: bool) -> None:
        self.session, self.meta = session, meta
        self.own: dict[str, CustomTensor] = {}
        self.made_bytes = 0  # on the meta pass: what the region's tensors take, as if none were freed

    def tensor(self, name: str) -> CustomTensor:
        ct = self.own.get(name)
        if ct is None:
            ct = self.session.tensor(name)
            if self.meta:
                t = ct.value
                with torch._C._DisableFuncTorch():  # made at no level: under grad() a factory's is a wrapper
                    stand_in = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META,
                                                   requires_grad=t.requires_grad)
                ct = self.own[name] = CustomTensor(stand_in)
        return ct

    def keep(self, names: list[str], values, *, new: bool = True) -> None:
        """``values`` under ``names``; ``new``: they may hold memory of their own (a functorch wrapper holds the
        tensor it wraps: not new)."""
        for name, value in zip(names, values):
            self.own[name] = CustomTensor(value)
            if self.meta and new:
                self.made_bytes += _physical_bytes(value)


def _physical_bytes(t: torch.Tensor) -> int:
    """The bytes of a region's new tensor below functorch's wrappers (a batched one holds the whole batch);
    a view brings none."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return 0 if t._is_view() else t.nelement() * t.element_size()


@dataclass(frozen=True, eq=False)
class Region:
    """An outermost region of a template: what the runner's ``execute`` runs as one step (``run_region``)."""

    steps: tuple  # the template's steps from its enter to its exit
    start: int  # the index of its first step in the template
    out: tuple[str, ...]  # the names it brings out: what it keeps
    reads: tuple[str, ...]  # the names it reads from outside it
    grad: bool  # whether a grad region is in it
    memo: region_memo.RegionMemo = field(default_factory=region_memo.RegionMemo)  # its meta passes' answers
    kind = "functorch"

    @classmethod
    def of(cls, steps: list, first: int, last: int, out: list[str], reads: list[str]) -> "Region":
        region = tuple(steps[first:last + 1])
        return cls(region, first, tuple(out), tuple(reads),
                   any(type(s) is FunctorchStep and s.fn == "grad_enter" for s in region))


def run_region(run, region: Region) -> None:
    """``region`` on meta, then on the session's tensors; what it brings out kept under its names
    (``store_made``: counted and charged)."""
    session = run.session
    key = region_memo.key([session.tensor(name).value for name in region.reads], bound())
    answer = region.memo.get(key)
    if answer is None:  # (``region_memo``: a pass that answered these layouts before answers them again)
        answer = _on_meta(region, session)
        region.memo.put(key, answer)
    step_cost.hold(run, "the torch.func region", answer.flops)
    # what the region holds while it runs (its tensors, counted as if none were freed before its end), before
    # any kernel allocates it; what it keeps is charged from it (``store_made``)
    session.storages.reserve(answer.made_bytes, run.settings.max_session_bytes)
    try:
        real = _Scope(session, meta=False)
        _walk(region, real, run.watch)
        _plain(region, real)
        made = [(name, real.own[name]) for name in region.out]
        if region.grad and any(ct.value.requires_grad for _, ct in made):
            raise ProtocolError(ErrorCode.OP_ERROR, "a torch.func grad region brings out a tensor that requires "
                                "grad: differentiating through torch.func.grad from outside it is not supported")
        store_made(session, run.settings, made)
    finally:
        session.storages.unreserve()


def _on_meta(region: Region, session) -> region_memo.Answer:
    """The span run on meta stand-ins of what it reads: torch's refusal, or its work and bytes."""
    meta = _Scope(session, meta=True)
    token = CURRENT.set(RunContext(torch.Generator(), _META, current().max_elements))
    cost = step_cost.counting()
    try:
        with cost:
            _walk(region, meta, None)
    finally:
        CURRENT.reset(token)
    _plain(region, meta)
    return region_memo.Answer(cost.flops, meta.made_bytes)


def _plain(region: Region, scope: _Scope) -> None:
    """What the span keeps must be plain tensors (a wrapper is functorch's alone, and its level is gone)."""
    for name in region.out:
        if torch._C._functorch.is_functorch_wrapped_tensor(scope.own[name].value):
            raise ProtocolError(ErrorCode.OP_ERROR, f"{name.rsplit('/', 1)[-1]!r} is read after its torch.func "
                                "transform ended, which left it one of the transform's tensors")


def _walk(region: Region, scope: _Scope, watch) -> None:
    """Each step of the region, its levels entered and always left."""
    frames: list[tuple[str, int, int | None, contextlib.ExitStack]] = []
    try:
        for index, step in enumerate(region.steps, region.start):
            if watch is not None:
                watch.check(index, step)
            try:
                _one(step, scope, frames)
            except Exception as exc:  # where in the region: the runner makes it data (``runner._as_protocol_error``)
                raise _located(exc, index, step)
    finally:
        while frames:
            frames.pop()[3].close()


def _located(exc: Exception, index: int, step: Any) -> Exception:
    what = step.op if type(step) is CallStep else f"functorch {step.fn}" if type(step) is FunctorchStep else step.kind
    if isinstance(exc, ProtocolError):
        exc.message = f"at step {index} ({what}): {exc.message}"
    elif len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (f"at step {index} ({what}): {exc.args[0]}",)
    return exc


def _one(step: Any, scope: _Scope, frames: list) -> None:
    if type(step) is FunctorchStep:
        _functorch(step, scope, frames)
        return
    call = _ops.OP_TABLE.resolve(step.op)
    args = resolve_args(step.args, scope)
    kwargs = resolve_kwargs(step.kwargs, scope) if step.kwargs else {}
    fn = getattr(call.fn, "torch_callable", call.fn) if scope.meta else call.fn
    with torch.set_grad_enabled(step.grad_enabled):
        result = fn(*args, **kwargs)
    if call.inplace:  # torch's own in-place op, on a tensor of the span (``Scopes``)
        return
    outputs = [o for o in result if o is not None] if isinstance(result, (tuple, list)) else [result]
    if len(outputs) != len(step.out):
        raise ProtocolError(ErrorCode.OP_ERROR, f"returns {len(outputs)} tensor(s) but out names {len(step.out)}")
    scope.keep(step.out, outputs)


def _functorch(step: FunctorchStep, scope: _Scope, frames: list) -> None:
    fn = step.fn
    if fn in _ENTERS:
        stack = contextlib.ExitStack()
        try:
            if fn == "vmap_enter":
                batch = resolve_value(step.batch, scope)  # a number, or the run's {scalar}
                level = stack.enter_context(vmap_increment_nesting(batch, step.randomness))
            else:
                if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
                    stack.enter_context(_without_saved_hooks())
                level = stack.enter_context(grad_increment_nesting())
                stack.enter_context(torch.autograd.graph.disable_saved_tensors_hooks(_GRAD_HOOKS_REFUSED))
        except BaseException:
            stack.close()
            raise
        frames.append((_ENTERS[fn], level, batch if fn == "vmap_enter" else None, stack))
        return
    if fn in _EXITS:
        frames.pop()[3].close()
        return
    if fn == "autograd_grad":
        value = [scope.tensor(name).value for name in step.outputs]
        inputs = [scope.tensor(name).value for name in step.inputs]
        grad_outputs = None if step.grad_outputs is None else [scope.tensor(name).value for name in step.grad_outputs]
        scope.keep(step.out, _autograd_grad(value, inputs, grad_outputs, retain_graph=step.retain_graph,
                                            create_graph=step.create_graph))
        return
    if fn == "requires_grad":
        with enable_inplace_requires_grad(True):
            scope.tensor(step.id).value.requires_grad_(True)
        return
    _, level, batch, _ = frames[-1]
    t = scope.tensor(step.id).value
    if fn == "add_batch_dim":
        dim = step.dim if step.dim >= 0 else step.dim + t.dim()
        if not 0 <= dim < t.dim() or t.shape[dim] != batch:
            raise ProtocolError(ErrorCode.OP_ERROR, f"vmap: in_dim {step.dim} of a tensor of shape {list(t.shape)}: "
                                f"expected a dim of size {batch} (the region's batch size)")
        value = torch._C._functorch._add_batch_dim(t, dim, level)
    elif fn == "remove_batch_dim":
        if not -t.dim() - 1 <= step.dim <= t.dim():
            raise ProtocolError(ErrorCode.OP_ERROR, f"vmap: out_dim {step.dim} out of range for a result of "
                                f"{t.dim()} dims")
        value = torch._C._functorch._remove_batch_dim(t, level, batch, step.dim % (t.dim() + 1))
    elif fn == "wrap_for_grad":
        value = torch._C._functorch._wrap_for_grad(t, level)
    else:
        value = torch._C._functorch._unwrap_for_grad(t, level)
    scope.keep(step.out, [value], new=False)


@contextlib.contextmanager
def _without_saved_hooks():
    """The program's saved-tensor hooks (``values.counting_saved``) off while a grad region runs, and back after."""
    popped = []
    while torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        popped.append(torch._C._autograd._top_saved_tensors_default_hooks(False))
        torch._C._autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(popped):
            torch._C._autograd._push_saved_tensors_default_hooks(pack, unpack)

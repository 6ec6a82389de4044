"""Every call checked before its kernel runs, on the meta device (DESIGN principle 4).

A CPU kernel trusts its caller; the server must not trust the wire. Before an entry of the op
table runs, ``check_call`` refuses what torch's own checks refuse, without touching memory:

1. the entry's own contract (``OpEntry.check``, ``service/ops/_contracts.py``, ``arg_checks.py``), for
   kernels whose meta kernel is missing or too lax (the fused optimizers): it runs first; it replaces
   the meta run for an entry of our own, and for torch's own where torch has no meta kernel (the
   outputs then bounded by ``output_bound``);
2. a tensor an in-place call writes must not have elements that share memory (torch's rule;
   some kernels trust it too);
3. otherwise the call itself, on meta tensors with the same sizes, strides, offsets and dtypes,
   and the same storage sharing: tensors that share a storage on the server share one meta
   storage of the same size, so ``as_strided`` over a view's base, ``set_`` and aliasing checks
   see what the kernel would see. torch's argument checks run and the outputs' sizes come out.

It answers what the call will take (``Needs``), which the runner holds to the session's limits
before the kernel runs (``runner._call``): the bytes the call will make the session hold in new
storages (an output that views an input's storage is not new; a ``resize_`` that grows its input
counts the growth), charged before the kernel allocates them; its largest output's elements
(``max_tensor_elements``); and its work in FLOPs, counted on meta as it runs
(``step_cost``: ``max_step_flops`` and the program's time left). An entry whose outputs depend on
values (``data_dependent``) is bounded by ``output_bound`` when meta cannot say.

Memoized: a training loop repeats the same calls on the same layouts, so the answer (its
``Needs``, or the refusal's message) is kept per entry and argument metadata: a FLOP count too is
a function of the layouts and the Python arguments. A 0-d tensor is keyed by its
layout like any other: the meta run sees no values, so its answer holds for every value. Only a
call whose meta run had to read a 0-d tensor's value (``_on_meta``'s second try: ``narrow``'s
tensor ``start``) is keyed by those values too, marked ``_BY_VALUE`` under its layouts' key; so
a repeated clipping coefficient (``clip_grad_norm_``'s, a new value every step) neither misses the
memo every step nor is read back to the host to make a key (a sync on a GPU). The plain path is
the meta run itself; ``tests/service/engine/test_meta_check.py`` checks both give the same answers.
"""

from __future__ import annotations

import math
import threading
from typing import Any, NamedTuple

import torch

from remote_autograd.proto import ErrorCode, ProtocolError

from ..ops import OpEntry
from ..ops._context import CURRENT, RunContext, current
from . import step_cost

_META = torch.device("meta")
_MEMO_SIZE = 8192  # distinct (entry, layout) pairs remembered; a full memo starts again
_MEMOS = 8  # states of torch's settings with a memo of their own
_memo: dict[tuple, "Needs | tuple[ErrorCode, str]"] = {}  # what a call needs, or a refusal (its code and message)
_memos: dict[tuple, dict] = {}  # a memo per state of torch's process-global settings (``use_memo``)
memo_state: tuple | None = None  # the state whose memo ``_memo`` is (``use_memo``)
_memo_lock = threading.Lock()
_MISSING = object()
_BY_VALUE = object()  # under a call's layouts' key: its answer read a 0-d tensor's value (keyed by the values too)
_DATA_DEPENDENT = None  # what _on_meta answers when meta cannot say the outputs of a data-dependent entry


class Unhashable(Exception):
    """An argument the memo cannot key (the call is then checked without it)."""


class Needs(NamedTuple):
    """What a call will take, known before its kernel runs."""

    bytes: int  # of its new storages, charged before the kernel allocates them
    flops: float  # its work (``step_cost``), held to the step's budget
    elements: int  # of its largest output, held to max_tensor_elements; 0: only its kernel can say


def check_call(entry: OpEntry, args: list, kwargs: dict, *, inplace: bool, grad_enabled: bool,
               fn: Any = None, writes: bool = False) -> Needs:
    """Refuse (422, torch's message) a call torch would refuse; else what it needs (``Needs``).

    ``inplace``: the call writes its first argument (``x.add_(y)`` runs entry ``add`` in place).
    ``fn``: the callable the call's name resolved to (a spelling of a native entry: ``Tensor.add_``),
    ``writes`` when it is itself torch's in-place op; by default the entry's own.
    """
    return checked(_Call(entry, fn, writes, inplace), args, kwargs, grad_enabled)[0]


def checked(call, args: list, kwargs: dict, grad_enabled: bool) -> tuple[Needs, Any]:
    """``check_call``'s answer for ``call`` (``.entry``, ``.fn``, ``.writes``, ``.inplace``: a call step's
    name as ``OpTable.resolve`` resolved it, the plain path's check), and what the layouts of the arguments
    answered (``_MISSING`` when nothing was asked of them): a replayed plan hands it back to ``check_planned``."""
    entry, fn, inplace = call.entry, call.fn, call.inplace
    if entry.check is not None:
        _run_contract(entry, args, kwargs)
        if not entry.variants:  # our own entry: its contract replaces the meta run (a test op must not run twice)
            return Needs(0, step_cost.touched(args, kwargs), 0), _MISSING
    if inplace:
        _check_written(entry, args)
    try:
        layouts = (entry.name, fn, inplace, grad_enabled, _key_of(args, {}), _key_of(kwargs, {}) if kwargs else None)
    except Unhashable:
        return _answer(_on_meta(call, args, kwargs, inplace)[0], entry, args, kwargs), _MISSING
    key = layouts
    known = _memo.get(key, _MISSING)
    if known is _BY_VALUE:
        key = (layouts, _values(args, kwargs))
        known = _memo.get(key, _MISSING)
    if known is _MISSING:
        known, by_value = _on_meta(call, args, kwargs, inplace)
        with _memo_lock:
            if len(_memo) >= _MEMO_SIZE:
                _memo.clear()
            if by_value and key is layouts:
                _memo[layouts] = _BY_VALUE
                key = (layouts, _values(args, kwargs))
            _memo[key] = known
    # an answer keyed by values holds for those values only: a plan may not reuse it for others
    needs = known if type(known) is Needs else _answer(known, entry, args, kwargs)
    return needs, known if key is layouts else _MISSING


def plannable(known: Any) -> bool:
    """Whether ``known`` (from ``checked``) holds for every call whose arguments have the same
    layouts: a ``Needs`` does; a refusal never reaches a plan, and a data-dependent bound reads values."""
    return type(known) is Needs


def check_planned(entry: OpEntry, args: list, kwargs: dict, *, known: Needs) -> Needs:
    """``check_call`` for a call whose arguments' layouts a replayed plan vouches for
    (``service/engine/program_plan.py``): the entry's contract, which may read values, runs again; what
    looks only at layouts (the meta run, and a written tensor's overlap: its sizes and strides)
    is ``known``, what it answered before."""
    if entry.check is not None:
        _run_contract(entry, args, kwargs)
    return known


def forget() -> None:
    """Empty the memos (tests compare the memoized and the plain path)."""
    global memo_state
    with _memo_lock:
        _memo.clear()
        _memos.clear()
        memo_state = None


def use_memo(state: tuple) -> None:
    """The memo of ``state`` (``proto/torch_globals.py``) from now on: answers depend on it (the default
    dtype makes an integer ``sqrt`` 4 or 8 bytes an element). Called by the runner's ``GlobalsTurns`` while
    no program runs, when ``state`` is not ``memo_state`` already; a server keeps torch's defaults, so
    almost always one memo."""
    global _memo, memo_state
    found = _memos.get(state)
    if found is None:
        if len(_memos) >= _MEMOS:
            _memos.clear()
        found = _memos[state] = {}
    _memo, memo_state = found, state


def _answer(known: Needs | tuple[ErrorCode, str] | None, entry: OpEntry, args: list, kwargs: dict) -> Needs:
    if known is _DATA_DEPENDENT:  # the bound reads the values: never memoized
        return _bound(entry, args, kwargs)
    if type(known) is tuple:
        raise ProtocolError(*known)
    return known


def _run_contract(entry: OpEntry, args: list, kwargs: dict) -> None:
    try:
        entry.check(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ProtocolError(ErrorCode.OP_ERROR, str(exc)) from None


def _check_written(entry: OpEntry, args: list) -> None:
    """torch's rule for in-place writes, checked on the real tensor (meta has no addresses)."""
    targets = args[0] if args and isinstance(args[0], list) else args[:1]
    for t in targets:
        if isinstance(t, torch.Tensor) and torch._debug_has_internal_overlap(t) == 1:
            raise ProtocolError(ErrorCode.OP_ERROR,
                                f"{entry.name}: unsupported operation: more than one element of the written-to "
                                "tensor refers to a single memory location. Please clone() the tensor before "
                                "performing the operation.")


# -- the memo's key: everything about the arguments a kernel's checks can see ---------------------


def _key_of(value: Any, storages: dict[int, int]) -> Any:
    """A hashable picture of ``value``: tensors by layout (shapes, strides, offset, dtype, storage size
    and which arguments share a storage, numbered in ``storages``), Python values with their type (``1``,
    ``1.0`` and ``True`` are equal as keys but not as torch arguments)."""
    if isinstance(value, torch.Tensor):
        return layout(value, storages)
    kind = type(value)
    if kind in (int, float, bool, str) or value is None or value is Ellipsis:
        return kind, value
    if kind in (list, tuple):  # a call's arguments: their tensors' layouts taken here, without a call each
        return kind, tuple([layout(v, storages) if isinstance(v, torch.Tensor) else _key_of(v, storages)
                            for v in value])
    if kind is dict:
        return kind, tuple((k, _key_of(v, storages)) for k, v in value.items())
    if kind is slice:
        return kind, (_key_of(value.start, storages), _key_of(value.stop, storages), _key_of(value.step, storages))
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return kind, value
    raise Unhashable(kind.__name__)


def layout(t: torch.Tensor, slots: dict[int, int]) -> tuple:
    """What a meta check can see of ``t``: its shape, strides, offset, dtype, device, storage size, and
    its storage's number in ``slots`` (which arguments share one). A plan keys its tensors so too."""
    storage = t.untyped_storage()
    slot = slots.setdefault(storage._cdata, len(slots))
    return t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, storage.nbytes(), slot


def _values(args: list, kwargs: dict) -> tuple:
    """The values of the 0-d tensors among the arguments: the rest of the key of a ``_BY_VALUE`` call."""
    return tuple((t.dtype, t.item()) for t in _tensors([args, list(kwargs.values())]) if t.dim() == 0)


# -- the call on meta ------------------------------------------------------------------------------


class _Call:
    """A call of ``entry`` as ``checked`` sees it: the callable it runs (a native entry's spelling) when
    not the entry's own, whether that is torch's in-place op, and whether the call writes its first argument."""

    __slots__ = ("entry", "fn", "writes", "inplace")

    def __init__(self, entry: OpEntry, fn: Any, writes: bool, inplace: bool) -> None:
        self.entry, self.fn, self.writes, self.inplace = entry, fn, writes, inplace


def _on_meta(call: _Call, args: list, kwargs: dict, inplace: bool) -> tuple[Any, bool]:
    """(the answer, whether it read a 0-d tensor's value). The answer: what the call needs, torch's
    refusal (its code and message), or ``_DATA_DEPENDENT`` when meta cannot say a data-dependent
    entry's outputs."""
    entry = call.entry
    by_value = False
    try:
        try:
            return _run_on_meta(call, args, kwargs, inplace, scalars=False), by_value
        except Exception as exc:
            # a kernel (or our entry) read a 0-d tensor's value, which meta cannot give: again with those
            # as CPU copies, as torch lets a 0-d CPU tensor join any device's op (LBFGS's
            # ``p.add_(d, alpha=t)`` with ``t`` a 0-d tensor). Not first: some meta kernels insist that
            # such a scalar be on the other tensors' device (``masked_fill``'s value)
            if not (_reads_values(exc) and _has_scalars(args, kwargs)):
                raise
        by_value = True  # whatever the second run answers depends on those values
        return _run_on_meta(call, args, kwargs, inplace, scalars=True), by_value
    except ProtocolError as exc:  # a limit an entry checks itself (a factory's size)
        return (exc.code, exc.message), by_value
    except NotImplementedError as exc:
        if entry.data_dependent or (entry.check is not None and entry.output_bound is not None):
            return _DATA_DEPENDENT, by_value  # bounded by its values (its contract vouched for the arguments)
        if entry.check is not None:  # a contract of our own vouches for a kernel that makes no new tensor (fused)
            return Needs(0, step_cost.touched(args, kwargs), 0), by_value
        refusal = (f"{entry.name}: torch has no meta kernel for it ({_first_line(exc)}), so its arguments cannot "
                   "be checked before the kernel runs; the server does not run it")
        return (ErrorCode.OP_ERROR, refusal), by_value
    except Exception as exc:  # torch's refusal of the arguments: the kernel must never see them
        if entry.data_dependent and _reads_values(exc):
            return _DATA_DEPENDENT, by_value
        return (ErrorCode.OP_ERROR, _first_line(exc) or type(exc).__name__), by_value


def _run_on_meta(call: _Call, args: list, kwargs: dict, inplace: bool, *, scalars: bool) -> Needs:
    entry = call.entry
    storages: dict[int, torch.UntypedStorage] = {}
    meta_args = [_to_meta(a, storages, scalars) for a in args]
    meta_kwargs = {k: _to_meta(v, storages, scalars) for k, v in kwargs.items()}
    before = {cdata: s.nbytes() for cdata, s in storages.items()}
    # a spelling's torch callable itself, without our wrappers (the session-generator swap, the zero fill)
    fn = getattr(call.fn, "torch_callable", call.fn) if call.fn is not None else entry.meta_fn or entry.fn
    # factories make meta tensors; a generator of its own, so that nothing run on meta (manual_seed)
    # can change the session's
    token = CURRENT.set(RunContext(torch.Generator(), _META, current().max_elements))
    cost = step_cost.counting()  # each aten op the call reaches, charged its work as it runs on meta
    try:
        with torch.no_grad(), cost:  # the kernels' checks are below autograd; autograd's own run with the call
            if inplace and call.writes:  # torch's own in-place spelling (``Tensor.add_``)
                out = fn(*meta_args, **meta_kwargs)
            elif inplace and entry.native_inplace is not None:
                out = entry.native_inplace(*meta_args, **meta_kwargs)
            elif inplace and not entry.inplace:  # ``x.op_(y)`` through ``op``: the result must fit ``x``
                out = fn(*meta_args, **meta_kwargs)
                _fits(entry, meta_args[0], out)
            else:
                out = fn(*meta_args, **meta_kwargs)
    finally:
        CURRENT.reset(token)
    new = _new_bytes(out, storages)
    grown = sum(max(0, s.nbytes() - before[cdata]) for cdata, s in storages.items())
    return Needs(new + grown, cost.flops, max((t.numel() for t in _tensors(out)), default=0))


def _has_scalars(args: list, kwargs: dict) -> bool:
    """A 0-d tensor beside a bigger one (only then do the outputs stay on meta when it is on the CPU)."""
    dims = [t.dim() for t in _tensors([args, list(kwargs.values())])]
    return 0 in dims and any(dims)


def _to_meta(value: Any, storages: dict[int, torch.UntypedStorage], scalars: bool) -> Any:
    if isinstance(value, torch.Tensor):
        if scalars and value.dim() == 0:  # see _on_meta
            return value.detach().to("cpu", copy=True)  # a copy: nothing run here may write the real one
        real = value.untyped_storage()
        storage = storages.get(real._cdata)
        if storage is None:
            storage = storages[real._cdata] = torch.UntypedStorage(real.nbytes(), device=_META)
        meta = torch.empty((0,), dtype=value.dtype, device=_META)
        return meta.set_(storage, value.storage_offset(), value.shape, value.stride())
    if isinstance(value, list):
        return [_to_meta(v, storages, scalars) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_meta(v, storages, scalars) for v in value)
    return value


def _fits(entry: OpEntry, target: torch.Tensor, out: Any) -> None:
    value = out[0] if isinstance(out, (tuple, list)) else out
    if isinstance(value, torch.Tensor) and value.shape != target.shape:
        raise ProtocolError(ErrorCode.OP_ERROR, f"output with shape {list(target.shape)} doesn't match the "
                                                f"broadcast shape {list(value.shape)}")


def _new_bytes(out: Any, inputs: dict[int, torch.UntypedStorage]) -> int:
    """Bytes of the distinct storages among ``out``'s tensors that are none of the inputs'."""
    known = {s._cdata for s in inputs.values()}
    total = 0
    for t in _tensors(out):
        storage = t.untyped_storage()
        if storage._cdata in known:
            continue
        known.add(storage._cdata)
        total += storage.nbytes()
    return total


def _tensors(out: Any):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from _tensors(o)


def _bound(entry: OpEntry, args: list, kwargs: dict) -> Needs:
    """What a data-dependent call's outputs may reach, from its real arguments: their bytes, and the
    elements of its output where its bound is that output's size (``bounds.exact``)."""
    inputs = list(_tensors([args, list(kwargs.values())]))
    if entry.output_bound is not None:
        elements = int(entry.output_bound(*args, **kwargs))
    else:  # every input element once per dimension: nonzero's worst case, and more than masked_select's
        elements = sum(t.numel() * max(1, t.dim()) for t in inputs)
    itemsize = max([8, *(t.element_size() for t in inputs)])
    exact = getattr(entry.output_bound, "exact", False)
    return Needs(math.prod((elements, itemsize)), step_cost.bounded(entry.name, args, kwargs, elements),
                 elements if exact else 0)


def _reads_values(exc: Exception) -> bool:
    """Meta's ways of saying the call needs the tensors' values (torch raises a few kinds for it)."""
    text = str(exc)
    return type(exc).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException") or (
        "meta tensor" in text or "data-dependent" in text or "data dependent" in text
        or "but it's on meta" in text)  # an argument torch reads on the CPU (tensor_split's indices)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().split("\n", 1)[0][:2000]

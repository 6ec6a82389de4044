"""The value fuzz's cases: base calls of every allow-listed op, and their integer arguments made extreme.

A *base call* is a call torch's own databases make (recorded by the surface generator,
``tools/derive_ops/_record.py``: OpInfo samples, ``nn`` modules, optimizers), one of ``extra()``
(forms those miss: packed recurrent calls), or one of ``known()``: the calls issue 31 found crashing
the server, written out with their crashing values. Its *slots* are the places an integer value
sits: an integer tensor, a Python int, a list of ints; a flag (``unsafe=``,
``include_last_offset=``) is a slot too, and so is an integer or flag argument the op's signature
has but the call leaves out (``torch._C`` schemas, or the Python signature). A *case* is a base
call as it is, with one slot changed (``mutations``), or with a flag turned on or off together with
one integer tensor changed.
"""

from __future__ import annotations

import inspect
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

# the values issue 31 names, and what a length or an offset past the data is (``big``: set per call)
EXTREMES = (0, -1, -(1 << 31), 1 << 31, 1 << 62)
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
CALLS_PER_OP = 3  # base calls fuzzed per op: enough for its spellings (functional, in place) and forms


@dataclass
class BaseCall:
    """A call of one allow-listed op: the spelling it is made by (the name a call step uses) and its arguments."""

    op: str  # the entry's name in surface.json
    spelling: str  # the wire name: torch.Tensor.add_ -> Tensor.add_
    args: list
    kwargs: dict
    missing: dict  # name -> "bool" or "int": flags and integers the signature has and the call leaves out

    def slots(self) -> list[tuple[tuple, str]]:
        """(path, kind) of every integer value and flag: kind "tensor", "int", "ints" (a list of ints), "flag"."""
        found: list[tuple[tuple, str]] = []
        for i, a in enumerate(self.args):
            _slots(a, ("args", i), found)
        for k, v in self.kwargs.items():
            _slots(v, ("kwargs", k), found)
        found += [(("kwargs", k), "flag" if kind == "bool" else "int") for k, kind in self.missing.items()]
        return found

    def big(self) -> int:
        """One past the largest tensor of the call: a length, offset or index past every tensor's data."""
        return 1 + max([t.numel() for t in _tensors([self.args, self.kwargs])] or [0])


def _slots(value: Any, path: tuple, found: list) -> None:
    if isinstance(value, bool):
        found.append((path, "flag"))
    elif isinstance(value, int):
        found.append((path, "int"))
    elif isinstance(value, torch.Tensor):
        if value.dtype in INTEGER_DTYPES and value.numel():
            found.append((path, "tensor"))
    elif isinstance(value, (list, tuple)):
        if value and all(type(v) is int for v in value):
            found.append((path, "ints"))
        else:
            for i, v in enumerate(value):
                _slots(v, path + (i,), found)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


# -- mutations: (label, function of the slot's value and the call's ``big``) ----------------------------


def _fits(dtype: torch.dtype, v: int) -> int:
    info = torch.iinfo(dtype)
    return min(max(v, info.min), info.max)


def _tensor_mutations(t: torch.Tensor, big: int) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    """Every element extreme; the last or first one; and changes that keep the values plausible:
    each one more or less, out of order, all of it piled into the first (lengths that sum right but
    do not fit a shape), one element holding the total, ones as many as the total (batch sizes of
    another packing)."""
    values = sorted({_fits(t.dtype, v) for v in (*EXTREMES, big, -big)})
    out: list[tuple[str, Callable]] = [(f"all={v}", lambda x, v=v: torch.full_like(x, v)) for v in values]
    if t.numel() > 1:
        out += [(f"last={v}", lambda x, v=v: _set(x, -1, v)) for v in values]
        out += [(f"first={v}", lambda x, v=v: _set(x, 0, v)) for v in (-1, big)]
        out.append(("reversed", lambda x: x.flip(-1) if x.dim() else x))
        out.append(("piled", lambda x: _set(torch.zeros_like(x), 0, int(x.sum()))))
    out += [("+1", lambda x: x + 1), ("-1", lambda x: x - 1), ("first+1", lambda x: _set(x, 0, int(x.reshape(-1)[0]) + 1)),
            ("+big", lambda x: (x.long() + big).to(x.dtype))]
    if t.dim() == 1:
        total = int(t.sum())
        out.append(("summed", lambda x: x.sum().reshape(1).to(x.dtype)))
        if 0 < total <= 64:
            out.append(("ones", lambda x: torch.ones(int(x.sum()), dtype=x.dtype)))
    return out


def _set(t: torch.Tensor, index: int, v: int) -> torch.Tensor:
    t = t.clone(memory_format=torch.contiguous_format)
    t.view(-1)[index] = _fits(t.dtype, v)
    return t


def _int_mutations(big: int) -> list[tuple[str, Callable]]:
    return [(f"={v}", lambda x, v=v: v) for v in sorted({*EXTREMES, big, -big})]


def _ints_mutations(values: list, big: int) -> list[tuple[str, Callable]]:
    extremes = sorted({*EXTREMES, big, -big})
    out: list[tuple[str, Callable]] = [(f"all={v}", lambda x, v=v: type(x)([v] * len(x))) for v in extremes]
    if len(values) > 1:
        out += [(f"last={v}", lambda x, v=v: type(x)([*x[:-1], v])) for v in extremes]
        out.append(("reversed", lambda x: type(x)(reversed(x))))
    return out


def mutations(call: BaseCall, path: tuple, kind: str) -> list[tuple[str, Callable]]:
    """The changes a slot gets; each a (label, function of its present value)."""
    big = call.big()
    if kind == "flag":
        return [("=True", lambda x: True), ("=False", lambda x: False)]
    if kind == "int":
        return _int_mutations(big)
    value = get(call, path)
    if kind == "ints":
        return _ints_mutations(list(value), big)
    return _tensor_mutations(value, big)


@dataclass(frozen=True)
class Case:
    """One call to make: base call ``call`` (an index into the run's list) with ``changes`` applied."""

    call: int
    changes: tuple[tuple[tuple, str, int], ...]  # (slot path, slot kind, index into its mutations)
    label: str


def cases_of(index: int, call: BaseCall) -> list[Case]:
    """Every case of one base call: the call as it is; each slot's mutations alone; each flag turned on
    (or off) with each change of an integer tensor (an ``unsafe=True`` with lengths past the data).
    None for a call without integers or flags."""
    slots = call.slots()
    if not slots:
        return []  # nothing to make extreme
    out = [Case(index, (), "as recorded")]
    tensor_changes = []
    for path, kind in slots:
        for m, (label, _) in enumerate(mutations(call, path, kind)):
            change = (path, kind, m)
            out.append(Case(index, (change,), f"{describe(path)} {label}"))
            if kind == "tensor":
                tensor_changes.append((change, f"{describe(path)} {label}"))
    for path, kind in slots:
        if kind != "flag":
            continue
        for m, (label, _) in enumerate(mutations(call, path, kind)):
            for change, text in tensor_changes:
                out.append(Case(index, ((path, kind, m), change), f"{describe(path)} {label}, {text}"))
    return out


def describe(path: tuple) -> str:
    where, key, *rest = path
    head = f"arg {key}" if where == "args" else key
    return head + "".join(f"[{i}]" for i in rest)


def get(call: BaseCall, path: tuple) -> Any:
    where, key, *rest = path
    value = call.args[key] if where == "args" else call.kwargs.get(key)
    for i in rest:
        value = value[i]
    return value


def applied(call: BaseCall, case: Case) -> tuple[list, dict]:
    """The arguments of ``case``: fresh copies of the base call's tensors, with its changes made."""
    args, kwargs = _fresh(call.args), _fresh(call.kwargs)
    for path, kind, m in case.changes:
        label, change = mutations(call, path, kind)[m]
        where, key, *rest = path
        holder: Any = args if where == "args" else kwargs
        if rest:
            holder = holder[key]
            for i in rest[:-1]:
                holder = holder[i]
            key = rest[-1]
        present = holder.get(key) if isinstance(holder, dict) else holder[key]
        holder[key] = change(present)
    return args, kwargs


def _fresh(value: Any) -> Any:
    """Copies of the tensors and of the lists holding them (a change must not reach the base call)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):  # a list either way on the wire
        return [_fresh(v) for v in value]
    if isinstance(value, dict):
        return {k: _fresh(v) for k, v in value.items()}
    return value


# -- base calls ------------------------------------------------------------------------------------


def missing_arguments(func: Callable, args: list, kwargs: dict) -> dict[str, str]:
    """Flags and integers of ``func``'s signature that a call with ``args`` and ``kwargs`` leaves out."""
    found: dict[str, str] = {}
    for name, kind, position in _signature_arguments(func):
        if name not in kwargs and position >= len(args) and name != "out":
            found.setdefault(name, kind)
    return found


def _signature_arguments(func: Callable) -> Iterator[tuple[str, str, int]]:
    """(name, "bool" or "int", position) of the arguments with defaults of every form of ``func``."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params is not None:  # a Python function (torch.nn.functional's)
        for position, p in enumerate(params):
            if p.default is inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            kind = _kind_of(p.default, str(p.annotation))
            if kind:
                yield p.name, kind, position
        return
    name = getattr(func, "__name__", "")
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
    except RuntimeError:
        return
    for schema in schemas:
        for position, a in enumerate(schema.arguments):
            if not a.has_default_value():
                continue
            text = str(a.type)
            kind = "bool" if text == "bool" else "int" if text in ("int", "Optional[int]", "SymInt", "List[int]") else ""
            if kind:  # a method's ``self`` is its first argument: a Tensor method's positions are one less
                yield a.name, kind, position - (1 if _is_method(func) else 0)


def _is_method(func: Callable) -> bool:
    return getattr(torch.Tensor, getattr(func, "__name__", ""), None) is func


def _kind_of(default: Any, annotation: str) -> str:
    if isinstance(default, bool) or annotation in ("bool", "<class 'bool'>"):
        return "bool"
    if isinstance(default, int) or "int" in annotation.replace("Tensor", "").replace("float", ""):
        return "int"
    return ""


def recorded(records: dict, surface_ops: dict[str, dict], only: set[str] | None = None) -> list[BaseCall]:
    """Base calls of every op of ``surface_ops`` (``only``: those): per op, its recorded calls that the
    wire can carry, the ones with most integer slots first, one spelling after another."""
    out = []
    for op, spec in sorted(surface_ops.items()):
        if only is not None and op not in only:
            continue
        by_spelling = []
        for name in spec["names"]:
            rec = records.get(name)
            calls = [c for c in (rec.calls if rec else []) if carried(c.args) and carried(c.kwargs)]
            made = [BaseCall(op, name[len("torch."):], list(c.args), dict(c.kwargs),
                             missing_arguments(c.func, list(c.args), dict(c.kwargs))) for c in calls]
            made.sort(key=lambda b: -len(b.slots()))
            if made:
                by_spelling.append(made)
        picked = [c for c in itertools.chain(*itertools.zip_longest(*by_spelling)) if c is not None]
        out += picked[:CALLS_PER_OP]
    return out


def carried(value: Any) -> bool:
    """Whether a call step can carry ``value`` (what ``service/engine/values.resolve_value`` reads)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, slice)) or value is Ellipsis:
        return True
    if isinstance(value, torch.Tensor):
        return value.layout == torch.strided and not value.is_complex() and not value.is_quantized
    if isinstance(value, (list, tuple)):
        return all(carried(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and carried(v) for k, v in value.items())
    return False


def _packed_rnn(op: str, gates: int, bidirectional: bool) -> BaseCall:
    """A packed call of a recurrent op (``nn.LSTM`` on a ``PackedSequence``): two sequences of lengths 2
    and 1 packed as ``batch_sizes`` [2, 1], hidden size 3."""
    g = torch.Generator().manual_seed(0)
    hidden, directions = 3, 2 if bidirectional else 1
    params = [torch.randn(s, generator=g) for _ in range(directions)
              for s in ((gates * hidden, 2), (gates * hidden, hidden), (gates * hidden,), (gates * hidden,))]
    h0 = torch.zeros(directions, 2, hidden)
    hx = [h0, h0.clone()] if op == "lstm" else h0
    return BaseCall(op, op, [torch.randn(3, 2, generator=g), torch.tensor([2, 1]), hx, params, True, 1, 0.0, False,
                             bidirectional], {}, {})


def extra() -> list[BaseCall]:
    """Base calls of forms the databases' first calls miss (their recorded RNN calls are unpacked)."""
    return [_packed_rnn(op, gates, bidirectional) for op, gates in (("lstm", 4), ("gru", 3), ("rnn_tanh", 1),
                                                                    ("rnn_relu", 1)) for bidirectional in (False, True)]


def known() -> list[BaseCall]:
    """The calls issue 31 found crashing the server or reading other tensors' memory, each with values
    that crash torch 2.13's CPU kernels: the fuzz runs them first, and the tests send them to servers."""
    g = torch.Generator().manual_seed(0)
    data = torch.arange(4.0)
    lstm = _packed_rnn("lstm", 4, False)
    lstm.args[1] = torch.tensor([3])  # one step of 3 sequences, where the hidden state holds 2
    return [
        BaseCall("segment_reduce", "segment_reduce", [data, "max"],
                 {"lengths": torch.tensor([60000]), "unsafe": True}, {}),
        BaseCall("segment_reduce", "segment_reduce", [data, "max"],
                 {"offsets": torch.tensor([0, 1 << 62]), "unsafe": True}, {}),
        BaseCall("_pad_packed_sequence", "_pad_packed_sequence", [torch.randn(3, 2, generator=g), torch.tensor([2, -1]),
                                                                  False, 0.0, 0], {}, {}),
        lstm,
        BaseCall("nn.functional.ctc_loss", "nn.functional.ctc_loss",
                 [torch.randn(5, 1, 4, generator=g).log_softmax(2), torch.tensor([[1, 1 << 31]]), torch.tensor([5]),
                  torch.tensor([2])], {}, {}),
        BaseCall("nn.functional.embedding_bag", "nn.functional.embedding_bag",
                 [torch.tensor([1, 2, 3]), torch.randn(10, 3, generator=g), torch.tensor([0, -(1 << 31)])],
                 {"mode": "sum"}, {}),
    ]

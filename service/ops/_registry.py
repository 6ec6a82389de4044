"""The op table: a name -> an entry holding a torch-like function and its facts.

An entry's ``fn`` takes torch-style arguments (tensors, numbers, dims) and either
calls one of our ``torch.autograd.Function``s (or composes other entries), kind
``function``, or is torch's own op with torch's own derivative, kind ``native``: the
allow-list of ``surface.json`` (``surface.py``) and a few entries the SDK needs with
wire arguments of their own (``getitem``). A native entry from the surface has
``variants``: every spelling of the op (``add``, ``Tensor.add``, ``Tensor.add_``,
``Tensor.__radd__``) is a name a call step may use, and runs exactly that torch
callable. The table is the whole server surface: the runner looks names up here and
nowhere else (``OpTable.resolve``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

import torch

from remote_autograd.proto.op_contract import SHAPE_RULES, is_inplace_name

from ._samples import Sample

# How the client infers result metadata without asking the server:
# SHAPE_RULES (proto/op_contract.py): how the client may infer an op's outputs itself

# the entry's facts GET /v1/ops serves where they hold (OpEntry's comments say what each means)
FACTS = ("relayout", "keeps_storage", "floats_keep_layout", "capturable", "cpu_args", "factory", "maybe_view")

# function: our own autograd.Function (custom or hand-written gradient);
# native: torch's own op with torch's own derivative (surface.py)
KINDS = ("function", "native")


@dataclass(frozen=True)
class OpEntry:
    """One op: its function, the torch names routed to it, and what tests may assume."""

    name: str
    fn: Callable[..., Any]
    torch_names: tuple[str, ...]
    samples: tuple[Sample, ...]
    reference: Callable[..., Any] | None
    exact: bool = True
    double_grad: bool = True
    differentiable: bool = True
    shape_rule: str = "meta"
    inplace: bool = False
    no_grad_args: tuple[int | str, ...] = ()  # tensor args never differentiated (positions or names)
    # torch's own in-place kernel (``torch.Tensor.add_``), used for ``op_`` when no graph is
    # recorded (optimizer updates): same result, without an out-of-place value and a copy
    native_inplace: Callable[..., Any] | None = None
    # Facts the engine's speed paths and the SDK read (``GET /v1/ops`` serves them), each written once
    # here: a surface entry's come from ``surface.json`` (probed or declared by the generator,
    # ``tools/derive_ops/_declared.py``), one of our own's from its ``@op``.
    # ``relayout``: an in-place call changes its target's shape or strides (``t_``): the runner calls
    # ``fn``, torch's own in-place op, on the stored tensor itself (a copy back could not change its
    # shape); a plan and a capture take every layout afresh after one.
    relayout: bool = False
    # ``keeps_storage``: an in-place call writes into its target as it is (no storage grown, swapped or
    # resized): the runner counts no byte again after it (``engine/kept_storages.py``)
    keeps_storage: bool = False
    # ``floats_keep_layout``: its Python floats change neither an output's layout nor whether torch
    # accepts the call: a plan keys them by type (``engine/program_plan.py``)
    floats_keep_layout: bool = False
    # ``capturable``: its results follow from its arguments' layouts and values alone, so a capture
    # (a CUDA graph, a compiled template) may replay it (``engine/replayable.py``; a call's randomness,
    # autocast and ``out=`` are the call's to say)
    capturable: bool = False
    # ``cpu_args``: positions of tensor arguments torch takes from the CPU beside the device's (the SDK
    # uploads those on purpose: ``copy_``'s source, CTC's lengths)
    cpu_args: tuple[int, ...] = ()
    # ``factory``: makes a new tensor from no tensor argument (``zeros``: the names are the op
    # contract's ``FACTORIES``, which the SDK's device kernels call by name)
    factory: bool = False
    # ``maybe_view``: a view or a copy depending on its input's strides (``reshape``): the SDK does not
    # know which until the server says
    maybe_view: bool = False
    # What the runner's check before the kernel needs to know (``service/engine/meta_check.py``):
    # ``check``: an argument contract of our own, run on the real arguments, for kernels whose meta
    # kernel is missing or too lax (the CPU fused optimizers trust their callers about list lengths
    # and sizes); it replaces the meta run. A native entry's also checks the values its kernel
    # indexes memory by (``value_checks.py``: lengths, offsets, labels), which meta cannot see. ``data_dependent``: meta may not be able to say the
    # outputs' shapes (``nonzero``, ``masked_select``); their bytes are then bounded by
    # ``output_bound(*args, **kwargs)`` (elements of all outputs together; by default every input
    # element once per dimension, which covers ``nonzero``). ``meta_fn``: what runs on meta when it is
    # not ``fn`` itself (a native entry's torch function, without the session-generator swap).
    check: Callable[..., None] | None = None
    data_dependent: bool = False
    output_bound: Callable[..., int] | None = None
    meta_fn: Callable[..., Any] | None = None
    doc: str = ""
    kind: str = "function"
    # wire name -> the torch callable it runs (``Tensor.add_`` -> torch.Tensor.add_); a surface entry's
    variants: dict[str, Callable[..., Any]] = field(default_factory=dict, compare=False)
    # in-place variants run on a copy of the target, then written in (``index_add_``: an index out of
    # range found midway would leave a half-written tensor; atomic steps, DESIGN principle 3)
    copy_inplace: frozenset[str] = frozenset()
    signature: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.shape_rule not in SHAPE_RULES:
            raise ValueError(f"op {self.name}: shape_rule must be one of {SHAPE_RULES}")
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name}: kind must be one of {KINDS}")
        object.__setattr__(self, "signature", _signature(self.name, self.fn))

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "signature": self.signature,
            "torch_names": list(self.torch_names),
            "exact": self.exact,
            "double_grad": self.double_grad,
            "differentiable": self.differentiable,
            "shape_rule": self.shape_rule,
            "inplace": self.inplace,
            "no_grad_args": list(self.no_grad_args),
            "doc": self.doc,
            "kind": self.kind,
            **({"spelled": True} if self.variants else {}),
            **{fact: list(value) if type(value) is tuple else value
               for fact in FACTS if (value := getattr(self, fact))},  # each only where it holds
        }


def _signature(name: str, fn: Callable[..., Any]) -> str:
    """``name(args)``: Python's signature, or for torch's builtins the first line of their doc."""
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        first = (getattr(fn, "__doc__", None) or "").strip().split("\n", 1)[0]
        start, end = first.find("("), first.rfind(")")
        return f"{name}{first[start:end + 1] if 0 <= start < end else '(*args, **kwargs)'}"


class Resolved(NamedTuple):
    """What a call step's op name runs."""

    entry: OpEntry
    inplace: bool  # the call writes its first argument (and names no new ids)
    fn: Callable[..., Any]  # the callable: ``entry.fn``, or the variant the name spells
    by_copy: bool = False  # a native in-place call computed on a copy, then written in (see ``copy_inplace``)
    writes: bool = False  # ``fn`` itself is in place (else it computes the new value out of place)


class OpTable:
    """Name -> ``OpEntry``. A plain dict underneath: lookups never touch attributes."""

    def __init__(self) -> None:
        self._entries: dict[str, OpEntry] = {}
        self._wires: dict[str, OpEntry] = {}  # a native entry's variant names
        self.resolved: dict[str, Resolved] = {}  # resolve()'s answers for known names (the runner looks here first)

    def add(self, entry: OpEntry) -> OpEntry:
        if entry.name in self._entries:
            raise ValueError(f"op {entry.name!r} is registered twice")
        taken = [w for w in entry.variants if w in self._wires]
        if taken:
            raise ValueError(f"op {entry.name!r}: {taken} already name another op")
        self._entries[entry.name] = entry
        for wire in entry.variants:
            self._wires[wire] = entry
        self.resolved.clear()
        return entry

    def remove(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        for wire in entry.variants if entry is not None else ():
            self._wires.pop(wire, None)
        self.resolved.clear()

    def get(self, name: str) -> OpEntry | None:
        return self._entries.get(name)

    def resolve(self, name: str) -> Resolved | None:
        """What a call of ``name`` runs; None for an unknown name. In order:

        1. a variant's own name: ``Tensor.add_`` runs ``torch.Tensor.add_`` (in place: its name says so);
        2. an entry's name (``straight_through_round``, ``nn.functional.relu``);
        3. a short name: ``view`` is ``Tensor.view``, ``add_`` is ``Tensor.add_``, ``T`` is
           ``Tensor.T.__get__``, ``pad`` is ``nn.functional.pad``, ``vector_norm`` is ``linalg.vector_norm`` (the names of proto/SPEC.md, and of the
           table before it was torch's surface);
        4. ``X_`` for an ``X`` found above without an in-place form of its own: ``X`` computed out
           of place, then written into the first argument (any entry whose result shape is known).

        Remembered per known name (the runner asks once per step); unknown names come from the
        wire and are not remembered, so the memo stays as small as the table.
        """
        found = self.resolved.get(name)
        if found is not None:
            return found
        found = self._plain(name)
        if found is None and name.endswith("_") and not name.startswith("_"):
            base = self._plain(name[:-1])
            if base is not None and not base.inplace and base.entry.shape_rule != "none":
                found = base._replace(inplace=True, by_copy=True)
        if found is not None:
            self.resolved[name] = found
        return found

    def _plain(self, name: str) -> Resolved | None:
        for wire in (name, f"Tensor.{name}", f"Tensor.{name}.__get__", f"nn.functional.{name}", f"linalg.{name}"):
            entry = self._wires.get(wire)
            if entry is not None:
                fn = entry.variants[wire]
                inplace = is_inplace_name(wire) or entry.inplace
                by_copy = wire in entry.copy_inplace
                return Resolved(entry, inplace, fn, by_copy, inplace)
            if wire == name and name in self._entries:
                entry = self._entries[name]
                return Resolved(entry, entry.inplace, entry.fn)
        return None

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)


OP_TABLE = OpTable()


def op(
    name: str,
    *,
    torch_names: Iterable[str] = (),
    samples: Iterable[Sample] = (),
    reference: Callable[..., Any] | None = None,
    exact: bool = True,
    double_grad: bool = True,
    differentiable: bool = True,
    shape_rule: str = "meta",
    inplace: bool = False,
    no_grad_args: tuple[int | str, ...] = (),
    native_inplace: Callable[..., Any] | None = None,
    kind: str = "function",
    relayout: bool = False,
    capturable: bool = False,
    factory: bool = False,
    check: Callable[..., None] | None = None,
    data_dependent: bool = False,
    output_bound: Callable[..., int] | None = None,
    meta_fn: Callable[..., Any] | None = None,
    table: OpTable | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated torch-like function as op ``name``; returns the function unchanged."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        doc = inspect.getdoc(fn) or ""
        (OP_TABLE if table is None else table).add(  # not `table or`: an empty table is falsy
            OpEntry(
                name=name,
                fn=fn,
                torch_names=tuple(torch_names),
                samples=tuple(samples),
                reference=reference,
                exact=exact,
                double_grad=double_grad and exact and differentiable,
                differentiable=differentiable,
                shape_rule=shape_rule,
                inplace=inplace,
                no_grad_args=tuple(no_grad_args),
                native_inplace=native_inplace,
                relayout=relayout,
                capturable=capturable,
                factory=factory,
                check=check,
                data_dependent=data_dependent,
                output_bound=output_bound,
                meta_fn=meta_fn,
                doc=doc.split("\n", 1)[0],
                kind=kind,
            )
        )
        return fn

    return register

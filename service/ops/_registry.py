"""The op table: a name -> an entry holding a torch-like function and its facts.

An entry's ``fn`` takes torch-style arguments (tensors, numbers, dims) and either
calls one of our ``torch.autograd.Function``s (or composes other entries), kind
``function``, or calls torch's own op and keeps torch's own derivative, kind
``native`` (allow-listed by name here, tested by the same samples, gradcheck and
gradgradcheck). The table is the whole server surface: the runner looks names up
here and nowhere else.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ._samples import Sample

# How the client infers result metadata without asking the server:
#   elementwise:       broadcast shapes, torch's type promotion
#   elementwise_float: the same, but integer results become the default float dtype (sqrt, exp, ...)
#   like_input:        the first argument's shape and dtype (normalisations, softmax without dtype=)
#   linear:            input[..., in] x weight[out, in] -> [..., out] (meta for anything unusual)
#   loss:              a 0-d tensor of the input's dtype unless reduction='none' (then meta)
#   meta:              run the torch function on the meta device
#   none:              ask the server (the client flushes and waits)
SHAPE_RULES = ("elementwise", "elementwise_float", "like_input", "linear", "loss", "meta", "none")

# function: our own autograd.Function (custom or hand-written gradient);
# native: torch's own op with torch's own derivative (see _native.py)
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
    # torch's own kernel with ``fn``'s signature (``torch.sqrt``), used instead of ``fn`` when its
    # first argument is a tensor and no graph is recorded (an optimizer's ``sqrt``/``div``): the
    # Function's forward calls exactly this, so the value is the same, without the Function's cost
    native: Callable[..., Any] | None = None
    # the op changes its target's shape or strides in place (``t_``): the runner always calls ``fn``,
    # torch's own in-place op, on the stored tensor itself (a copy back could not change its shape)
    shape_inplace: bool = False
    # What the runner's check before the kernel needs to know (``service/meta_check.py``):
    # ``check``: an argument contract of our own, run on the real arguments, for kernels whose meta
    # kernel is missing or too lax (the CPU fused optimizers trust their callers about list lengths
    # and sizes); it replaces the meta run. ``data_dependent``: meta may not be able to say the
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
    signature: inspect.Signature = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.shape_rule not in SHAPE_RULES:
            raise ValueError(f"op {self.name}: shape_rule must be one of {SHAPE_RULES}")
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name}: kind must be one of {KINDS}")
        object.__setattr__(self, "signature", inspect.signature(self.fn))

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "signature": f"{self.name}{self.signature}",
            "torch_names": list(self.torch_names),
            "exact": self.exact,
            "double_grad": self.double_grad,
            "differentiable": self.differentiable,
            "shape_rule": self.shape_rule,
            "inplace": self.inplace,
            "no_grad_args": list(self.no_grad_args),
            "doc": self.doc,
            "kind": self.kind,
        }


class OpTable:
    """Name -> ``OpEntry``. A plain dict underneath: lookups never touch attributes."""

    def __init__(self) -> None:
        self._entries: dict[str, OpEntry] = {}
        self._calls: dict[str, tuple[OpEntry, bool]] = {}  # resolve()'s answers for known names

    def add(self, entry: OpEntry) -> OpEntry:
        if entry.name in self._entries:
            raise ValueError(f"op {entry.name!r} is registered twice")
        self._entries[entry.name] = entry
        self._calls.clear()
        return entry

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)
        self._calls.clear()

    def get(self, name: str) -> OpEntry | None:
        return self._entries.get(name)

    def resolve(self, name: str) -> tuple[OpEntry, bool] | None:
        """The entry a call of ``name`` runs, and whether in place: ``add_`` runs ``add``, then writes
        (any entry whose result has a known shape); None for an unknown name.

        Remembered per known name (the runner asks once per step); unknown names come from the
        wire and are not remembered, so the memo stays as small as the table.
        """
        found = self._calls.get(name)
        if found is not None:
            return found
        entry = self._entries.get(name)
        if entry is not None:
            found = entry, entry.inplace
        elif name.endswith("_") and not name.startswith("_"):
            entry = self._entries.get(name[:-1])
            if entry is not None and entry.shape_rule != "none":
                found = entry, True
        if found is not None:
            self._calls[name] = found
        return found

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
    native: Callable[..., Any] | None = None,
    kind: str = "function",
    shape_inplace: bool = False,
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
                native=native,
                shape_inplace=shape_inplace,
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

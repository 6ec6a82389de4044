"""torch's own ops, from the committed allow-list ``surface.json``: one native entry each, at import.

``surface.json`` is written by ``python -m tools.derive_ops --write`` from torch's
own databases (OpInfo, what ``torch.nn`` modules and ``torch.optim`` optimizers call) and reviewed
like code. Each of its ops becomes an entry (kind ``native``) whose every spelling is a variant:
``add``, ``Tensor.add``, ``Tensor.add_``, ``Tensor.__radd__`` each run exactly that torch callable,
reached by walking attributes from ``torch`` along the COMMITTED dotted path (never along a name
from the wire: the runner only looks names up in the table).

- Random ops draw from the session's generator (``session_rng``).
- Ops that hand out uninitialised memory (``empty_like``, ``new_empty``) give zeros: memory a
  session receives never shows another's data (under deterministic algorithms, what torch fills it with).
- Data-dependent ops (``nonzero``) carry ``data_dependent`` and their bound (``bounds.py``); ops
  whose meta kernel cannot vouch for their arguments carry a check (``arg_checks.py``), and so do
  ops whose kernel indexes memory by argument values (``value_checks.py``); a packed
  sequence's ``batch_sizes`` go back to the CPU, where torch wants them (``adapters.py``).
- An in-place spelling of an op that takes index tensors runs on a copy of its target, then is
  written in (``copy_inplace``): an index out of range found midway leaves nothing half-written.
- The facts the engine's speed paths and the SDK act on (``relayout``, ``keeps_storage``,
  ``floats_keep_layout``, ``cpu_args``, ``maybe_view``: ``OpEntry``) are the file's, probed or declared
  by the generator; ``capturable`` is every op whose output shapes meta derives.

Entries the table already has by hand (``getitem``, our own Functions) keep their spellings: a
spelling another entry routes is left out here, and an op none of whose spellings is left is skipped.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Callable

import torch

from remote_autograd.proto.op_contract import is_inplace_name

from . import adapters, bounds, value_checks
from ._context import torch_fills_uninitialised
from ._native import draws_nothing, session_rng
from ._registry import OP_TABLE, OpEntry, OpTable

SURFACE_FILE = Path(__file__).with_name("surface.json")


def load() -> dict[str, Any]:
    return json.loads(SURFACE_FILE.read_text())


def walk(path: str) -> Callable[..., Any]:
    """The torch callable a committed dotted path names (``torch.Tensor.add_``)."""
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def in_this_torch(path: str) -> bool:
    """Whether the running torch has ``path``: ``surface.json`` is written on the torch the
    Makefile pins, and a server on another one (a GPU host's own build) serves what it has."""
    try:
        walk(path)
    except AttributeError:
        return False
    return True


def wire_name(path: str) -> str:
    """The name a call step uses for a spelling: the path without ``torch.`` (``Tensor.add_``)."""
    return path[len("torch."):]


def _random(fn: Callable[..., Any], wire: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def drawn(*args, **kwargs):
        if draws_nothing(wire, args, kwargs):  # a dropout of probability 0: no generator to swap in
            return fn(*args, **kwargs)
        with session_rng():
            return fn(*args, **kwargs)
    drawn.torch_callable = getattr(fn, "torch_callable", fn)  # what the meta check runs
    return drawn


def _zeroed(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def zeroed(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not torch_fills_uninitialised():
            with torch.no_grad():
                out.zero_()
        return out
    zeroed.torch_callable = fn
    return zeroed


def _callable(name: str, path: str, spec: dict[str, Any]) -> Callable[..., Any]:
    fn = walk(path)
    if name in adapters.ADAPTERS:
        fn = adapters.ADAPTERS[name](fn)
    if spec.get("uninitialised"):
        fn = _zeroed(fn)
    if spec["random"]:
        fn = _random(fn, wire_name(path))
    return fn


def entry_for(name: str, spec: dict[str, Any], names: list[str]) -> OpEntry:
    """The native entry of one op of the surface, with the spellings ``names`` (the primary first)."""
    variants = {wire_name(p): _callable(name, p, spec) for p in names}
    primary = variants[wire_name(names[0])]
    variants.setdefault(name, primary)  # the entry's own name calls its primary spelling
    relayout = spec.get("relayout", False)  # an op that changes its target's layout runs on the target itself
    copy_inplace = frozenset(w for w in variants if spec.get("index_args") and is_inplace_name(w) and not relayout)
    data_dependent = spec["meta"] == "data_dependent" or name in bounds.BOUNDS  # meta may not say: a bound
    return OpEntry(
        name=name, fn=primary, torch_names=tuple(names), samples=(), reference=walk(names[0]),
        exact=not spec["random"], double_grad=spec["differentiable"] and not spec["random"],
        differentiable=spec["differentiable"],
        shape_rule="none" if spec["meta"] == "missing" or (spec["meta"] == "data_dependent"
                                                           and not spec.get("meta_derives_some")) else "meta",
        inplace=all(is_inplace_name(p) for p in names), kind="native",
        doc=f"torch's own {names[0]} ({', '.join(spec['from'])})",
        data_dependent=data_dependent, output_bound=bounds.BOUNDS.get(name), check=value_checks.check_of(name),
        variants=variants, copy_inplace=copy_inplace, relayout=relayout,
        keeps_storage=spec.get("keeps_storage", False), floats_keep_layout=spec.get("floats_keep_layout", False),
        capturable=not data_dependent,  # its output shapes follow from the layouts
        cpu_args=tuple(spec.get("cpu_args", ())), maybe_view=spec.get("maybe_view", False),
    )


def register(table: OpTable = OP_TABLE, surface: dict[str, Any] | None = None) -> list[str]:
    """Add every op of the surface the table does not already serve; returns the names added."""
    surface = surface or load()
    claimed = {n for e in table for n in e.torch_names}
    taken = {w for e in table for w in e.variants} | set(table.names())  # names a call step already means
    added = []
    for name, spec in surface["ops"].items():
        names = [n for n in spec["names"] if n not in claimed and in_this_torch(n)]
        if not names or name in taken:  # ours by that name: the SDK's factory ``linspace``
            continue
        entry = entry_for(name, spec, names)
        for wire in [w for w in entry.variants if w in taken]:  # another entry's name: theirs
            del entry.variants[wire]
        if not entry.variants:
            continue
        table.add(entry)
        taken |= set(entry.variants) | {name}
        added.append(name)
    return added


register()

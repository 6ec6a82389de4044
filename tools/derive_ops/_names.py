"""Which spellings are one op: the grouping step of the surface generator (``derive.py``).

A spelling is a dotted path from ``torch`` (``torch.Tensor.add_``). Spellings are one entry when
they share a base name by torch's own naming (``torch.add``, ``torch.Tensor.add``, the in-place
``torch.Tensor.add_``; ``torch.functional.split`` is ``torch.split``), when one OpInfo declares them
(its op, method, in-place, operator and alias variants: ``torch.subtract``, ``Tensor.__rsub__``),
when a Python operator OpInfo does not declare gives an op's values (``Tensor.__truediv__``), or when an ``nn.functional`` op's ``torch.X`` / ``Tensor.X`` twin gives the same values on its
samples (``torch.relu``, ``Tensor.relu_`` for ``F.relu``). Variants are derived from the base name
(``X``, ``Tensor.X``, ``Tensor.X_``, ``X_``), kept where torch has them; never listed by hand.

An entry's name is its OpInfo's (``add``, ``nn.functional.relu``, ``linalg.det``) or else its base
name; each spelling is also the name a call step may use (without ``torch.``), see ``surface.py``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable

import torch

from remote_autograd.proto.op_contract import is_inplace_name
from remote_autograd.service.ops.surface import walk

from . import _facts
from ._record import Call, Record, spelling

_NAMESPACES_WITH_TWINS = ("nn.functional.",)


def _exists(name: str) -> bool:
    """A callable torch routes by this very spelling."""
    try:
        obj = walk(name)
    except AttributeError:
        return False
    return callable(obj) and spelling(obj) == name


def _strip_inplace(ns: str, short: str) -> str:
    if short.endswith("_") and not short.endswith("__"):
        base = short[:-1]
        homes = (f"torch.{base}", f"torch.Tensor.{base}") if not ns else (f"torch.{ns}.{base}",)
        if any(_exists(h) for h in homes):
            return base
    return short


def base_name(name: str) -> str:
    """``add`` for ``torch.add``, ``torch.Tensor.add`` and ``torch.Tensor.add_``; ``T`` for
    ``torch.Tensor.T.__get__``; ``nn.functional.relu`` for ``F.relu`` and ``F.relu_``."""
    body = name[len("torch."):]
    if body.startswith("Tensor."):
        rest = body[len("Tensor."):]
        if rest.endswith(".__get__"):
            return rest[: -len(".__get__")]
        return f"Tensor.{rest}" if rest.startswith("__") else _strip_inplace("", rest)
    if body.startswith("functional."):
        body = body[len("functional."):]
    ns, _, short = body.rpartition(".")
    return f"{ns}.{_strip_inplace(ns, short)}" if ns else _strip_inplace("", short)


def derived_variants(base: str) -> list[str]:
    """The spellings torch has for a base name: ``X``, ``Tensor.X``, ``Tensor.X_``, ``X_`` (top level)
    or ``ns.X``, ``ns.X_``."""
    if base.startswith("Tensor.") or base.endswith("_"):
        return []
    ns, _, short = base.rpartition(".")
    if ns:
        candidates = [f"torch.{base}", f"torch.{base}_"]
    else:
        candidates = [f"torch.{short}", f"torch.Tensor.{short}", f"torch.Tensor.{short}_", f"torch.{short}_"]
    return [c for c in candidates if _exists(c)]


@dataclass
class Group:
    names: list[str]
    sources: set[str] = field(default_factory=set)
    opinfos: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)


class _Union:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def _kind(rec: Record) -> str:
    kinds = [_facts.outputs_kind(c) for c in rec.calls]
    for kind in ("tensor", "inplace", "value", "factory"):
        if kind in kinds:
            return kind
    return "failed"


def group(records: dict[str, Record], declared: dict[str, list[str]]) -> tuple[dict[str, Group], set, set]:
    """(entry name -> Group, spellings that return Python values, factory spellings)."""
    ops: dict[str, Record] = {}
    values, factories = set(), set()
    for name, rec in records.items():
        if not name.startswith("torch.") or not _exists(name) and not name.endswith(".__get__"):
            continue
        kind = _kind(rec)
        if kind == "value":
            values.add(name)
        elif kind == "factory":
            factories.add(name)
        else:
            ops[name] = rec
    union = _Union()
    members: set[str] = set(ops)
    for name in list(ops):
        base = base_name(name)
        union.join(name, f"base:{base}")
        for variant in derived_variants(base):
            if variant not in values and variant not in factories:
                members.add(variant)
                union.join(variant, f"base:{base}")
    for opinfo, names in declared.items():
        present = [n for n in names if n in members or (n.startswith("torch.Tensor.__") and _exists(n))]
        for n in present:
            members.add(n)
            union.join(n, f"opinfo:{opinfo}")
    _join_twins(union, members, ops)
    _join_operators(union, members, ops)
    return _assemble(union, members, ops, declared), values, factories


def _join_twins(union: _Union, members: set[str], ops: dict[str, Record]) -> None:
    for name, rec in list(ops.items()):
        base = base_name(name)
        if not base.startswith(_NAMESPACES_WITH_TWINS) or not rec.calls:
            continue
        short = base.rsplit(".", 1)[-1]
        twins = [t for t in derived_variants(short) if t not in members]
        if twins and any(_same_values(walk(f"torch.{base}"), walk(twins[0]), c) for c in _plain_calls(rec.calls)):
            for t in twins:
                members.add(t)
                union.join(t, f"base:{base}")


def _join_operators(union: _Union, members: set[str], ops: dict[str, Record]) -> None:
    """Tensor's Python operators no OpInfo declares (``x / y`` is ``Tensor.__truediv__``): each joins, with
    its reflected and in-place forms, the first top-level function giving the same values on two
    fixed operands (one for a unary operator)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, generator=gen), torch.rand(3, 4, generator=gen) + 1
    functions = sorted(n for n in ops if n.count(".") == 1)
    for op in sorted(n for n in dir(operator) if not n.startswith("_")):
        forward = f"torch.Tensor.__{op}__"
        if forward in members or not _exists(forward):
            continue
        for name in functions:
            if any(_same_values(walk(forward), walk(name), Call(None, operands, {})) for operands in ((a, b), (a,))):
                for form in (forward, f"torch.Tensor.__r{op}__", f"torch.Tensor.__i{op}__"):
                    if _exists(form):
                        members.add(form)
                        union.join(form, name)
                break


def _plain_calls(calls: list[Call]) -> list[Call]:
    """The calls, and each again without keyword arguments that only say "off" (``inplace=False``,
    ``return_indices=False``): ``torch.relu`` takes no ``inplace``."""
    plain = []
    for c in calls:
        kept = {k: v for k, v in c.kwargs.items() if v is not False and v is not None}
        if kept.keys() != c.kwargs.keys():
            plain.append(Call(c.func, c.args, kept))
    return list(calls) + plain


def _same_values(a: Callable, b: Callable, call: Call) -> bool:
    try:
        return _facts._same(_facts._seeded(call, 0, a), _facts._seeded(call, 0, b))
    except Exception:
        return False


def _assemble(union: _Union, members: set[str], ops: dict[str, Record],
              declared: dict[str, list[str]]) -> dict[str, Group]:
    by_root: dict[str, list[str]] = {}
    for name in members:
        by_root.setdefault(union.find(name), []).append(name)
    declaring = {n: o for o, names in declared.items() for n in names}
    groups: dict[str, Group] = {}
    for names in by_root.values():
        recs = [ops[n] for n in sorted(names) if n in ops]
        opinfos = {declaring[n] for n in names if n in declaring} | {o for r in recs for o in r.opinfos}
        entry = _entry_name(names, opinfos)
        if entry in groups:
            entry = base_name(sorted(names)[0])
        primary = _primary(entry, names)
        ordered = [primary] + sorted(n for n in names if n != primary)
        g = Group(ordered, {s for r in recs for s in r.sources}, opinfos)
        for n in ordered:  # the calls of the primary spelling first: the facts are its
            if n in ops:
                g.calls += ops[n].calls
        groups[entry] = g
    return groups


def _entry_name(names: list[str], opinfos: set[str]) -> str:
    """The OpInfo name that is one of the spellings' base names (OpInfo ``sub`` for ``Tensor.__rsub__``,
    not the ``masked.norm`` whose lambda calls ``linalg.vector_norm``), else the plainest base name."""
    bases = {base_name(n) for n in names}
    named = sorted((o for o in opinfos if o in bases and not o.startswith("__")), key=lambda o: (len(o), o))
    if named:
        return named[0]
    return base_name(sorted(names, key=lambda n: (is_inplace_name(n), n.startswith("torch.Tensor."), len(n), n))[0])


def _primary(entry: str, names: list[str]) -> str:
    for candidate in (f"torch.{entry}", f"torch.Tensor.{entry}"):
        if candidate in names:
            return candidate
    return sorted(names, key=lambda n: (is_inplace_name(n), n.startswith("torch.Tensor."), len(n), n))[0]

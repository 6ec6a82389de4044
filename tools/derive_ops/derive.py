"""The surface generator: torch's own op databases -> ``surface.json``, the op table's allow-list.

``python -m tools.derive_ops`` prints a summary of what it derived and whether
the committed file is current; ``--write`` rewrites ``service/ops/surface.json``. A dev tool: it
imports torch's test databases (``expecttest`` must be installed) and runs their samples (a minute).

1. Record (``_record``): what ``op_db``'s OpInfos, ``module_db``'s modules and ``optim_db``'s
   optimizers call, as the SDK would see it.
   Plus ``extra``: a few calls those databases miss (``_record.EXTRA_REASONS``).
2. Group: the spellings of one op form one entry (``_names``): a function, its method, its
   in-place forms and operators, OpInfo's aliases, and an ``nn.functional`` op's ``torch.X`` twin.
3. Probe (``_facts``): random or not, whether meta derives its outputs, ...; and the facts no probe
   can decide, declared by name (``_declared``).
4. Refuse what never runs on the server (``_deny``), with the reason, and write the file:
   per entry its provenance, every spelling (the torch callable's dotted path, which the server walks
   from ``torch`` at import and the SDK routes by) and the facts.
"""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any

import torch

from remote_autograd.service.ops.surface import SURFACE_FILE, walk

from . import _declared, _deny, _facts, _names, _record

FACT_CALLS = 8  # recorded calls an entry's facts are probed on


def derive() -> dict[str, Any]:
    """The surface as ``surface.json`` holds it."""
    warnings.filterwarnings("ignore")
    records: dict[str, _record.Record] = {}
    opinfos = _record.record_op_db(records)
    _record.record_module_db(records)
    _record.record_optim(records)
    _record.record_extras(records)
    ops, refused, values, factories = _entries(records, opinfos)
    if _declared.unknown(ops):
        raise SystemExit(f"_declared.py names ops the surface has not: {_declared.unknown(ops)}")
    torch.manual_seed(0)
    return {"torch": torch.__version__.split("+")[0], "ops": ops, "refused": refused, "deny": _deny.DENY,
            "values": sorted(values), "factories": sorted(factories)}


def derive_opinfos(names: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ops, refused) derived from these OpInfos alone: what a test can afford to redo (the other
    sources add spellings and calls, so an entry's names here are a part of the committed ones)."""
    warnings.filterwarnings("ignore")
    records: dict[str, _record.Record] = {}
    opinfos = _record.record_op_db(records, only=names)
    ops, refused, _, _ = _entries(records, opinfos)
    torch.manual_seed(0)
    return ops, refused


def _entries(records, opinfos):
    groups, values, factories = _names.group(records, opinfos)
    ops, refused = {}, {}
    for name, group in sorted(groups.items()):
        for spelling in [n for n in group.names if _deny.denied(n)]:
            group.names.remove(spelling)
        if not group.names:
            continue
        facts = _probe(name, group)
        reason = _deny.refusal(name, _facts.runs(group.calls), facts)
        if reason:
            refused[name] = {"names": group.names, "why": reason}
        else:
            ops[name] = {"from": sorted(group.sources), **({"opinfo": sorted(group.opinfos)} if group.opinfos else {}),
                         "names": group.names, **facts}
    return ops, refused, values, factories


def _probe(name: str, group: _names.Group) -> dict[str, Any]:
    calls = group.calls[:FACT_CALLS]
    random, uninitialised = _facts.randomness(calls)
    facts: dict[str, Any] = {
        **_facts.meta_facts(calls),
        "random": random,
        "differentiable": _facts.differentiable(calls),
    }
    if random:
        facts["generator"] = _facts.takes_generator(calls)
    if uninitialised:
        facts["uninitialised"] = True
    if _facts.index_args(calls):
        facts["index_args"] = True
    inplace = [n for n in group.names if _names.is_inplace_name(n)]
    relayout = any(_facts.changes_layout(walk(n), calls) for n in inplace)
    return {**facts, **_declared.facts(name, bool(inplace), relayout)}


def dumps(surface: dict[str, Any]) -> str:
    """The file's text: one entry per line, keys sorted, so a change reviews as a line diff."""
    lines = ["{", f'"torch": {json.dumps(surface["torch"])},']
    for section in ("ops", "refused", "deny"):
        items = sorted(surface[section].items())
        lines.append(f'"{section}": {{')
        lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}{',' if i < len(items) - 1 else ''}"
                  for i, (k, v) in enumerate(items)]
        lines.append("},")
    lines.append(f'"values": {json.dumps(surface["values"])},')
    lines.append(f'"factories": {json.dumps(surface["factories"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.derive_ops")
    parser.add_argument("--write", action="store_true", help=f"rewrite {SURFACE_FILE.name}")
    args = parser.parse_args(argv)
    text = dumps(derive())
    surface = json.loads(text)
    print(f"{len(surface['ops'])} ops ({sum(len(o['names']) for o in surface['ops'].values())} spellings), "
          f"{len(surface['refused'])} refused, {len(surface['values'])} Python-value calls, "
          f"{len(surface['factories'])} factories")
    current = SURFACE_FILE.exists() and SURFACE_FILE.read_text() == text
    if args.write:
        SURFACE_FILE.write_text(text)
        print(f"wrote {SURFACE_FILE}")
    else:
        print(f"{SURFACE_FILE.name} is {'current' if current else 'stale: run with --write'}")
    return 0 if current or args.write else 1

"""The op-coverage table of ``docs/ops.md``, generated from the op table and ``surface.json``.

``python -m remote_autograd.service.ops.coverage`` prints it; ``--write docs/ops.md`` replaces the
block between the coverage markers (``tests/e2e/test_docs.py`` checks the file is current). The
blocks of the OpInfo and module_db round trips are written by ``tests/ops/db_report.py``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from . import surface
from ._registry import OP_TABLE

BEGIN, END = "<!-- op-coverage:begin -->", "<!-- op-coverage:end -->"


def _names(torch_names: tuple[str, ...]) -> str:
    short = [n.replace("torch.nn.functional.", "F.").replace("torch.Tensor.", "Tensor.") for n in torch_names]
    return ", ".join(f"`{n}`" for n in short) or "(by name: `sess.ops.<name>`)"


def _facts(entry, spec: dict | None) -> str:
    if spec is None:
        return "-"
    facts = [f for f, on in (("random", spec["random"]), ("data-dependent", entry.data_dependent),
                             ("zero-filled", spec.get("uninitialised")), ("checked", entry.check is not None),
                             ("meta on some calls", spec.get("meta_partial"))) if on]
    return ", ".join(facts) or "-"


def coverage_markdown() -> str:
    ops = surface.load()
    entries = [e for e in OP_TABLE if not e.name.startswith("_test")]  # test-only ops: service/ops/testing_ops.py
    native = [e for e in entries if e.variants]
    lines = [
        f"{len(entries)} ops: {len(native)} are torch's own from `surface.json` (kind `native`, torch's own "
        f"derivative; {sum(len(e.torch_names) for e in native)} spellings), {len(entries) - len(native)} are "
        "entries of our own (custom gradients, the SDK's factories and session ops, indexing). from: where the "
        "generator found the op (`op_db`: an OpInfo, `module_db`: called by an nn module, `optim`: by an optimizer "
        "or the training loop's utilities, `extra`: a call the databases miss); grad: `exact`, `custom` (not exact "
        "by design) or `-` (none).",
        "",
        "| op | spellings routed | from | grad | facts | kind |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for entry in sorted(entries, key=lambda e: e.name):
        spec = ops["ops"].get(entry.name) if entry.variants else None
        grad = "-" if not entry.differentiable else ("exact" if entry.exact else "custom")
        origin = ", ".join(spec["from"]) if spec else "ours"
        lines.append(f"| `{entry.name}` | {_names(entry.torch_names)} | {origin} | {grad} | {_facts(entry, spec)} "
                     f"| {entry.kind} |")
    lines += ["", f"Refused ({len(ops['refused'])}), by the generator:", "", "| op | spellings | why |",
              "| --- | --- | --- |"]
    lines += [f"| `{name}` | {_names(tuple(op['names']))} | {op['why']} |" for name, op in sorted(ops["refused"].items())]
    lines += ["", "Denied by name (`surface.json`'s deny list):", "", "| spelling | why |", "| --- | --- |"]
    lines += [f"| `{pattern}` | {why} |" for pattern, why in sorted(ops["deny"].items())]
    return "\n".join(lines)


def replace_block(text: str, table: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m remote_autograd.service.ops.coverage")
    parser.add_argument("--write", type=Path, help="rewrite the table block in this file (docs/ops.md)")
    args = parser.parse_args()
    table = coverage_markdown()
    if args.write:
        args.write.write_text(replace_block(args.write.read_text(), table))
    else:
        print(table)


if __name__ == "__main__":
    main()

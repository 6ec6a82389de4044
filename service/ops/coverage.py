"""The op-coverage table of ``docs/ops.md``, generated from the op table.

``python -m remote_autograd.service.ops.coverage`` prints it; ``--write docs/ops.md`` replaces the
block between the coverage markers (``tests/e2e/test_docs.py`` checks the file is current).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from . import OP_TABLE

BEGIN, END = "<!-- op-coverage:begin -->", "<!-- op-coverage:end -->"


def _names(torch_names: tuple[str, ...]) -> str:
    short = [n.replace("torch.nn.functional.", "F.").replace("torch.Tensor.", "Tensor.") for n in torch_names]
    return ", ".join(f"`{n}`" for n in short) or "(by name: `sess.ops.<name>`)"


def coverage_markdown() -> str:
    lines = [
        f"{len([e for e in OP_TABLE if not e.name.startswith('_test')])} ops. grad: exact gradient "
        "(gradcheck-tested), `custom` (not exact by design), or `-` (no gradient); "
        "double: twice differentiable (gradgradcheck-tested); kind: `native` is torch's own op with torch's "
        "own derivative, `function` our own autograd.Function.",
        "",
        "| op | torch names routed | grad | double | kind |",
        "| --- | --- | --- | --- | --- |",
    ]
    for entry in sorted(OP_TABLE, key=lambda e: e.name):
        if entry.name.startswith("_test"):  # test-only ops (service/testing_ops.py)
            continue
        grad = "-" if not entry.differentiable else ("exact" if entry.exact else "custom")
        double = "yes" if entry.double_grad else "-"
        lines.append(f"| `{entry.name}` | {_names(entry.torch_names)} | {grad} | {double} | {entry.kind} |")
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

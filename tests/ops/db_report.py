"""The torch-database sections of docs/ops.md: how every OpInfo of ``op_db`` and every module of
``module_db`` fares through the SDK.

``python -m tests.ops.db_report --write docs/ops.md`` runs every case of ``opinfo_cases`` and
``module_cases`` on an in-process server and rewrites the blocks between the markers;
``test_opinfo_remote.py`` and ``test_module_db_remote.py`` hold each case to the outcome written
there (a fixed failure makes its test fail until the report is refreshed). ``CAUSES`` explains
failures whose error alone does not say why.
"""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path

import torch

BLOCKS = {"opinfo": ("<!-- opinfo:begin -->", "<!-- opinfo:end -->"),
          "module_db": ("<!-- module-db:begin -->", "<!-- module-db:end -->")}
GRADCHECK_EVERY = 3  # gradcheck runs on every third OpInfo that supports float64 autograd (time)

# error text -> what it means
CAUSES = {
    "get_rng_state": "the remote device module has no get_rng_state, which torch.testing's freeze_rng_state "
                     "(every random OpInfo's wrapper) asks of the current accelerator (issue 20, item 4)",
    "Could not run 'aten::": "a factory with no kernel for the remote device (client/handlers/_kernels.py)",
    "reached a remote tensor below torch's functions": "a factory with no kernel for the remote device "
                                                       "(client/handlers/_kernels.py)",
    "doesn't match the broadcast shape": "torch's CPU kernel resizes the target of this in-place call; its meta "
                                         "kernel, which checks every call first, refuses it (loudly)",
    "torch.linspace is not supported": "torch.linspace with tensor endpoints: the table's linspace is the SDK's "
                                       "factory, which takes numbers",
    "_VariableFunctionsClass": "torch.meshgrid of a list calls a builtin the SDK cannot name",
    "requires_grad=True, torch's False": "the SDK predicts that every floating output of an op with an input that "
                                         "requires grad requires grad; torch marks this output non-differentiable "
                                         "(client-side metadata: client/_core.py)",
}


def key(opinfo) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def gradchecked(opinfo) -> bool:
    return opinfo.supports_autograd and torch.float64 in opinfo.supported_dtypes("cpu")


def gradcheck_keys(op_db) -> set[str]:
    return {key(o) for o in [o for o in op_db if gradchecked(o)][::GRADCHECK_EVERY]}


def cause(detail: str) -> str:
    for text, why in CAUSES.items():
        if text in detail:
            return f"{why} ({detail[:160]})"
    return detail


def parse(text: str, block: str = "opinfo") -> dict[tuple[str, str], tuple[str, str]]:
    """(case name, ``""`` or ``"gradcheck"``) -> (outcome, why) for the cases the report lists (every
    other one passes)."""
    begin, end = BLOCKS[block]
    block = text.split(begin, 1)[1].split(end, 1)[0] if begin in text else ""
    rows = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            what, _, status = cells[1].rpartition(" ")
            rows[cells[0].strip("`"), what] = (status, cells[2])
    return rows


def _counts(outcomes: dict) -> dict[str, int]:
    return {s: sum(1 for o in outcomes.values() if o.status == s) for s in ("pass", "refused", "fail")}


def _rows(outcomes: dict, gradchecks: dict, head: str) -> list[str]:
    lines = ["", f"| {head} | outcome | why |", "| --- | --- | --- |"]
    for name in sorted(outcomes):
        for what, outcome in (("", outcomes[name]), ("gradcheck ", gradchecks.get(name))):
            if outcome is not None and outcome.status != "pass":
                why = outcome.detail if outcome.status == "refused" else cause(outcome.detail)
                lines.append(f"| `{name}` | {what}{outcome.status} | {why.replace('|', '/')} |")
    return lines


def module_markdown(outcomes: dict) -> str:
    counts = _counts(outcomes)
    return "\n".join([
        f"{len(outcomes)} modules of torch's `module_db`, each built from its first two samples, moved with "
        "`module.to(device)` and run in training mode against a local copy (outputs, buffers after forward, "
        f"input and parameter gradients): **{counts['pass']} pass, {counts['refused']} are refused on purpose, "
        f"{counts['fail']} fail**.", *_rows(outcomes, {}, "module")])


def markdown(outcomes: dict, gradchecks: dict) -> str:
    counts, grad_counts = _counts(outcomes), _counts(gradchecks)
    lines = [
        f"{len(outcomes)} OpInfo entries of torch {torch.__version__.split('+')[0]}'s `op_db`, each on its first two "
        "samples (float32 where the op takes it) through the SDK against local torch, values and gradients: "
        f"**{counts['pass']} pass, {counts['refused']} are refused on purpose, {counts['fail']} fail**. "
        f"A float64 `gradcheck(fast_mode=True)` of the op computed on the server, on every "
        f"{GRADCHECK_EVERY}rd OpInfo with float64 autograd: {grad_counts['pass']} pass, "
        f"{grad_counts['refused']} refused, {grad_counts['fail']} fail.",
        *_rows(outcomes, gradchecks, "OpInfo"),
    ]
    return "\n".join(lines)


def run_all() -> dict[str, str]:
    """block -> its markdown, every case run."""
    from remote_autograd import client
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    from . import module_cases, opinfo_cases

    outcomes, gradchecks, modules = {}, {}, {}
    checked = gradcheck_keys(op_db)
    with client.connect(transport=client.InProcessTransport()) as sess:
        for opinfo in op_db:
            outcomes[key(opinfo)] = opinfo_cases.run(sess, opinfo)
            if key(opinfo) in checked:
                torch.manual_seed(0)
                gradchecks[key(opinfo)] = opinfo_cases.gradcheck(sess, opinfo)
        for info in module_db:
            modules[info.name] = module_cases.run(sess, info)
    return {"opinfo": markdown(outcomes, gradchecks), "module_db": module_markdown(modules)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.ops.db_report")
    parser.add_argument("--write", type=Path, help="rewrite the blocks of this file (docs/ops.md)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    tables = run_all()
    if not args.write:
        print("\n\n".join(tables.values()))
        return
    text = args.write.read_text()
    for block, table in tables.items():
        begin, end = BLOCKS[block]
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _: f"{begin}\n{table}\n{end}", text)
    args.write.write_text(text)


if __name__ == "__main__":
    main()

"""The value fuzz: every allow-listed op called with extreme integer values, each case in a forked child.

    python -m tests.fuzz.values               # the whole allow-list: a summary; is the committed result current?
    python -m tests.fuzz.values --write       # ... and write it (service/ops/value_fuzz.json)
    python -m tests.fuzz.values --ops segment_reduce,lstm --show   # some ops, every case printed
    python -m tests.fuzz.values --known       # the calls issue 31 found crashing, with their values

Meta sees shapes, not values (``service/engine/meta_check.py``): a kernel that indexes memory by the
values of its integer arguments (lengths, offsets, batch sizes, labels) reads or writes wherever
they point. This finds such kernels by machine. Every op of ``surface.json`` gets the calls torch's
own databases make of it (``_calls.recorded``, and ``_calls.extra``/``known``), and each integer value
and flag of those calls is made extreme in turn (``_calls.mutations``: 0, -1, -2^31, 2^31, 2^62, one
past the data, out of order, ...); each case runs through the server's own path in a forked child
(``_child``, ``_fork``) and its outcome is one of

- ``ok`` / ``refused``: answered 200 / 4xx (torch's own check, or ours),
- ``crash``: the child died (a signal),
- ``read``: an output holds the canaries' pattern, two runs of the case differ (memory outside the
  arguments shows through), or the session holds a view past its storage,
- ``leak``: an error message with an address in it, or differing between the two runs,
- ``unexpected``: the runner met an exception it did not expect,
- ``slow``: no answer in ``_fork.CASE_SECONDS`` (killed): a step's cost, the per-step budget's to
  bound (issue 31 item 4), not memory.

``crash``, ``read``, ``leak`` and ``unexpected`` are *findings*: memory a value reached. Each op with
a value check (``service/ops/value_checks.py``) is fuzzed twice, with and without it, so the result
says what the check stops. The committed result (``--write``: ``service/ops/value_fuzz.json``, one
line per op of ``surface.json``) says per op how many cases ran (none: no integer or flag in its
calls), their outcomes now, what they were without its check, and examples of each finding and of
``slow`` cases; ``tests/ops/test_value_fuzz.py`` holds it to the table: every op accounted for, no
finding left, written on the torch ``surface.json`` was. Re-run it on every torch upgrade, after
``python -m tools.derive_ops --write`` (``docs/ops.md``): about 20 minutes on two
busy cores (``--jobs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from remote_autograd.service.ops import OP_TABLE, surface, value_checks

from . import _calls, _child, _fork

RESULT = surface.SURFACE_FILE.with_name("value_fuzz.json")
FINDINGS = ("crash", "read", "leak", "unexpected")  # memory safety: a value check's or a deny's to cover
EXAMPLES = 3  # per op and kind of finding


def record_calls(only: set[str] | None = None) -> list[_calls.BaseCall]:
    """The base calls of every op of ``surface.json`` (``only``: those ops), recorded from torch's
    databases as the surface generator records them (half a minute for all of them)."""
    from tools.derive_ops import _record

    warnings.filterwarnings("ignore")
    records: dict = {}
    ops = surface.load()["ops"]
    opinfos = None if only is None else {o for name in only for o in ops.get(name, {}).get("opinfo", [])}
    _record.record_op_db(records, only=opinfos)
    if only is None or any("module_db" in ops.get(n, {}).get("from", ()) or "optim" in ops.get(n, {}).get("from", ())
                           for n in only):
        _record.record_module_db(records)
        _record.record_optim(records)
    _record.record_extras(records)
    made = [*_calls.known(), *_calls.extra()]
    return [c for c in made if only is None or c.op in only] + _calls.recorded(records, ops, only)


def fuzz(calls: list[_calls.BaseCall], *, checks: bool = True, jobs: int = 2, show: bool = False,
         as_recorded: bool = False) -> list[dict[str, Any]]:
    """Every case of ``calls`` (``as_recorded``: only each call as it is), each run twice in a forked
    child: one record per case (op, spelling, label, outcome, and status, code and message where there
    was an answer). ``checks``: with the value checks of ``service/ops/value_checks.py``, or without
    them (what they stop)."""
    torch.set_num_threads(1)  # the same bits every run, and no thread pool for a child to inherit
    cases = [case for i, call in enumerate(calls) for case in _calls.cases_of(i, call)
             if not as_recorded or not case.changes]
    differentiable = {name: spec["differentiable"] for name, spec in surface.load()["ops"].items()}
    entries = {e.name: e for e in OP_TABLE}

    def one(index: int) -> dict:
        case = cases[index]
        call = calls[case.call]
        if not checks and call.op in value_checks.VALUE_CHECKS:  # the child's own table: the parent's is untouched
            object.__setattr__(entries[call.op], "check", value_checks.check_of(call.op, values=False))
        try:
            runs = [_child.run(call, case, differentiable.get(call.op, False), p) for p in _child.PATTERNS]
        except Exception:
            return {"outcome": "harness", "detail": traceback.format_exc(limit=3)[-600:]}
        return classify(*runs)

    units: dict[str, list[int]] = {}
    for index, case in enumerate(cases):
        units.setdefault(calls[case.call].op, []).append(index)

    def progress(index: int, answer: dict) -> None:
        if show or answer["outcome"] in FINDINGS + ("harness",):
            call = calls[cases[index].call]
            print(f"  {call.spelling}: {cases[index].label}: {_line(answer)}", flush=True)

    answers = _fork.run_all(list(units.values()), one, jobs, progress)
    return [{"op": calls[c.call].op, "spelling": calls[c.call].spelling, "label": c.label, **answers[i]}
            for i, c in enumerate(cases)]


def classify(a: dict, b: dict) -> dict[str, Any]:
    """One case's outcome from its two runs (two canary patterns)."""
    out = {k: a[k] for k in ("status", "code", "message") if k in a}
    if a.get("backward"):
        out["backward"] = a["backward"]["status"]
    messages = [r.get("message", "") + str((r.get("backward") or {}).get("message", "")) for r in (a, b)]
    if a.get("unexpected"):
        return {**out, "outcome": "unexpected", "detail": a["unexpected"]}
    if a.get("past") or b.get("past"):
        return {**out, "outcome": "read", "detail": f"the session holds a view past its storage: {a.get('past') or b['past']}"}
    if a["pattern"] or b["pattern"]:
        return {**out, "outcome": "read", "detail": "an output holds the canaries' pattern"}
    if a["digest"] != b["digest"]:
        return {**out, "outcome": "read", "detail": "two runs of the same call gave different outputs"}
    if any(_child.ADDRESS.search(m) for m in messages):
        return {**out, "outcome": "leak", "detail": "an address in the error message"}
    if messages[0] != messages[1] or a["status"] != b["status"]:
        return {**out, "outcome": "leak", "detail": f"the error message differs between two runs: {messages[1][:200]}"}
    return {**out, "outcome": "ok" if a["status"] == 200 else "refused"}


def _line(answer: dict) -> str:
    detail = answer.get("detail") or answer.get("message") or ""
    return f"{answer['outcome']} {answer.get('status', '')} {detail[:160]}".replace("\n", " ")


# -- the committed result --------------------------------------------------------------------------


def summary(now: list[dict], without: list[dict], ops: dict[str, dict]) -> dict[str, Any]:
    """The committed result: per op of ``surface.json``, its cases' outcomes now and without its value check."""
    by_op: dict[str, dict] = {}
    for name in sorted(ops):
        records = [r for r in now if r["op"] == name]
        if not records:
            by_op[name] = {"cases": 0}
            continue
        item: dict[str, Any] = {"cases": len(records), "outcomes": _counts(records)}
        if name in value_checks.VALUE_CHECKS:
            item["check"] = value_checks.VALUE_CHECKS[name].__name__
            before = [r for r in without if r["op"] == name]
            item["without_check"] = _counts(before)
            item["found"] = _examples(before)
        elif _findings(records):
            item["found"] = _examples(records)
        slow = [r for r in records if r["outcome"] == "slow"]
        if slow:
            item["slow"] = _examples(slow, ("slow",))
        by_op[name] = item
    return {"torch": torch.__version__.split("+")[0], "ops": by_op}


def _counts(records: list[dict]) -> dict[str, int]:
    return dict(sorted(Counter(r["outcome"] for r in records).items()))


def _findings(records: list[dict], kinds: tuple[str, ...] = FINDINGS) -> list[dict]:
    return [r for r in records if r["outcome"] in kinds]


def _examples(records: list[dict], kinds: tuple[str, ...] = FINDINGS) -> list[str]:
    out, per_kind = [], Counter()
    for r in _findings(records, kinds):
        alone = "" if r.get("alone", True) else " (only after earlier cases: a heap they wrote)"
        text = f"{r['spelling']} {r['label']}: {r['outcome']} ({r.get('detail', '')[:120]}){alone}"
        if per_kind[r["outcome"]] < EXAMPLES and text not in out:
            per_kind[r["outcome"]] += 1
            out.append(text)
    return out


def dumps(result: dict[str, Any]) -> str:
    """One op a line, keys sorted: a change reviews as a line diff (as ``surface.json``)."""
    items = sorted(result["ops"].items())
    lines = ["{", f'"torch": {json.dumps(result["torch"])},', '"ops": {']
    lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}{',' if i < len(items) - 1 else ''}"
              for i, (k, v) in enumerate(items)]
    lines += ["}", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.values", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {RESULT.name} (the whole allow-list only)")
    parser.add_argument("--ops", help="comma-separated op names of surface.json (default: all)")
    parser.add_argument("--known", action="store_true", help="only the calls issue 31 found crashing")
    parser.add_argument("--without-checks", action="store_true", help="the value checks off (what they stop)")
    parser.add_argument("--show", action="store_true", help="print every case, not only findings")
    parser.add_argument("--jobs", type=int, default=2, help="children at a time (default 2)")
    args = parser.parse_args(argv)
    began = time.monotonic()
    only = set(args.ops.split(",")) if args.ops else None
    calls = _calls.known() if args.known else record_calls(only)
    print(f"{len(calls)} base calls of {len({c.op for c in calls})} ops, "
          f"{sum(len(_calls.cases_of(i, c)) for i, c in enumerate(calls))} cases", flush=True)
    now = fuzz(calls, checks=not args.without_checks, jobs=args.jobs, show=args.show)
    checked = [c for c in calls if c.op in value_checks.VALUE_CHECKS]
    without = fuzz(checked, checks=False, jobs=args.jobs, show=args.show) if checked and not args.without_checks else []
    result = summary(now, without, surface.load()["ops"] if only is None and not args.known else
                     {c.op: {} for c in calls})
    flagged = [n for n, item in result["ops"].items() if item.get("found")]
    left = [n for n, item in result["ops"].items() if any(k in FINDINGS for k in item.get("outcomes", {}))]
    print(f"{sum(1 for i in result['ops'].values() if i['cases'])} ops with integer arguments fuzzed, {len(now)} "
          f"cases (+{len(without)} without their value checks) in {time.monotonic() - began:.0f} s; "
          f"flagged: {len(flagged)} ({', '.join(flagged)}); findings left now: {left or 'none'}")
    if only is not None or args.known or args.without_checks:
        return 1 if left else 0
    text = dumps(result)
    current = RESULT.exists() and RESULT.read_text() == text
    if args.write:
        RESULT.write_text(text)
        print(f"wrote {RESULT}")
    else:
        print(f"{RESULT.name} is {'current' if current else 'not what this run found: review, then --write'}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())

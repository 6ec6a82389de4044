"""The value fuzz (``tests/fuzz/values.py``): its committed result covers the table, and a sample of it runs here.

The whole fuzz runs for minutes (``python -m tests.fuzz.values``, on every torch upgrade); here its
committed result (``service/ops/value_fuzz.json``) is held to the op table, and two parts of it run
again, each case in a forked child: the calls issue 31 found crashing, which crash (or read past a
tensor) without their value checks and are refused with them, and every case of a few ops.
"""

from __future__ import annotations

import json

import pytest
import torch

from remote_autograd.service.ops import surface, value_checks

from ..fuzz import _calls, values

SURFACE = surface.load()
RESULT = json.loads(values.RESULT.read_text())
# a few ops fuzzed whole here, one recorded call each: an op with a value check and two without
SAMPLED = ("segment_reduce", "take", "nn.functional.one_hot")


def test_the_committed_result_is_this_torchs_and_accounts_for_every_op_of_the_table():
    assert RESULT["torch"] == SURFACE["torch"] == torch.__version__.split("+")[0], \
        "torch changed: python -m tests.fuzz.values --write (after the surface's derive --write)"
    assert values.dumps(RESULT) == values.RESULT.read_text(), "not in the fuzz's own layout"
    assert set(RESULT["ops"]) == set(SURFACE["ops"])
    # what indexes by a tensor's values was fuzzed: every op that takes an index tensor had cases
    assert not [n for n, op in SURFACE["ops"].items() if op.get("index_args") and not RESULT["ops"][n]["cases"]]


def test_no_finding_is_left_and_each_one_is_a_checks():
    for name, item in RESULT["ops"].items():
        assert not set(item.get("outcomes", {})) & set(values.FINDINGS), (name, item)
        if item.get("found"):
            assert item.get("check") == value_checks.VALUE_CHECKS[name].__name__, name
    for name, check in value_checks.VALUE_CHECKS.items():
        item = RESULT["ops"][name]
        assert item["cases"] and item["check"] == check.__name__ and "without_check" in item, name


@pytest.mark.optable
def test_the_known_crashers_crash_without_their_checks_and_are_refused_with_them():
    known = _calls.known()
    without = values.fuzz(known, checks=False, as_recorded=True)
    assert [r["outcome"] for r in without] == ["crash"] * len(known), without
    now = values.fuzz(known, as_recorded=True)
    assert [(r["outcome"], r["status"]) for r in now] == [("refused", 422)] * len(known), now


@pytest.mark.optable
def test_a_sample_of_the_allow_list_has_no_finding():
    calls = values.record_calls(set(SAMPLED))
    sample = [next(c for c in calls if c.op == op and c.slots()) for op in SAMPLED]
    results = values.fuzz(sample)
    assert {r["op"] for r in results} == set(SAMPLED) and len(results) > 50
    assert not [r for r in results if r["outcome"] in values.FINDINGS + ("harness",)]

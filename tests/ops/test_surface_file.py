"""``service/ops/surface.json`` is what the generator (``tools/derive_ops``) writes, and the table
registers it as it says.

Re-deriving the whole file runs every sample of torch's databases (minutes), so the tests check it
in parts: every OpInfo of ``op_db`` is accounted for (allowed, refused with a reason, denied, a
Python value or a factory); every committed spelling names the torch callable the SDK routes by
it; a fixed sample of OpInfos is derived again and must give the committed entries; the table
registers every allowed op and nothing denied.
"""

from __future__ import annotations

import fnmatch

import pytest
import torch

from remote_autograd.service.ops import OP_TABLE, surface
from tools.derive_ops import _names, _record, derive

SURFACE = surface.load()
ALLOWED = {n for op in SURFACE["ops"].values() for n in op["names"]}
ACCOUNTED = ALLOWED | {n for op in SURFACE["refused"].values() for n in op["names"]} | set(SURFACE["values"]) \
    | set(SURFACE["factories"])
# OpInfos whose entries are derived again here: a spread of the database, and the kinds of fact
# that matter most (random, data-dependent, uninitialised, an index in place, a layout in place)
SAMPLED = {"add", "where", "nn.functional.dropout", "nonzero", "unique", "empty_like", "index_add", "t",
           "bernoulli", "masked_select", "linalg.det", "softmax", "nn.functional.relu", "sub", "__rsub__"}


def _denied(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SURFACE["deny"])


def test_the_file_is_written_by_this_torch():
    assert SURFACE["torch"] == torch.__version__.split("+")[0]
    assert derive.dumps(SURFACE) == surface.SURFACE_FILE.read_text(), "not in the generator's own layout"


def test_every_spelling_names_the_callable_the_sdk_routes_by_it():
    wrong = [n for n in sorted(ALLOWED) if not callable(surface.walk(n)) or _record.spelling(surface.walk(n)) != n]
    assert not wrong


@pytest.mark.slow  # imports torch's op_db (seconds, in each worker that runs it)
def test_every_opinfo_is_accounted_for(op_db):
    """Every spelling an OpInfo declares that reaches ``__torch_function__`` (``F.tanh`` does not: it
    calls ``Tensor.tanh``, which the SDK sees instead) is allowed, refused, denied, a value or a factory."""
    overridable = {f for fs in torch.overrides.get_overridable_functions().values() for f in fs}
    missing = {}
    for opinfo in op_db:
        for variant in _record.declared_variants(opinfo):
            name = _record.spelling(variant)
            reaches_sdk = variant in overridable or name and name.startswith("torch.Tensor.")
            if reaches_sdk and name.startswith("torch.") and name not in ACCOUNTED and not _denied(name):
                missing.setdefault(opinfo.name, []).append(name)
    assert not missing


def test_refusals_say_why():
    assert all(op["why"] for op in SURFACE["refused"].values()) and all(SURFACE["deny"].values())


@pytest.mark.slow  # imports torch's op_db and derives
def test_a_sample_of_opinfos_derives_the_committed_entries(op_db):
    ops, refused = derive.derive_opinfos(SAMPLED)
    for name, entry in ops.items():
        committed = SURFACE["ops"].get(name)
        assert committed is not None, f"{name} derived but not committed"
        assert set(entry["names"]) <= set(committed["names"]), name
        facts = {k: v for k, v in entry.items() if k not in ("names", "from", "opinfo")}
        assert facts == {k: v for k, v in committed.items() if k not in ("names", "from", "opinfo")}, name
    for name, entry in refused.items():
        assert SURFACE["refused"].get(name, {}).get("why") == entry["why"], name
    assert {"where", "nonzero", "add", "sub", "unique"} <= set(ops) | set(refused)


def test_the_table_registers_every_allowed_spelling_and_nothing_denied():
    routed = {n for e in OP_TABLE for n in e.torch_names}
    ours = {e.name for e in OP_TABLE if not e.variants}  # the SDK's factory linspace keeps its name
    assert ALLOWED - routed == {n for name, op in SURFACE["ops"].items() if name in ours for n in op["names"]}
    assert not [n for n in routed if _denied(n)]
    from_surface = {n for e in OP_TABLE if e.variants for n in e.torch_names}  # not our own entries (getitem)
    assert not from_surface & {n for op in SURFACE["refused"].values() for n in op["names"]}


def test_variants_derive_from_the_base_name():
    """``add`` has ``Tensor.add``, ``Tensor.add_`` and the operators; an F op its ``torch.X`` twin."""
    add = set(SURFACE["ops"]["add"]["names"])
    assert {"torch.add", "torch.Tensor.add", "torch.Tensor.add_", "torch.Tensor.__radd__",
            "torch.Tensor.__iadd__"} <= add
    assert {"torch.relu", "torch.Tensor.relu_"} <= set(SURFACE["ops"]["nn.functional.relu"]["names"])
    assert "torch.Tensor.__truediv__" in SURFACE["ops"]["div"]["names"]
    assert _names.base_name("torch.Tensor.add_") == "add"


def test_a_spelling_the_running_torch_lacks_is_left_out_and_the_rest_served():
    """A GPU host runs its own torch, older or newer than the one ``surface.json`` was written on:
    the server starts and serves the spellings that torch has (one torch lacks is never walked)."""
    from remote_autograd.service.ops._registry import OpTable

    spec = dict(SURFACE["ops"]["add"], names=["torch.Tensor.add", "torch.Tensor.not_in_any_torch"])
    gone = dict(SURFACE["ops"]["add"], names=["torch.nn.functional.not_in_any_torch"])
    table = OpTable()
    added = surface.register(table, {"ops": {"add": spec, "gone": gone}})
    assert added == ["add"]
    assert set(table.get("add").variants) == {"Tensor.add", "add"}

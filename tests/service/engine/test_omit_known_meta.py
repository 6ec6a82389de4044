"""``Program.omit_known_meta``: results that only repeat what the client chose answer ``null``.

One program with every step kind runs on two sessions, without and with the flag, in
msgpack and JSON: the answers differ exactly as SPEC §6's table says, and every fetched
value and grad is the same bytes either way.
"""

from __future__ import annotations

import torch

from ..wire import BOTH_BACKENDS, Wire, call_step, decode, expect_error, new_id, put_step, ref


def _steps(w: Wire) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g, dtype=torch.float64)
    return [
        put_step("x", w.tensor(x), True),  # 0
        put_step("w", w.tensor(torch.randn(4, 2, generator=g, dtype=torch.float64)), True),
        put_step("c", w.tensor(torch.randn(3, 4, generator=g, dtype=torch.float64))),
        {"kind": "set_requires_grad", "id": "c", "requires_grad": True},
        put_step("k", w.tensor(torch.arange(4.0))),
        call_step("add_", ref("k"), 1.0),  # 5: in place
        call_step("matmul", ref("x"), ref("w"), out=["y"]),
        call_step("unbind", ref("y"), out=["y0", "y1", "y2"]),  # a tuple
        put_step("mask", w.tensor(torch.tensor([[True, False], [False, True]]))),
        {"kind": "call", "op": "where", "args": [ref("mask")], "out": ["idx"], "out_many": True},
        {"kind": "retain_grad", "id": "y"},  # 10
        call_step("sum", ref("y"), out=["loss"]),
        {"kind": "backward", "tensors": ["loss"]},
        put_step("u", w.tensor(torch.randn(4, generator=g, dtype=torch.float64)), True),
        call_step("vector_norm", ref("u"), 0, out=["n0"]),  # no gradient flows into u
        {"kind": "backward", "tensors": ["n0"]},  # 15: u reached, still without grad
        call_step("mul", ref("x"), ref("x"), out=["sq"]),
        call_step("sum", ref("sq"), out=["s2"]),
        {"kind": "grad", "outputs": ["s2"], "inputs": ["x"], "out": ["gx"], "retain_graph": True},
        {"kind": "grad", "outputs": ["s2"], "inputs": ["x", "c"], "out": ["gx2", "gc"], "allow_unused": True},
        {"kind": "set_grad", "id": "c", "grad": {"ref": "gx"}},  # 20
        {"kind": "free", "ids": ["sq"]},
        *({"kind": "fetch", "id": tid} for tid in ("x", "w", "c", "k", "y", "y1", "idx.0", "idx.1", "u", "gx", "gx2")),
    ]


def _reduced(step: dict, full):
    """What a step answers with the flag, from what it answers without it (SPEC §6's table)."""
    kind = step["kind"]
    if kind == "fetch" or (kind == "call" and step.get("out_many")) or (kind == "grad" and step.get("allow_unused")):
        return full
    if kind == "backward":
        return {"no_grad": full["no_grad"]} if "no_grad" in full else None
    return None


def _run(w: Wire, session: str, steps: list, omit: bool | None) -> list:
    body = {"id": new_id(), "steps": steps}
    if omit is not None:
        body["omit_known_meta"] = omit
    r = w.post_raw(f"/v1/sessions/{session}/programs", w.encode(body))
    assert r.status_code == 200, r.text
    return decode(r)["results"]


@BOTH_BACKENDS
def test_each_step_kind_answers_as_the_table_says_and_values_are_the_same(wire: Wire, sid: str):
    steps = _steps(wire)
    other = wire.session()
    try:
        full, omitted = _run(wire, sid, steps, None), _run(wire, other, steps, True)
    finally:
        wire.c.delete(f"/v1/sessions/{other}")
    # without the flag, answers are as they always were
    assert full[0] == {"tensors": [{"id": "x", "dtype": "float64", "shape": [3, 4], "requires_grad": True}]}
    assert full[3] == {"tensors": [{"id": "c", "dtype": "float64", "shape": [3, 4], "requires_grad": True}]}
    assert full[5] == {"tensors": []} and full[12] == {"tensors": []}
    assert full[7]["tuple"] is True and [m["id"] for m in full[7]["tensors"]] == ["y0", "y1", "y2"]
    assert full[9] == {"tensors": [{"id": "idx.0", "dtype": "int64", "shape": [2], "requires_grad": False},
                                   {"id": "idx.1", "dtype": "int64", "shape": [2], "requires_grad": False}],
                       "tuple": True}
    assert full[15] == {"tensors": [], "no_grad": ["u"]}
    assert full[18] == {"tensors": [{"id": "gx", "dtype": "float64", "shape": [3, 4], "requires_grad": False}]}
    assert full[19]["tensors"][1] is None and full[19]["tensors"][0]["id"] == "gx2"
    assert full[10] is None and full[20] is None and full[21] is None
    # with it, each result is the table's reduced form of that one
    assert omitted == [_reduced(step, result) for step, result in zip(steps, full)]
    assert omitted[:9] == [None] * 9 and omitted[15] == {"no_grad": ["u"]} and omitted[12] is None
    fetched = [i for i, s in enumerate(steps) if s["kind"] == "fetch"]
    assert len(fetched) == 11 and all(omitted[i] == full[i] for i in fetched)  # bytes and all
    assert all(full[i]["tensor"]["value"] is not None for i in fetched)


def test_the_flag_false_is_the_default(wire: Wire, sid: str):
    steps = [put_step("a", wire.tensor(torch.ones(2)), True), call_step("neg", ref("a"), out=["b"])]
    other = wire.session()
    try:
        assert _run(wire, sid, steps, False) == _run(wire, other, steps, None)
    finally:
        wire.c.delete(f"/v1/sessions/{other}")


def test_a_failing_step_reports_the_reduced_results_before_it(wire: Wire, sid: str):
    body = {"id": new_id(), "omit_known_meta": True,
            "steps": [put_step("a", wire.tensor(torch.ones(2))), call_step("matmul", ref("a"), ref("nope"), out=["b"])]}
    answer = expect_error(wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode(body)), 404, "unknown_tensor", "nope")
    assert answer["results"] == [None] and answer["error"]["step"] == 1


@BOTH_BACKENDS
def test_a_retry_with_the_other_flag_is_another_program(wire: Wire, sid: str):
    """The retry cache keys on the body's bytes: the flag is part of them, so a retry must resend
    it as it was; the other value under the same program id is a 409 and runs nothing."""
    pid, path = new_id(), f"/v1/sessions/{sid}/programs"
    steps = [put_step("once", wire.tensor(torch.ones(2)), True)]
    first = wire.post_raw(path, wire.encode({"id": pid, "steps": steps, "omit_known_meta": True}))
    assert first.status_code == 200 and decode(first)["results"] == [None]
    expect_error(wire.post_raw(path, wire.encode({"id": pid, "steps": steps})), 409, "conflict", pid)
    again = wire.post_raw(path, wire.encode({"id": pid, "steps": steps, "omit_known_meta": True}))
    assert again.status_code == 200 and again.content == first.content

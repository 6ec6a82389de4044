"""A template's repeated runs go as its graph (``compiled_templates``, the default: no compiler): the
answers are the runner's bit for bit (a server with ``REMOTE_AUTOGRAD_REPLAY=off`` runs every step
through the runner), and where the graph way refuses (the session's bytes, anomaly detection) the run
goes the plain way and answers exactly as it does."""

from __future__ import annotations

import pytest
import torch

from remote_autograd.proto import decode_tensor, encode_tensor
from remote_autograd.service.engine import template_compile

from .template_cases import template_step, train_step, variants_of_its_own
from .test_compiled_templates import _app, _program, _train


@pytest.fixture(autouse=True)
def own_variants():
    with variants_of_its_own():
        yield


def _runs_as_graph() -> int:
    return template_compile.COMPILER.figures()["runs"]


def test_a_training_template_gives_the_runners_answers_bit_for_bit_from_its_second_run():
    before = _runs_as_graph()
    with _app() as c:
        as_graph = _train(c, 4)
    assert _runs_as_graph() - before == 3  # the first run plain, the rest as its graph
    with _app(replay="off") as c:
        plain = _train(c, 4)
    assert _runs_as_graph() - before == 3
    for got, want in zip(as_graph["losses"], plain["losses"]):
        assert torch.equal(got, want)
    for name, (value, grad) in plain["params"].items():
        assert torch.equal(as_graph["params"][name][0], value) and torch.equal(as_graph["params"][name][1], grad)


_BIG = {"kind": "template", "id": "T", "inputs": [{"id": "x", "dtype": "float32", "shape": [1 << 18]}],
        "scalars": [], "outputs": ["s"],
        "steps": [{"kind": "call", "op": "mul", "args": [{"ref": "x"}, 2.0], "out": ["y"]},
                  {"kind": "call", "op": "sum", "args": [{"ref": "y"}], "out": ["s"]}]}


def _fill_then_run(replay: str) -> tuple[list, list]:
    """The template run once, then again after a put that leaves less room than its product takes (1 MiB of a
    2.5 MiB budget): each run's status and answer."""
    answers = []
    with _app(replay=replay, max_session_bytes=(5 << 20) // 2) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        put = {"kind": "put", "id": "x", "value": encode_tensor(torch.ones(1 << 18), as_json=True)}
        _program(c, sid, [put, _BIG])
        for n, more in enumerate((None, torch.zeros(1 << 18))):
            steps = [] if more is None else [{"kind": "put", "id": "more", "value": encode_tensor(more, as_json=True)}]
            steps += [{"kind": "run_template", "template": "T", "inputs": [{"ref": "x"}], "scalars": [], "out": [f"s{n}"]},
                      {"kind": "fetch", "id": f"s{n}"}]
            r = c.post(f"/v1/sessions/{sid}/programs", json={"id": f"p{n}", "steps": steps})
            answers.append((r.status_code, r.json()))
    return answers


def test_a_run_whose_graph_does_not_fit_the_sessions_bytes_answers_as_the_runner_does():
    before = _runs_as_graph()
    as_graph, plain = _fill_then_run("on"), _fill_then_run("off")
    assert _runs_as_graph() == before  # the second run's graph was refused: it ran plainly
    assert as_graph == plain
    status, answer = as_graph[1]
    assert status == 413 and "step 0 of template 'T': mul" in answer["error"]["message"], answer


def test_a_program_sent_with_detect_anomaly_runs_its_templates_plainly():
    before = _runs_as_graph()
    case = train_step()
    with _app() as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        puts = [{"kind": "put", "id": name, "value": encode_tensor(v, as_json=True), "requires_grad": rg,
                 **({"grad": encode_tensor(g, as_json=True)} if g is not None else {})}
                for name, (v, rg, g) in case.inputs.items()]
        _program(c, sid, [*puts, template_step(case, "step")])
        for n in range(3):
            run = {"kind": "run_template", "template": "step", "inputs": [{"ref": name} for name in case.inputs],
                   "scalars": [case.scalars["neg_lr"]], "out": [f"loss{n}"]}
            r = c.post(f"/v1/sessions/{sid}/programs",
                       json={"id": f"a{n}", "detect_anomaly": True, "steps": [run, {"kind": "fetch", "id": f"loss{n}"}]})
            assert r.status_code == 200, r.text
            assert torch.isfinite(decode_tensor(r.json()["results"][1]["tensor"]["value"]))
    assert _runs_as_graph() == before


_MM = {"kind": "template", "id": "T", "scalars": [], "outputs": ["c"],
       "inputs": [{"id": "a", "dtype": "float32", "shape": [256, 256]}, {"id": "b", "dtype": "float32", "shape": [256, 256]}],
       "steps": [{"kind": "call", "op": "mm", "args": [{"ref": "a"}, {"ref": "b"}], "out": ["c"]}]}
_MM_FLOPS = 2 * 256 ** 3


def _run_late(replay: str) -> list:
    """The mm template (1.5 s of work at the rate set here) run at once twice, then after 1.8 s of a 3 s
    program: each answer's status, and the last one's error. (A small mm first: a process's first meta
    check of a call takes the longest.)"""
    run = {"kind": "run_template", "template": "T", "inputs": [{"ref": "a"}, {"ref": "b"}], "scalars": []}
    with _app(replay=replay, test_ops=True, device_flops_per_second=_MM_FLOPS / 1.5, max_program_seconds=3.0) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        puts = [{"kind": "put", "id": name, "value": encode_tensor(torch.ones(256, 256), as_json=True)} for name in "ab"]
        warm = {"kind": "call", "op": "mm", "args": [{"ref": "w"}, {"ref": "w"}], "out": ["ww"]}
        _program(c, sid, [*puts, {"kind": "put", "id": "w", "value": encode_tensor(torch.ones(2, 2), as_json=True)},
                          warm, _MM])
        answers = [c.post(f"/v1/sessions/{sid}/programs", json={"id": f"p{n}", "steps": [{**run, "out": [f"c{n}"]}]})
                   for n in range(2)]
        sleep = {"kind": "call", "op": "_test_sleep", "args": [1.8], "out": ["slept"]}
        answers.append(c.post(f"/v1/sessions/{sid}/programs", json={"id": "late", "steps": [sleep, {**run, "out": ["c2"]}]}))
    return [r.status_code for r in answers] + [answers[-1].json().get("error")]


def test_a_run_whose_work_the_time_left_cannot_hold_answers_as_the_runner_does():
    before = _runs_as_graph()
    as_graph = _run_late("on")
    assert _runs_as_graph() - before == 1  # the second run; the late one's graph was refused: it ran plainly
    plain = _run_late("off")
    assert as_graph[:3] == plain[:3] == [200, 200, 413]
    for error in (as_graph[3], plain[3]):
        assert error["code"] == "time_limit" and error["message"].startswith("step 0 of template 'T': mm: about "), error
        assert "FLOPs of work" in error["message"] and "left of max_program_seconds=3.0" in error["message"], error

"""A template's repeated runs go as its graph (``compiled_templates``, the default: no compiler): the
answers are the runner's bit for bit (a server with ``REMOTE_AUTOGRAD_REPLAY=off`` runs every step
through the runner), and where the graph way refuses (the session's bytes, anomaly detection) the run
goes the plain way and answers exactly as it does."""

from __future__ import annotations

import torch

from remote_autograd.proto import decode_tensor, encode_tensor
from remote_autograd.service.engine import template_compile

from .template_cases import template_step, train_step
from .test_compiled_templates import _app, _program, _train


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

"""How ``compiled_templates`` runs a template's variants: the first run of each plain, its graph built
then and run from the next one on, whatever the setting; compiled (``template_compile``) with
``auto`` after three runs in a row with the same layouts and numbers, never for numbers that change
every run; with ``on`` after the first run; with ``off`` never; at most ``VARIANTS_PER_TEMPLATE``
variants of one template; a template a graph cannot hold always plain. A misspelt setting stops the
server at its start.

Inductor's compiles cost seconds each, and what is under test here is when one is asked for: the
compile itself is the graph's own module (``compile_graph`` replaced in this process), which makes
the variant ``ready`` at once. ``test_compiled_templates`` runs inductor's."""

from __future__ import annotations

import logging

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import decode_tensor, encode_tensor
from remote_autograd.service.engine import compiled_templates, template_compile

from ...conftest import PROTOCOL_HEADERS
from ..wire import new_id
from .template_cases import variants_of_its_own


def _template(last: dict) -> dict:
    return {"kind": "template", "id": "T", "inputs": [{"id": "x", "dtype": "float32", "shape": [8]}],
            "scalars": [{"id": "s", "kind": "float"}],
            "steps": [{"kind": "call", "op": "mul", "args": [{"ref": "x"}, {"scalar": "s"}], "out": ["y"]}, last],
            "outputs": ["z"]}


_FITS = _template({"kind": "call", "op": "relu", "args": [{"ref": "y"}], "out": ["z"]})
_DRAWS = _template({"kind": "call", "op": "nn.functional.dropout", "args": [{"ref": "y"}, 0.5], "out": ["z"]})


@pytest.fixture(autouse=True)
def instant_compiles(monkeypatch):
    """Compiles that take no time, and a compiler of each test's own (a tenant's variants are the process's:
    the tests before made some, and their least recently used would make way for these)."""
    monkeypatch.setattr(template_compile, "compile_graph", lambda graph, examples, cuda_graphs: graph.module)
    monkeypatch.setattr(compiled_templates, "compiler_missing", lambda: None)  # none is needed
    with variants_of_its_own():
        yield


def _figures() -> tuple[dict, int]:
    template_compile.COMPILER.wait(timeout=60)
    found = template_compile.COMPILER.figures()
    return found["variants"], found["runs"]


def _runs(compile_mode: str, numbers: list[float], template: dict = _FITS) -> dict:
    """The template run once per number on a new session: the variants that made, by their state, and
    how many runs went as a graph; each answer checked against torch's. A tenant's sessions share its
    variants: each call takes numbers of its own."""
    before, runs_before = _figures()
    with _app(compile_mode) as c:
        _run(c, numbers, template)
    after, runs_after = _figures()
    made = {state: after.get(state, 0) - before.get(state, 0) for state in after}
    return {"made": {k: v for k, v in made.items() if v}, "as_graph": runs_after - runs_before}


def _app(compile_mode: str) -> httpx.Client:
    return httpx.Client(transport=client.InProcessTransport(service_app(compile=compile_mode)),
                        base_url="http://in-process", headers=PROTOCOL_HEADERS, timeout=60)


def _run(c: httpx.Client, numbers: list[float], template: dict) -> None:
    x = torch.linspace(-1, 1, 8)
    sid = c.post("/v1/sessions").json()["session_id"]
    put = {"kind": "put", "id": "x", "value": encode_tensor(x, as_json=True)}
    assert c.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [put, template]}).is_success
    for n, s in enumerate(numbers):
        run = {"kind": "run_template", "template": "T", "inputs": [{"ref": "x"}], "scalars": [s], "out": [f"z{n}"]}
        r = c.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [run, {"kind": "fetch", "id": f"z{n}"}]})
        assert r.status_code == 200, r.text
        if template is _FITS:
            assert torch.equal(decode_tensor(r.json()["results"][1]["tensor"]["value"]), torch.relu(x * s))
        template_compile.COMPILER.wait(timeout=60)  # a compile asked for is ready before the next run


def test_off_runs_a_variant_as_its_graph_from_its_second_run_and_never_compiles():
    assert _runs("off", [-4.0] * 4) == {"made": {"graph": 1}, "as_graph": 3}


def test_auto_compiles_after_three_runs_in_a_row_with_the_same_key():
    # (new numbers each call: a tenant's sessions share its variants)
    assert _runs("auto", [2.0, 2.0]) == {"made": {"graph": 1}, "as_graph": 1}
    assert _runs("auto", [2.5, 3.0, 3.0]) == {"made": {"graph": 2}, "as_graph": 1}
    assert _runs("auto", [3.5, 4.5, 4.5, 4.5]) == {"made": {"graph": 1, "ready": 1}, "as_graph": 2}


def test_auto_never_compiles_numbers_that_change_every_run():
    assert "ready" not in _runs("auto", [30.0 + n for n in range(3)])["made"]


def test_on_compiles_after_one_run():
    assert _runs("on", [5.0, 5.0]) == {"made": {"ready": 1}, "as_graph": 1}


def test_a_template_whose_numbers_keep_changing_stays_on_the_runner_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="remote_autograd.service.engine.compiled_templates"):
        found = _runs("on", [10.0 + n for n in range(7)])
    assert found == {"made": {"ready": compiled_templates.VARIANTS_PER_TEMPLATE}, "as_graph": 0}
    assert "its numbers keep changing" in caplog.text


def test_a_template_a_graph_cannot_hold_runs_plainly_and_never_compiles():
    assert _runs("on", [6.0] * 3, _DRAWS) == {"made": {"unfit": 1}, "as_graph": 0}


def test_the_metrics_say_what_the_variants_came_to_and_the_compile_time():
    """/metrics of a server in one process (``StoreFigures``); a process per tenant sums its workers'
    (``tests/service/http/test_observability.py``)."""
    with _app("on") as c:
        _run(c, [7.0, 7.0], _FITS)
        _run(c, [8.0] * 2, _DRAWS)
        samples = {(s.name, s.labels.get("state")): s.value
                   for family in text_string_to_metric_families(c.get("/metrics").text) for s in family.samples}
    assert {state: samples[("remote_autograd_template_variants", state)] for state in template_compile.STATES} == {
        "graph": 0, "compiling": 0, "ready": 1, "failed": 0, "unfit": 1}
    assert samples[("remote_autograd_template_compile_seconds_total", None)] >= 0


def test_a_misspelt_setting_stops_the_server_at_its_start():
    with pytest.raises(ValueError, match="REMOTE_AUTOGRAD_COMPILE='always': use off, on or auto"):
        service_app(compile="always")

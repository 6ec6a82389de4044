"""When ``compiled_templates`` compiles a template (no inductor needed here: the template draws random
numbers, so its variants are built and found unfit at once, which still counts as compiled):
``auto`` after three runs in a row with the same layouts and numbers, never for numbers that change
every run; ``on`` after the first run, and at most ``VARIANTS_PER_TEMPLATE`` variants of one template;
``off`` never. A misspelt setting stops the server at its start."""

from __future__ import annotations

import logging

import httpx
import pytest
import torch

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import encode_tensor
from remote_autograd.service.engine import compiled_templates, template_compile

from ...conftest import PROTOCOL_HEADERS
from ..wire import new_id

_TEMPLATE = {"kind": "template", "id": "T", "inputs": [{"id": "x", "dtype": "float32", "shape": [8]}],
             "scalars": [{"id": "s", "kind": "float"}],
             "steps": [{"kind": "call", "op": "mul", "args": [{"ref": "x"}, {"scalar": "s"}], "out": ["y"]},
                       {"kind": "call", "op": "nn.functional.dropout", "args": [{"ref": "y"}, 0.5], "out": ["z"]}],
             "outputs": ["z"]}


def _submitted() -> int:
    template_compile.COMPILER.wait(timeout=60)
    return template_compile.COMPILER.figures()["variants"].get("unfit", 0)


def _runs(compile_mode: str, numbers: list[float]) -> int:
    """The template run once per number on a new session: how many variants that submitted."""
    before = _submitted()
    with httpx.Client(transport=client.InProcessTransport(service_app(compile=compile_mode)),
                      base_url="http://in-process", headers=PROTOCOL_HEADERS, timeout=60) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        put = {"kind": "put", "id": "x", "value": encode_tensor(torch.ones(8), as_json=True)}
        assert c.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [put, _TEMPLATE]}).is_success
        for n, s in enumerate(numbers):
            run = {"kind": "run_template", "template": "T", "inputs": [{"ref": "x"}], "scalars": [s], "out": [f"z{n}"]}
            r = c.post(f"/v1/sessions/{sid}/programs", json={"id": new_id(), "steps": [run]})
            assert r.status_code == 200, r.text
    return _submitted() - before


def test_auto_compiles_after_three_runs_in_a_row_with_the_same_key():
    assert _runs("auto", [2.0, 2.0]) == 0
    assert _runs("auto", [2.0, 3.0, 3.0]) == 0
    assert _runs("auto", [2.0, 3.0, 3.0, 3.0]) == 1


def test_auto_never_compiles_numbers_that_change_every_run():
    assert _runs("auto", [1.0 + n for n in range(6)]) == 0


def test_on_compiles_after_one_run_and_stops_for_numbers_that_keep_changing(caplog):
    assert _runs("on", [5.0, 5.0]) == 1
    with caplog.at_level(logging.INFO, logger="remote_autograd.service.engine.compiled_templates"):
        assert _runs("on", [10.0 + n for n in range(7)]) == compiled_templates.VARIANTS_PER_TEMPLATE
    assert "its numbers keep changing" in caplog.text


def test_off_never_compiles():
    assert _runs("off", [4.0] * 4) == 0


def test_a_misspelt_setting_stops_the_server_at_its_start():
    with pytest.raises(ValueError, match="REMOTE_AUTOGRAD_COMPILE='always': use off, on or auto"):
        service_app(compile="always")

"""What an operator sees: Prometheus metrics, JSON logs with request ids, readiness."""

from __future__ import annotations

import json
import re
import time
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ...servers import Server, api, call, program, put, ref, running

PROGRAMS = "/v1/sessions/{sid}/programs"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running(REMOTE_AUTOGRAD_LOG_LEVEL="info", REMOTE_AUTOGRAD_TEST_OPS="1") as s:
        yield s


def _samples(text: str) -> dict:
    """{(name, frozenset(labels)): value} of every sample; parsing it checks the text format too."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics(server: Server):
    with api(server.url) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        steps = [put("a", [1.0, 2.0, 3.0, 4.0], requires_grad=True, shape=[2, 2]), put("b", [1.0] * 4, shape=[2, 2]),
                 call("matmul", ref("a"), ref("b"), out=["c"]), call("sum", ref("c"), out=["s"]),
                 {"kind": "backward", "tensors": ["s"]}]
        assert program(c, sid, steps).status_code == 200
        assert program(c, sid, [call("no_such_op", out=["x"])]).status_code == 404
        assert c.get("/v1/sessions/nope").status_code == 404
        assert c.get("/v1/sessions/nope", headers={"Remote-Autograd-Protocol": "0"}).status_code == 400
        r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        m = _samples(r.text)
        requests = "remote_autograd_requests_total"
        assert _value(m, requests, route=PROGRAMS, method="POST", status="200") >= 1
        assert _value(m, requests, route=PROGRAMS, method="POST", status="404") >= 1
        assert _value(m, requests, route="/v1/sessions/{sid}", method="GET", status="404") >= 1
        assert _value(m, requests, route="/v1/sessions/{sid}", method="GET", status="400") >= 1
        assert not any("nope" in str(labels) for _, labels in m)  # templates, not paths
        assert _value(m, "remote_autograd_program_seconds_count") >= 2
        for op in ("put", "matmul", "sum", "backward"):
            assert _value(m, "remote_autograd_op_seconds_count", op=op) >= 1, op
        assert not any(dict(labels).get("op") == "no_such_op" for _, labels in m)  # failed steps add no labels
        assert _value(m, "remote_autograd_sessions") >= 1 and _value(m, "remote_autograd_tensors") >= 4
        assert _value(m, "remote_autograd_bytes_held") >= 4 * 16 + 4  # a, its grad, b, c, s
        on_cpu = c.get("/healthz").json()["device"] == "cpu"
        assert (_value(m, "remote_autograd_device_memory_allocated_bytes") == 0) == on_cpu
        assert _value(m, "remote_autograd_programs_in_flight") == 0
        c.delete(f"/v1/sessions/{sid}")
        assert _value(_samples(c.get("/metrics").text), "remote_autograd_tensors") < _value(
            m, "remote_autograd_tensors")


def test_metrics_count_the_templates_variants_in_the_tenants_worker(server: Server):
    """A template run twice has a variant run as its graph (``compiled_templates``), in the worker process of
    its tenant: the front's /metrics sums the workers' (every state a series, compiling time with them)."""
    template = {"kind": "template", "id": "T", "inputs": [{"id": "x", "dtype": "float32", "shape": [4]}],
                "steps": [call("relu", ref("x"), out=["y"])], "outputs": ["y"]}
    with api(server.url) as c:
        before = _samples(c.get("/metrics").text)
        sid = c.post("/v1/sessions").json()["session_id"]
        assert program(c, sid, [put("x", [-1.0, 2.0, -3.0, 4.0]), template]).status_code == 200
        for n in range(2):
            run = {"kind": "run_template", "template": "T", "inputs": [ref("x")], "scalars": [], "out": [f"y{n}"]}
            assert program(c, sid, [run]).status_code == 200
        m = _samples(c.get("/metrics").text)
        variants = "remote_autograd_template_variants"
        assert _value(m, variants, state="graph") == _value(before, variants, state="graph") + 1
        assert {dict(labels)["state"] for name, labels in m if name == variants} == {
            "graph", "compiling", "ready", "failed", "unfit"}
        assert ("remote_autograd_template_compile_seconds_total", frozenset()) in m  # 0 here: compiling is off
        c.delete(f"/v1/sessions/{sid}")


def test_request_ids_are_echoed_or_made(server: Server):
    with api(server.url) as c:
        assert c.get("/healthz", headers={"X-Request-ID": "req-7.a:b"}).headers["x-request-id"] == "req-7.a:b"
        made = c.get("/healthz").headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", made)
        for bad in ("has spaces", "x" * 200, "quote\"d", "new\\nline"):
            echoed = c.get("/healthz", headers={"X-Request-ID": bad}).headers["x-request-id"]
            assert echoed != bad and re.fullmatch(r"[0-9a-f]{32}", echoed)
        assert c.get("/nowhere").headers["x-request-id"]  # errors carry one too


def test_logs_are_json_lines_with_the_request(server: Server):
    with api(server.url) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        rid = f"trace-{time.monotonic_ns()}"
        r = c.post(f"/v1/sessions/{sid}/programs", json={"id": "p1", "steps": [put("x", [1.0])]},
                   headers={"X-Request-ID": rid})
        assert r.status_code == 200
        c.delete(f"/v1/sessions/{sid}")
    deadline = time.monotonic() + 5
    while rid not in server.logged() and time.monotonic() < deadline:
        time.sleep(0.05)
    logged = [line for line in server.logged().splitlines() if line.strip()]
    ready = [line for line in logged if not line.startswith("{")]  # the log file has stdout too: one line
    assert len(ready) == 1 and ready[0].startswith(f"remote-autograd is serving on {server.url} "), ready
    lines = [json.loads(line) for line in logged if line not in ready]  # every other line is JSON
    keys = {"time", "level", "logger", "message", "request_id", "route", "status", "duration_ms", "session"}
    assert all(keys <= set(line) for line in lines)
    mine = [line for line in lines if line["request_id"] == rid]
    assert len(mine) == 1, mine
    line = mine[0]
    assert line["level"] == "info" and line["route"] == PROGRAMS and line["status"] == 200
    assert line["session"] == sid and isinstance(line["duration_ms"], float) and line["duration_ms"] > 0
    assert line["message"] == f"POST {PROGRAMS} 200" and re.match(r"\d{4}-\d\d-\d\dT", line["time"])


def test_readyz_says_the_device_computes(server: Server):
    with api(server.url) as c:
        r = c.get("/readyz", headers={"Remote-Autograd-Protocol": ""})  # no protocol header needed
        body = r.json()
        assert body.pop("tenant_workers") in (0, 1)  # a default server's one tenant's worker, once it has started
        assert r.status_code == 200 and body == {"status": "ready", "device": c.get("/healthz").json()["device"]}

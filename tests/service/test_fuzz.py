"""OpenAPI-driven fuzzing of the live server: whatever schemathesis sends, the answer is never a 5xx.

The schema is the server's own ``/openapi.json`` (so the run grows with the document);
the server has tokens, and the cases carry a real token and a real session id (with
a tensor in it) so they get past 401 and 404 to the code behind. Seeded and bounded:
``derandomize`` makes every run send the same cases, ``max_examples`` caps each
operation and mode.
"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from ..servers import AUTH, Server, api, program, put, running

TOKEN = "fuzz-token-5b1d"
MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running(REMOTE_AUTOGRAD_TOKENS=TOKEN) as s:
        yield s


def _fresh_session(c: httpx.Client) -> str:
    sid = c.post("/v1/sessions").json()["session_id"]
    assert program(c, sid, [put("t", [1.0, 2.0], requires_grad=True)]).status_code == 200
    return sid


def _fuzz(operation, mode: GenerationMode, c: httpx.Client, headers: dict) -> int:
    """Send ``operation``'s cases in ``mode``; how many were sent."""
    sessions = [_fresh_session(c)]
    fixed = {name: value for name, value in (("sid", sessions[0]), ("tid", "t")) if "{" + name + "}" in operation.path}
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=fixed or None)
    sent = []

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def one_case(case) -> None:
        if case.method.upper() == "DELETE" and "sid" in fixed:  # each deletion gets a session of its own
            sessions.append(_fresh_session(c))
            case.path_parameters["sid"] = sessions[-1]
        response = case.call(base_url=str(c.base_url).rstrip("/"), headers=headers, timeout=30)
        sent.append(response.status_code)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} answered {response.status_code}: {response.text[:500]}")

    try:
        one_case()
    except Unsatisfiable:  # nothing in this operation can be made invalid (no parameters, no body)
        assert mode is GenerationMode.NEGATIVE and not sent
    for sid in sessions:
        c.delete(f"/v1/sessions/{sid}")
    return len(sent)


def test_openapi_fuzz_never_answers_5xx(server: Server):
    headers = {AUTH: f"Bearer {TOKEN}", "Remote-Autograd-Protocol": "1"}
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json", headers=headers)
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/sessions", "/v1/sessions/{sid}/programs", "/v1/sessions/{sid}/tensors/{tid}"} <= paths
    with api(server.url, TOKEN) as c:
        sent = {(op.method.upper(), op.path, mode.value): _fuzz(op, mode, c, headers)
                for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)}
        assert c.get("/healthz").json()["status"] == "ok"
    assert sent[("POST", "/v1/sessions/{sid}/programs", "positive")] >= 1
    assert sum(sent.values()) >= 4 * MAX_EXAMPLES, sent

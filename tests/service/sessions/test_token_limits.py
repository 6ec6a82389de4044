"""Per-token limits on the in-process server: one token cannot take every session slot or every byte.

``max_sessions`` and ``max_total_bytes`` bound the server; ``max_sessions_per_token`` and
``max_bytes_per_token`` bound one token, with the same 429 / 413 bodies. (The Ray backend's
cluster-wide version is in test_ray_cluster.py.)
"""

from __future__ import annotations

from typing import Iterator

import pytest

from ...servers import api, error_of, program, put, running

LIMITS = {"REMOTE_AUTOGRAD_MAX_SESSIONS": "5", "REMOTE_AUTOGRAD_MAX_SESSIONS_PER_TOKEN": "2",
          "REMOTE_AUTOGRAD_MAX_BYTES_PER_TOKEN": "6000", "REMOTE_AUTOGRAD_MAX_SESSION_BYTES": "5000",
          "REMOTE_AUTOGRAD_TOKENS": "alice,bob"}
FLOATS = [0.5] * 1000  # 4000 bytes as float32


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running(**LIMITS) as server:
        yield server.url


def test_a_token_holds_at_most_its_sessions_and_others_still_get_theirs(url: str):
    with api(url, "alice") as alice, api(url, "bob") as bob:
        made = [alice.post("/v1/sessions").json()["session_id"] for _ in range(2)]
        error_of(alice.post("/v1/sessions"), 429, "too_many", "max_sessions_per_token=2")
        theirs = bob.post("/v1/sessions")
        assert theirs.status_code == 201, theirs.text
        bob.delete(f"/v1/sessions/{theirs.json()['session_id']}")
        alice.delete(f"/v1/sessions/{made.pop()}")
        again = alice.post("/v1/sessions")  # a freed slot is the token's again
        assert again.status_code == 201, again.text
        for sid in (*made, again.json()["session_id"]):
            alice.delete(f"/v1/sessions/{sid}")


def test_a_tokens_bytes_count_across_its_sessions(url: str):
    with api(url, "alice") as alice, api(url, "bob") as bob:
        first, second = (alice.post("/v1/sessions").json()["session_id"] for _ in range(2))
        assert program(alice, first, [put("a", FLOATS)]).status_code == 200
        r = program(alice, second, [put("b", FLOATS)])  # 8000 bytes for the token: over 6000
        error_of(r, 413, "too_large", "max_bytes_per_token=6000")
        assert alice.get(f"/v1/sessions/{second}").json()["bytes"] == 0  # refused without a trace
        theirs = bob.post("/v1/sessions").json()["session_id"]
        assert program(bob, theirs, [put("c", FLOATS)]).status_code == 200  # bob has his own budget
        assert program(alice, first, [{"kind": "free", "ids": ["a"]}]).status_code == 200
        assert program(alice, second, [put("b", FLOATS)]).status_code == 200  # freed bytes come back
        for c, sid in ((alice, first), (alice, second), (bob, theirs)):
            c.delete(f"/v1/sessions/{sid}")

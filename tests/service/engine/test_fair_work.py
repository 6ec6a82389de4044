"""Fair, bounded work: a program's time limit, its cancel when the client leaves, program slots per
session and per token, and the SDK waiting out a 429.

One server with two tokens and small limits serves the module (the cancel runs on the shared
servers of both backends); the test-only ``_test_sleep`` op makes steps that take a known time.
Each test waits for what it started, so the next one finds every slot free.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest

from remote_autograd import client

from ...servers import api, call, error_of, program, put, running

A, B = "tok-a-0123456789", "tok-b-9876543210"
SETTINGS = {"REMOTE_AUTOGRAD_TOKENS": f"{A},{B}", "REMOTE_AUTOGRAD_TEST_OPS": "1",
            "REMOTE_AUTOGRAD_MAX_PROGRAM_SECONDS": "4.0", "REMOTE_AUTOGRAD_MAX_CONCURRENT_PROGRAMS": "4",
            "REMOTE_AUTOGRAD_MAX_PROGRAMS_PER_SESSION": "2", "REMOTE_AUTOGRAD_MAX_PROGRAMS_PER_TOKEN": "3"}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with running(**SETTINGS) as server:
        with api(server.url, A) as c:  # a server's first call imports what checks it (seconds): not in a test's time
            sid = _session(c)
            assert program(c, sid, [put("w", [1.0]), call("mul", {"ref": "w"}, 2.0, out=["v"])]).status_code == 200
            c.delete(f"/v1/sessions/{sid}")
        yield server.url


def _session(c: httpx.Client) -> str:
    created = c.post("/v1/sessions")
    assert created.status_code == 201, created.text
    return created.json()["session_id"]


def _sleeps(*seconds: float, then: list | None = None, name: str = "s") -> list:
    """Steps that sleep ``seconds`` each (outputs ``s0``, ``s1``, ...), then ``then``."""
    return [call("_test_sleep", s, out=[f"{name}{i}"]) for i, s in enumerate(seconds)] + (then or [])


def _held(c: httpx.Client, sid: str, tid: str) -> bool:
    r = c.get(f"/v1/sessions/{sid}/tensors/{tid}")
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


# -- the time limit ---------------------------------------------------------------------


def test_a_program_stops_at_the_first_step_past_its_time_limit_and_its_steps_before_stay_done(url: str):
    with api(url, A) as c:
        sid = _session(c)
        # step 2 would start 4.8 s in: past 4.0 (a limit with room for a loaded machine's small programs)
        steps = _sleeps(2.4, 2.4, then=[put("late", [1.0])])
        r = program(c, sid, steps, pid="timed")
        err = error_of(r, 413, "time_limit", "max_program_seconds=4.0", "stopped before this step")
        assert (err["step"], err["op"]) == (2, "put") and len(r.json()["results"]) == 2
        assert _held(c, sid, "s0") and _held(c, sid, "s1") and not _held(c, sid, "late")
        # a retry is answered from the first run: the done steps do not run twice
        start = time.monotonic()
        again = program(c, sid, steps, pid="timed")
        assert again.status_code == 413 and again.json() == r.json() and time.monotonic() - start < 1.0
        c.delete(f"/v1/sessions/{sid}")


# -- cancel on disconnect ---------------------------------------------------------------


def _send_and_leave(url: str, sid: str, steps: list, after: float) -> None:
    """POST a program on a raw connection and close it ``after`` seconds later, unanswered."""
    body = json.dumps({"id": os.urandom(6).hex(), "steps": steps}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(after)


@pytest.mark.backends("inprocess", "tenants", "ray")  # elsewhere the front cancels the worker's call
def test_a_program_whose_client_disconnects_stops_at_its_next_step(server_url: str):
    with api(server_url) as c:
        sid = _session(c)
        _send_and_leave(server_url, sid, _sleeps(0.5, 0.5, then=[put("after", [1.0])]), after=0.2)
        # the session's next program waits for that one to stop, then finds what it left
        assert program(c, sid, []).status_code == 200
        assert _held(c, sid, "s0"), "the step under way when the client left completes"
        assert not _held(c, sid, "s1") and not _held(c, sid, "after"), "later steps did not run"
        c.delete(f"/v1/sessions/{sid}")


# -- program slots ----------------------------------------------------------------------


class _Background:
    """Programs running in threads, each on a client of its own."""

    def __init__(self, url: str) -> None:
        self.url, self.threads, self.answers = url, [], []

    def start(self, token: str, sid: str, seconds: float) -> None:
        steps = _sleeps(seconds, name=f"bg{len(self.threads)}-")  # ids of its own: programs may share a session

        def run() -> None:
            with api(self.url, token) as own:
                self.answers.append(program(own, sid, steps))

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> list:
        for thread in self.threads:
            thread.join(timeout=30)
        return [r.status_code for r in self.answers]


def _wait_admitted(c: httpx.Client, n: int) -> None:
    """Until the caller's token has ``n`` programs admitted (its own figure on /metrics)."""
    deadline = time.monotonic() + 10
    while f"remote_autograd_token_programs_in_flight {float(n)}" not in c.get("/metrics").text:
        assert time.monotonic() < deadline, f"never {n} programs admitted"
        time.sleep(0.02)


def test_one_session_or_token_cannot_take_every_slot(url: str):
    with api(url, A) as a, api(url, B) as b:
        a1, a2, b1 = _session(a), _session(a), _session(b)
        flood = _Background(url)
        for sid in (a1, a1):
            flood.start(A, sid, 0.9)
        _wait_admitted(a, 2)
        error_of(program(a, a1, []), 429, "too_many", "max_programs_per_session=2")
        flood.start(A, a2, 0.9)  # the token's third
        _wait_admitted(a, 3)
        error_of(program(a, a2, []), 429, "too_many", "max_programs_per_token=3")
        # the other token is served meanwhile (before, A's one session could hold every slot)
        served = program(b, b1, [put("x", [1.0, 2.0]), {"kind": "fetch", "id": "x"}])
        assert served.status_code == 200 and served.json()["results"][1]["tensor"]["value"]["data"] == [1.0, 2.0]
        assert flood.join() == [200, 200, 200]
        for c, sid in ((a, a1), (a, a2), (b, b1)):
            c.delete(f"/v1/sessions/{sid}")


def test_the_sdk_waits_out_a_429_and_says_what_limit_it_hit_when_it_gives_up(url: str):
    with api(url, A) as a, api(url, B) as b, client.connect(url, token=B, busy_wait=0.2) as impatient, \
            client.connect(url, token=B) as patient:
        a1, a2, b1 = _session(a), _session(a), _session(b)
        full = _Background(url)
        for token, sid in ((A, a1), (A, a1), (A, a2), (B, b1)):  # every one of the server's 4 slots
            full.start(token, sid, 1.0)
        _wait_admitted(a, 3)
        _wait_admitted(b, 1)
        with pytest.raises(client.RemoteError) as refused:
            impatient.tensor([1.0]).tolist()
        assert refused.value.code == "too_many" and refused.value.status == 429
        assert "max_concurrent_programs=4" in str(refused.value) and "resent it" in str(refused.value)
        sent = patient.requests
        assert (patient.tensor([1.0, 2.0]) * 3).tolist() == [3.0, 6.0]  # answered once the slots came free
        assert patient.requests - sent > 1  # refused, resent, run
        assert full.join() == [200, 200, 200, 200]
        for c, sid in ((a, a1), (a, a2), (b, b1)):
            c.delete(f"/v1/sessions/{sid}")

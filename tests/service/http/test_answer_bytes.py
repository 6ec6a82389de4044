"""What a tenant makes the server hold outside its tensors: answers kept for retries, answers
waiting for a reader, request bodies in flight (issue 19, item 2), with resident memory measured.

Before: 40 fetches of an 8 MiB tensor as JSON grew the server 3.2 GB (the retry cache's 1 MiB
cap counted binary data only); 12 clients that never read a 256 MiB answer pinned 3.4 GB;
then (issue 31) a reader taking 1 MiB every 40 s kept its answer for ever, and twelve slow
readers' answers were every tenant's memory, not their token's.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Iterator

import pytest
import torch

from ...servers import memory_of, running, session_pids, slow_fetch
from ..wire import Wire, checked_client, put_step

MiB = 1 << 20


@pytest.fixture(scope="module", params=["off", "on"], ids=["inprocess", "tenants"])
def server(request):
    with running(REMOTE_AUTOGRAD_TOKENS="a,b", REMOTE_AUTOGRAD_TENANT_PROCESSES=request.param,
                 REMOTE_AUTOGRAD_ANSWER_TIMEOUT_SECONDS="2", REMOTE_AUTOGRAD_MIN_ANSWER_BYTES_PER_SECOND=str(6 * MiB),
                 MALLOC_MMAP_THRESHOLD_=str(1 << 20)) as s:  # freed big blocks leave: resident is what is live
        yield s


@pytest.fixture
def wire(server) -> Iterator[Wire]:
    with checked_client(server.url, headers={"Authorization": "Bearer a", "Remote-Autograd-Protocol": "1"}) as c:
        yield Wire(c, "json")


def test_answers_kept_for_retries_hold_their_cap_for_json_lists_too(server, wire: Wire):
    sid = wire.session()
    n = 1 << 19  # 2 MiB of floats: a 16 MiB list of Python floats in a kept answer
    wire.ok(sid, [put_step("x", wire.tensor(torch.rand(n)))])
    fetch = [{"kind": "fetch", "id": "x"}]
    wire.program(sid, fetch)  # the first JSON answer's own growth, outside the measure
    before = memory_of(session_pids(server, wire.c, sid))
    ids = [os.urandom(6).hex() for _ in range(8)]
    for pid in ids:
        status, body = wire.program(sid, fetch, pid)
        assert status == 200 and len(body["results"][0]["tensor"]["value"]["data"]) == n
    grown = memory_of(session_pids(server, wire.c, sid)) - before
    assert grown < 48 * MiB, grown  # 8 kept answers would be 128 MiB
    status, body = wire.program(sid, fetch, ids[0])  # a retry: told to fetch again, never run twice
    assert status == 409 and "fetch the tensors again" in body["error"]["message"], body
    wire.c.delete(f"/v1/sessions/{sid}")


def _raw_request(server, sid: str, body: bytes, *, declared: int | None = None, ctype: str = "application/msgpack",
                 token: str = "a") -> socket.socket:
    """A program request on a socket of its own that reads nothing (a small receive buffer: little
    of an answer fits in the kernel)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", server.port))
    head = (f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Remote-Autograd-Protocol: 1\r\nContent-Type: {ctype}\r\nAccept: {ctype}\r\n"
            f"Content-Length: {len(body) if declared is None else declared}\r\n\r\n").encode()
    s.sendall(head + body)
    return s


def test_an_answer_nobody_reads_is_dropped_after_the_answer_timeout(server, wire: Wire):
    """Six clients that never read a 32 MiB answer: each is dropped after ``answer_timeout_seconds``
    (2 s here), its memory and its session freed."""
    mp = Wire(wire.c, "msgpack")
    sids = [mp.session() for _ in range(6)]
    for sid in sids:
        mp.ok(sid, [put_step("x", mp.tensor(torch.rand(8 * MiB)))])
    pids = session_pids(server, mp.c, sids[0])
    before = memory_of(pids)
    fetch = mp.encode({"id": "f", "steps": [{"kind": "fetch", "id": "x"}]})
    readers = [_raw_request(server, sid, fetch) for sid in sids]
    try:
        time.sleep(1.0)
        pinned = memory_of(pids) - before
        time.sleep(4.0)  # past the timeout
        # on a loaded machine the six answers are still being made a few seconds in (each one's timeout
        # starts as it is written): they must go within a bound, never stay (before issue 31 they stayed)
        deadline = time.monotonic() + 30
        while (after := memory_of(pids) - before) >= 24 * MiB and time.monotonic() < deadline:
            time.sleep(0.5)
        assert after < 24 * MiB, (pinned, after)  # the six answers were 192 MiB
        for sid in sids:  # each session's gate is free again: it answers its next program
            assert mp.ok(sid, [{"kind": "free", "ids": ["x"]}]) == [None]
    finally:
        for r in readers:
            r.close()
        for sid in sids:
            mp.c.delete(f"/v1/sessions/{sid}")


def test_slow_bodies_on_many_connections_hold_only_what_they_sent(server, wire: Wire):
    """32 connections each claiming a 64 MiB body and sending 10 bytes: no buffer is mapped ahead
    (2 GB before, for a made-up session id), and a made-up id is answered without a read."""
    sid = wire.session()
    pids = session_pids(server, wire.c, sid)
    before = memory_of(pids)
    slow = [_raw_request(server, sid, b'{"id": "x"', declared=64 * MiB, ctype="application/json") for _ in range(32)]
    made_up = [_raw_request(server, "made-up-session", b"0123456789", declared=64 * MiB) for _ in range(32)]
    try:
        time.sleep(1.0)
        assert memory_of(pids) - before < 16 * MiB
        for s in made_up:
            s.settimeout(10)
            assert s.recv(4096).startswith(b"HTTP/1.1 404"), "a made-up session's body is not read"
    finally:
        for s in slow + made_up:
            s.close()
    wire.c.delete(f"/v1/sessions/{sid}")


def _get_tensor(port: int, sid: str, tid: str, token: str) -> socket.socket:
    """A tensor read on a socket of its own that reads nothing (a small receive buffer)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET /v1/sessions/{sid}/tensors/{tid} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
              "Remote-Autograd-Protocol: 1\r\nAccept: application/msgpack\r\n\r\n".encode())
    return s


def test_an_answer_read_below_the_minimum_rate_is_dropped(server, wire: Wire):
    """A reader that takes 2 MiB of a 32 MiB answer every second (2 MiB/s, under the 6 MiB/s minimum
    here; each burst empties what waits, so it is never silent for answer_timeout_seconds) is
    dropped within a few windows of 2 s (before: it kept the answer, and its session's gate, to
    its end)."""
    mp = Wire(wire.c, "msgpack")
    sid = mp.session()
    mp.ok(sid, [put_step("x", mp.tensor(torch.rand(8 * MiB)))])
    reader, got = slow_fetch(server.port, sid, "x", token="a")
    try:
        deadline = time.monotonic() + 40  # the whole answer would take 16 s
        while not got[1]:
            assert time.monotonic() < deadline, f"still reading after {got[0]} bytes"
            time.sleep(0.2)
        assert got[0] < 24 * MiB, got  # dropped, not read to its end
    finally:
        reader.close()
        mp.c.delete(f"/v1/sessions/{sid}")


def test_answers_waiting_for_slow_readers_are_charged_to_their_token():
    """Five readers of a 16 MiB tensor that read nothing hold 80 MiB of answers: past token ``a``'s
    64 MiB share, so its next request is 429 (nothing runs) while ``b`` goes on; once the readers
    go, ``a`` works again (before: the answers were every tenant's memory, without bound)."""
    env = {"REMOTE_AUTOGRAD_TOKENS": "a,b", "REMOTE_AUTOGRAD_MAX_BYTES_PER_TOKEN": str(64 * MiB),
           "REMOTE_AUTOGRAD_ANSWER_TIMEOUT_SECONDS": "60"}
    with running(**env) as s, checked_client(s.url, headers={"Authorization": "Bearer a",
                                                             "Remote-Autograd-Protocol": "1"}) as c:
        mp = Wire(c, "msgpack")
        sid = mp.session()
        mp.ok(sid, [put_step("x", mp.tensor(torch.rand(4 * MiB)))])
        readers = [_get_tensor(s.port, sid, "x", "a") for _ in range(5)]
        try:
            deadline = time.monotonic() + 30
            while (status := mp.program(sid, [{"kind": "fetch", "id": "x", "value": False}])[0]) == 200:
                assert time.monotonic() < deadline, "the waiting answers were never charged"
                time.sleep(0.2)
            status, body = mp.program(sid, [{"kind": "free", "ids": ["x"]}])
            assert status == 429 and "max_bytes_per_token=67108864" in body["error"]["message"], body
            with checked_client(s.url, headers={"Authorization": "Bearer b", "Remote-Autograd-Protocol": "1"}) as b:
                theirs = Wire(b, "msgpack")
                theirs.ok(theirs.session(), [put_step("y", theirs.tensor(torch.rand(4)))])  # 200: b is not charged
        finally:
            for r in readers:
                r.close()
        deadline = time.monotonic() + 30
        while mp.program(sid, [{"kind": "fetch", "id": "x", "value": False}])[0] != 200:
            assert time.monotonic() < deadline, "the charge outlived the readers"
            time.sleep(0.2)

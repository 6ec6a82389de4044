"""Every limit answers its status with its NAME=VALUE, nothing is allocated first, and the session lives on.

One server with small limits serves the module (its tests run one after another and
delete what they create); expiry needs a server of its own with a short TTL.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Iterator

import httpx
import pytest

from remote_autograd import client
from remote_autograd.service.settings import ADVERTISED_LIMITS

from ...servers import api, call, error_of, program, put, read_answer, ref, running, sleep_program, wait_in_flight

LIMITS = {
    "max_body_bytes": 65536,
    "max_steps_per_program": 12,
    "max_tensor_elements": 1024,
    "max_tensors_per_session": 8,
    "max_session_bytes": 16000,
    "max_total_bytes": 20000,
    "max_sessions": 4,
    "max_sessions_per_token": 4,
    "max_bytes_per_token": 20000,
    "max_concurrent_programs": 1,
    "session_ttl_seconds": 3600.0,
    "body_timeout_seconds": 1.0,
    "max_tensor_dims": 8,
    "max_list_values": 4096,
    "max_program_seconds": 3600.0,
    "max_programs_per_session": 1,
    "max_programs_per_token": 1,
    "max_header_bytes": 65536,
    "header_timeout_seconds": 10.0,
    "idle_timeout_seconds": 5.0,
    "answer_timeout_seconds": 60.0,
    "max_body_bytes_in_flight": 100000,
    "max_templates_per_session": 3,
    "max_step_flops": 10**6,
    "step_grace_seconds": 10.0,
    "min_answer_bytes_per_second": 65536,
}
FLOATS = [0.5] * 1000  # 4000 bytes as float32


@pytest.fixture(scope="module")
def limited() -> Iterator[str]:
    env = {f"REMOTE_AUTOGRAD_{k.upper()}": str(v) for k, v in LIMITS.items()}
    with running(REMOTE_AUTOGRAD_TEST_OPS="1", **env) as server:
        yield server.url


@pytest.fixture
def c(limited: str) -> Iterator[httpx.Client]:
    with api(limited) as c:
        yield c


@pytest.fixture
def sid(c: httpx.Client) -> Iterator[str]:
    created = c.post("/v1/sessions")
    assert created.status_code == 201, created.text
    s = created.json()["session_id"]
    yield s
    c.delete(f"/v1/sessions/{s}")


def assert_usable(c: httpx.Client, sid: str) -> None:
    """The session still runs programs after the refusal (and still holds what it held)."""
    r = program(c, sid, [put("probe", [1.0, 2.0]), call("mul", ref("probe"), 3.0, out=["probe3"]),
                         {"kind": "fetch", "id": "probe3"}, {"kind": "free", "ids": ["probe", "probe3"]}])
    assert r.status_code == 200, r.text
    assert r.json()["results"][2]["tensor"]["value"]["data"] == [3.0, 6.0]


def held(c: httpx.Client, sid: str) -> dict:
    """What the session holds (its info without ``worker`` and ``node``: where it lives)."""
    info = c.get(f"/v1/sessions/{sid}").json()
    return {k: info[k] for k in ("session_id", "tensors", "bytes") if k in info}


def test_every_limit_is_advertised(c: httpx.Client, sid: str):
    created = c.post("/v1/sessions").json()
    c.delete(f"/v1/sessions/{created['session_id']}")
    assert set(ADVERTISED_LIMITS) == set(LIMITS)
    assert created["limits"] == LIMITS


def test_max_body_bytes(c: httpx.Client, sid: str):
    body = json.dumps({"id": "big", "steps": [put("z", [1.0] * 20000)]}).encode()
    path = f"/v1/sessions/{sid}/programs"
    error_of(c.post(path, content=body, headers={"Content-Type": "application/json"}), 413, "too_large",
             "max_body_bytes=65536")
    chunked = c.post(path, content=iter([body[:30000], body[30000:]]), headers={"Content-Type": "application/json"})
    error_of(chunked, 413, "too_large", "max_body_bytes=65536")
    assert held(c, sid)["tensors"] == 0
    assert_usable(c, sid)


def test_max_body_bytes_in_flight_counts_every_connections_body(limited: str, c: httpx.Client, sid: str):
    """Bodies held at once, all connections together: a second body that would pass 100000 bytes is
    429 naming the limit while the first is still arriving; once the first is answered it goes."""
    path = f"/v1/sessions/{sid}/programs"

    def padded(pid: str) -> bytes:  # a valid program of 60000 bytes
        text = json.dumps({"id": pid, "steps": [put(pid, [1.0])]})
        return (text + " " * (60000 - len(text))).encode()

    first = padded("first")
    with socket.create_connection(("127.0.0.1", int(limited.rsplit(":", 1)[1]))) as slow:
        slow.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1\r\nContent-Type: "
                      f"application/json\r\nContent-Length: {len(first)}\r\n\r\n").encode() + first[:50000])
        time.sleep(0.3)  # the server has read its 50000 bytes (its body timeout is 1 s of silence)
        error_of(c.post(path, content=padded("second"), headers={"Content-Type": "application/json"}), 429,
                 "too_many", "max_body_bytes_in_flight=100000")
        slow.sendall(first[50000:])
        assert read_answer(slow).startswith("HTTP/1.1 200")
    ok = c.post(path, content=padded("second"), headers={"Content-Type": "application/json"})
    assert ok.status_code == 200, ok.text
    assert held(c, sid)["tensors"] == 2


def test_huge_claimed_shape_is_413_before_allocation(c: httpx.Client, sid: str):
    # 16 bytes that claim 10**12 elements: refused from the claim, before a byte is allocated
    claim = {"kind": "put", "id": "huge", "value": {"dtype": "float32", "shape": [10**12], "data": "A" * 24}}
    err = error_of(program(c, sid, [claim]), 413, "too_large", "max_tensor_elements=1024", "1000000000000")
    assert err["step"] == 0 and err["op"] == "put"
    # an op's output is held to the same limit
    err = error_of(program(c, sid, [call("zeros", 2000, out=["z"])]), 413, "too_large", "max_tensor_elements=1024")
    assert err["op"] == "zeros"
    assert held(c, sid)["tensors"] == 0
    assert_usable(c, sid)


def test_max_step_flops(c: httpx.Client, sid: str):
    """A call's work, counted on meta before its kernel runs: a convolution of expanded one-element
    tensors holds 4 bytes and does 1.5e5 FLOPs (counted 2.4e6: one output channel runs slower)."""
    r = program(c, sid, [put("one", [1.0]), call("reshape", ref("one"), [1, 1, 1, 1], out=["one4"]),
                         call("expand", ref("one4"), [1, 1, 32, 32], out=["x"]),
                         call("expand", ref("one4"), [1, 1, 16, 16], out=["w"]),
                         call("conv2d", ref("x"), ref("w"), out=["y"])])
    err = error_of(r, 413, "too_large", "max_step_flops=1000000", "conv2d: about 2.37e+06 FLOPs")
    assert err["step"] == 4 and len(r.json()["results"]) == 4
    assert held(c, sid)["tensors"] == 4
    assert program(c, sid, [{"kind": "free", "ids": ["one", "one4", "x", "w"]}]).status_code == 200
    assert_usable(c, sid)


def test_max_steps_per_program(c: httpx.Client, sid: str):
    r = program(c, sid, [{"kind": "free", "ids": []}] * 13)
    error_of(r, 413, "too_large", "max_steps_per_program=12", "13 steps")
    assert r.json()["results"] == []
    assert_usable(c, sid)


def test_max_tensors_per_session(c: httpx.Client, sid: str):
    r = program(c, sid, [put(f"t{i}", [float(i)]) for i in range(9)])
    err = error_of(r, 413, "too_large", "max_tensors_per_session=8")
    assert err["step"] == 8 and len(r.json()["results"]) == 8  # the steps before it stay done
    # a two-output op with room for one keeps neither
    assert program(c, sid, [{"kind": "free", "ids": ["t0"]}]).status_code == 200
    error_of(program(c, sid, [call("max", ref("t1"), 0, out=["v", "i"])]), 413, "too_large", "max_tensors_per_session")
    assert held(c, sid)["tensors"] == 7
    assert program(c, sid, [{"kind": "free", "ids": ["t1", "t2"]}]).status_code == 200
    assert_usable(c, sid)


def test_max_session_bytes_counts_grads(c: httpx.Client, sid: str):
    ok = program(c, sid, [put("w1", FLOATS, requires_grad=True), put("w2", FLOATS, requires_grad=True),
                          call("dot", ref("w1"), ref("w2"), out=["s"])])
    assert ok.status_code == 200 and held(c, sid)["bytes"] == 8004
    # both grads would make 16004 bytes: the backward is refused whole, its graph kept for a retry
    err = error_of(program(c, sid, [{"kind": "backward", "tensors": ["s"], "retain_graph": True}]), 413,
                   "too_large", "max_session_bytes=16000", "16004")
    assert err["op"] == "backward"
    assert c.get(f"/v1/sessions/{sid}/tensors/w1").json()["grad"] is None and held(c, sid)["bytes"] == 8004
    r = program(c, sid, [{"kind": "backward", "tensors": ["s"], "inputs": ["w1"], "retain_graph": True}])
    assert r.status_code == 200 and held(c, sid)["bytes"] == 12004  # w1's grad counts
    assert c.get(f"/v1/sessions/{sid}/tensors/w1").json()["grad"]["data"] == FLOATS
    # a second backward accumulates into the grad it has: no new bytes
    assert program(c, sid, [{"kind": "backward", "tensors": ["s"], "inputs": ["w1"]}]).status_code == 200
    assert held(c, sid)["bytes"] == 12004
    # a grad is counted by its storage: set to another tensor's value (`p.grad = w1`), it brings no new bytes
    assert program(c, sid, [{"kind": "set_grad", "id": "w2", "grad": ref("w1")}]).status_code == 200
    assert held(c, sid)["bytes"] == 12004
    assert program(c, sid, [{"kind": "set_grad", "id": "w1", "grad": None}]).status_code == 200
    assert held(c, sid)["bytes"] == 8004  # w1's own grad went; w2's grad is w1's value, counted once
    assert program(c, sid, [{"kind": "free", "ids": ["w2"]}]).status_code == 200
    assert held(c, sid)["bytes"] == 4004  # its value; its grad's storage is w1's, which stays
    assert program(c, sid, [{"kind": "free", "ids": ["w1", "s"]}]).status_code == 200
    assert held(c, sid)["bytes"] == 0
    assert_usable(c, sid)


def test_max_total_bytes_across_sessions(c: httpx.Client, sid: str):
    other = c.post("/v1/sessions").json()["session_id"]
    try:
        assert program(c, sid, [put(f"a{i}", FLOATS) for i in range(3)]).status_code == 200  # 12000
        assert program(c, other, [put(f"b{i}", FLOATS) for i in range(2)]).status_code == 200  # 20000 in all
        err = error_of(program(c, other, [put("b2", FLOATS)]), 413, "too_large", "max_total_bytes=20000", "24000")
        assert err["step"] == 0 and held(c, other) == {"session_id": other, "tensors": 2, "bytes": 8000}
        assert program(c, other, [{"kind": "free", "ids": ["b0"]}, put("b2", FLOATS)]).status_code == 200
        assert program(c, other, [{"kind": "free", "ids": ["b1"]}]).status_code == 200
        assert_usable(c, other)
    finally:
        c.delete(f"/v1/sessions/{other}")
    # a deleted session gives its bytes back to everyone
    assert program(c, sid, [put("a3", FLOATS)]).status_code == 200
    assert "remote_autograd_bytes_held 16000.0" in c.get("/metrics").text


def test_max_concurrent_programs(c: httpx.Client, sid: str, limited: str):
    other = c.post("/v1/sessions").json()["session_id"]
    try:
        slow: list = []
        runner = threading.Thread(target=lambda: slow.append(sleep_program(limited, sid, 1.0)))
        runner.start()
        wait_in_flight(c)
        error_of(program(c, other, []), 429, "too_many", "max_concurrent_programs=1")
        runner.join()
        assert slow[0].status_code == 200
        assert_usable(c, other)
    finally:
        c.delete(f"/v1/sessions/{other}")


def test_max_sessions(c: httpx.Client):
    made = []
    try:
        while len(made) <= LIMITS["max_sessions"]:
            r = c.post("/v1/sessions")
            if r.status_code != 201:
                break
            made.append(r.json()["session_id"])
        assert len(made) == LIMITS["max_sessions"]
        error_of(r, 429, "too_many", "max_sessions=4")
        assert_usable(c, made[0])
        c.delete(f"/v1/sessions/{made.pop()}")
        r = c.post("/v1/sessions")
        assert r.status_code == 201
        made.append(r.json()["session_id"])
    finally:
        for s in made:
            c.delete(f"/v1/sessions/{s}")


def test_a_stalled_body_times_out_and_blocks_nobody(c: httpx.Client, sid: str, limited: str):
    host, port = limited.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"id\": \"half".encode())
        assert_usable(c, sid)  # the same session, while that body hangs
        other = c.post("/v1/sessions").json()["session_id"]
        assert_usable(c, other)
        c.delete(f"/v1/sessions/{other}")
        start = time.monotonic()
        answer = read_answer(raw)
        assert time.monotonic() - start < 3
    assert answer.startswith("HTTP/1.1 400"), answer
    assert "body_timeout_seconds=1.0" in answer
    assert_usable(c, sid)


def test_a_slow_but_steady_body_is_read(c: httpx.Client, sid: str, limited: str):
    # the timeout is on silence: 1.4 s in all, but never 1 s without a byte
    body = json.dumps({"id": "slow", "steps": [put("s", [1.0, 2.0])]}).encode()
    pieces = [body[: len(body) // 4], body[len(body) // 4: len(body) // 2], body[len(body) // 2: -5], body[-5:]]
    host, port = limited.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        for piece in pieces:
            time.sleep(0.35)
            raw.sendall(piece)
        answer = read_answer(raw)
    assert answer.startswith("HTTP/1.1 200"), answer
    assert held(c, sid)["tensors"] == 1


@pytest.mark.parametrize("host", [False, True], ids=["device", "host"])
def test_device_out_of_memory_is_507_and_the_session_lives(server_url: str, host: bool):
    """torch's OutOfMemoryError (a GPU's allocator) and Python's MemoryError (the host's) alike."""
    with api(server_url) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        r = program(c, sid, [put("x", [1.0, 2.0]), call("_test_oom", ref("x"), out=["y"], host=host),
                             put("never", [0.0])])
        err = error_of(r, 507, "out_of_memory", "out of memory in _test_oom")
        assert err["step"] == 1 and err["op"] == "_test_oom" and len(r.json()["results"]) == 1
        assert held(c, sid)["tensors"] == 1
        assert_usable(c, sid)
        c.delete(f"/v1/sessions/{sid}")


# -- idle sessions expire ------------------------------------------------------------------


def test_idle_sessions_expire_and_are_freed_without_a_call():
    with running(REMOTE_AUTOGRAD_SESSION_TTL_SECONDS="1.0", REMOTE_AUTOGRAD_SWEEP_INTERVAL_SECONDS="0.1") as server:
        with api(server.url) as c, client.connect(server.url) as sdk:
            x = sdk.tensor([1.0, 2.0])
            sdk.sync()
            idle, busy = (c.post("/v1/sessions").json()["session_id"] for _ in range(2))
            assert program(c, idle, [put("v", FLOATS)]).status_code == 200
            deadline = time.monotonic() + 10
            # the two idle sessions expire at slightly different moments: wait for both
            while "remote_autograd_sessions 1.0" not in c.get("/metrics").text and time.monotonic() < deadline:
                time.sleep(0.1)  # nobody calls `idle` or the SDK's session; `busy` keeps being used
                assert program(c, busy, []).status_code == 200
            metrics = c.get("/metrics").text  # the sweeper freed both without being asked
            assert "remote_autograd_sessions 1.0" in metrics and "remote_autograd_bytes_held 0.0" in metrics
            assert_usable(c, busy)
            for r in (c.get(f"/v1/sessions/{idle}"), program(c, idle, [])):
                error_of(r, 410, "session_expired", idle, "session_ttl_seconds=1.0")
            with pytest.raises(client.SessionLost) as lost:
                (x * 2).tolist()
            assert lost.value.status == 410 and sdk.id in str(lost.value) and lost.value.session_id == sdk.id
            sdk._closed = True  # nothing left to delete


def test_a_session_that_expires_while_its_programs_body_arrives_answers_410():
    """The program route finds the session before it reads the body; one that expires meanwhile is found
    expired (410, as a later request would find it), not unknown (in this process: a tenant's worker
    finds the session again after the body came)."""
    with running(REMOTE_AUTOGRAD_SESSION_TTL_SECONDS="1.0", REMOTE_AUTOGRAD_SWEEP_INTERVAL_SECONDS="0.1",
                 REMOTE_AUTOGRAD_TENANT_PROCESSES="off") as server, api(server.url) as c:
        late = c.post("/v1/sessions").json()["session_id"]
        body = json.dumps({"id": "late", "steps": [put("s", [1.0, 2.0])]}).encode()
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(f"POST /v1/sessions/{late}/programs HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1"
                        f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            for piece in (body[:10], body[10:20], body[20:]):  # never silent for a second, 1.8 s in all
                time.sleep(0.6)
                raw.sendall(piece)
            answer = read_answer(raw)
        assert answer.startswith("HTTP/1.1 410") and "session_ttl_seconds=1.0" in answer, answer


def test_a_factory_over_the_element_limit_is_refused_before_allocating(limited: str):
    from remote_autograd import client

    with client.connect(limited) as sess:
        with pytest.raises(client.RemoteError) as info:
            sess.zeros(10**12).item()
        assert info.value.status == 413 and "max_tensor_elements" in str(info.value)
        assert sess.ones(3).tolist() == [1.0, 1.0, 1.0]  # the session goes on


def test_a_factory_repeated_is_held_to_the_limit_each_time_and_answers_as_torch(limited: str):
    """The factories' size check is memoized by argument (``factories._meta_numel``): the same call is
    checked against the limit again, a size given as a list (not memoized) too, and torch's own
    refusal of an argument equal to an accepted one still comes."""
    import torch

    from remote_autograd import client

    with client.connect(limited) as sess:
        for _ in range(2):
            assert sess.arange(0, 6, 2).tolist() == [0, 2, 4]
            assert sess.zeros([2, 3]).sum().item() == 0.0
            with pytest.raises(client.RemoteError) as info:
                sess.arange(10**12).item()
            assert info.value.status == 413 and "max_tensor_elements" in str(info.value)
        assert sess.arange(2.0).tolist() == [0.0, 1.0]
        with pytest.raises(TypeError):
            torch.zeros(2.0)  # torch's refusal, which the remote call must give too
        with pytest.raises((TypeError, client.RemoteError)):
            sess.zeros(2.0).item()

"""Admission is bounded work: what a body claims is capped before any arithmetic, what it holds before
it is built, and a session is found before its body is read; while a bomb is refused, other clients
are served.

Against the shared server (default limits), on both backends: the Ray workers decode bodies with
the same code. Running out of memory needs a server of its own.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import msgpack
import pytest

from ...servers import api, error_of, program, put, read_answer, running

pytestmark = pytest.mark.backends("inprocess", "ray")

JSON, MSGPACK = "application/json", "application/msgpack"
BIG = 2**63 - 1


def _put(shape: list, data) -> dict:
    return {"id": "bomb", "steps": [{"kind": "put", "id": "t", "value": {"dtype": "float32", "shape": shape,
                                                                       "data": data}}]}


def _post(http: httpx.Client, sid: str, body: bytes, ctype: str) -> httpx.Response:
    return http.post(f"/v1/sessions/{sid}/programs", content=body, headers={"Content-Type": ctype, "Accept": JSON})


@pytest.fixture
def sid(http: httpx.Client):
    s = http.post("/v1/sessions").json()["session_id"]
    yield s
    http.delete(f"/v1/sessions/{s}")


def _bombs() -> list[tuple[str, bytes, str, str]]:
    """(what, body, content type, the limit its 413 names)."""
    dims = json.dumps(_put([BIG] * 200_000, [])).encode()  # 4 MB of big dims: the loop computed their product
    assert len(dims) > 4_000_000
    return [
        ("250 dims of 2**63-1 in msgpack (2.3 KB)", msgpack.packb(_put([BIG] * 250, b"")), MSGPACK,
         "max_tensor_dims=64"),
        ("64 dims of 2**63-1 in msgpack", msgpack.packb(_put([BIG] * 64, b"")), MSGPACK, "max_tensor_elements="),
        ("4 MB of big dims in JSON", dims, JSON, "max_tensor_dims=64"),
        ("two dims of 4000 digits in JSON", json.dumps(_put([10**4000] * 2, [])).encode(), JSON,
         "max_tensor_elements="),
    ]


def test_shape_bombs_are_413_at_once_while_another_client_is_served(http: httpx.Client, sid: str, server_url: str):
    victim_sid = http.post("/v1/sessions").json()["session_id"]
    waits: list[float] = []
    bombing = threading.Event()
    bombing.set()

    def victim() -> None:  # another client's eager ops, timed, for as long as the bombs go on
        with httpx.Client(base_url=server_url, headers={"Remote-Autograd-Protocol": "1"}, timeout=60) as c:
            while bombing.is_set() or not waits:
                start = time.monotonic()
                r = c.post(f"/v1/sessions/{victim_sid}/programs", json={"id": str(len(waits)), "steps": []})
                assert r.status_code == 200, r.text
                waits.append(time.monotonic() - start)

    thread = threading.Thread(target=victim)
    thread.start()
    try:
        for what, body, ctype, limit in _bombs():
            start = time.monotonic()
            r = _post(http, sid, body, ctype)
            took = time.monotonic() - start
            err = error_of(r, 413, "too_large", limit)
            assert (err["step"], err["op"]) == (0, "put") and len(err["message"]) < 400, (what, err)
            assert took < 5, f"{what}: answered after {took:.1f} s"  # it took 50 s, or answered 500
    finally:
        bombing.clear()
        thread.join(timeout=60)
    assert waits and max(waits) < 3, f"the other client waited up to {max(waits):.1f} s"
    http.delete(f"/v1/sessions/{victim_sid}")


def test_a_body_holding_more_values_than_max_list_values_is_refused_before_it_is_built(http: httpx.Client,
                                                                                       sid: str):
    n = http.post("/v1/sessions").json()["limits"]["max_list_values"]
    zeros = json.dumps(_put([n + 1], [0] * (n + 1)), separators=(",", ":")).encode()
    error_of(_post(http, sid, zeros, JSON), 413, "too_large", f"max_list_values={n}", "JSON body")
    error_of(_post(http, sid, msgpack.packb(_put([n + 1], [0] * (n + 1))), MSGPACK), 413, "too_large",
             f"max_list_values={n}")
    # many small lists count together: no one of them is long, all of them are too many values
    nested = msgpack.packb({"id": "p", "steps": [{"kind": "free", "ids": []}], "pad": [[0]] * (n // 2 + 1)})
    error_of(_post(http, sid, nested, MSGPACK), 413, "too_large", f"max_list_values={n}")
    # at the limit, a list travels (and is then checked against its shape like any other)
    ok = _post(http, sid, msgpack.packb(_put([1000], [0.5] * 1000)), MSGPACK)
    assert ok.status_code == 200, ok.text
    assert http.get(f"/v1/sessions/{sid}/tensors/t").status_code == 200


def test_a_body_for_an_unknown_session_is_not_read(server_url: str):
    # 10 bytes of a body that claims a megabyte: the 404 comes at once, not after body_timeout_seconds
    host, port = server_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        raw.sendall(b"POST /v1/sessions/made-up-id/programs HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"id\": \"x\"")
        answer = read_answer(raw)
    assert answer.startswith("HTTP/1.1 404") and "unknown_session" in answer, answer


@pytest.mark.backends("inprocess")
def test_running_out_of_memory_for_a_body_is_507_with_a_body_and_the_server_goes_on():
    import resource

    with running(REMOTE_AUTOGRAD_DEVICE="cpu") as server, api(server.url) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        held = int(next(line.split()[1] for line in open(f"/proc/{server.proc.pid}/status")
                        if line.startswith("VmSize:"))) * 1024
        # room for ordinary work, not for the gigabyte a body claims (the limit a cgroup or host would set)
        resource.prlimit(server.proc.pid, resource.RLIMIT_AS, (held + (512 << 20), resource.RLIM_INFINITY))
        claim = (1 << 30) - 16
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: x\r\nRemote-Autograd-Protocol: 1\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {claim}\r\n\r\n".encode() + b"[0," * 1000)
            answer = read_answer(raw)
        assert answer.startswith("HTTP/1.1 507") and '"code":"out_of_memory"' in answer, answer
        r = program(c, sid, [put("x", [1.0, 2.0]), {"kind": "fetch", "id": "x"}])  # it served this body, and goes on
        assert r.status_code == 200 and r.json()["results"][1]["tensor"]["value"]["data"] == [1.0, 2.0]


@pytest.mark.backends("inprocess")
def test_a_framed_body_is_weighed_by_the_header_its_decoder_reads(monkeypatch):
    """A training step's batch travels as a frame, which becomes a tensor unread: a small header with a
    big frame is decoded on the event loop like any small body (the hop to a thread and back cost a
    loopback MLP step more than its decoding), a big header on a thread; both as ``decode_program``."""
    import asyncio

    import torch

    from remote_autograd.proto import encode_tensor
    from remote_autograd.proto.codec import FRAMES, header_length, pack_frames
    from remote_autograd.service.engine import guards
    from remote_autograd.service.settings import Settings

    hops = []
    real = asyncio.to_thread
    monkeypatch.setattr(guards.asyncio, "to_thread", lambda *a: hops.append(a) or real(*a))

    def framed(frees: int) -> bytes:
        value = encode_tensor(torch.arange(64 * 1024, dtype=torch.float32), as_json=False)  # 256 KiB
        data = memoryview(value.pop("data"))
        steps = [{"kind": "put", "id": "x", "value": {**value, "data": {"frame": 0}}},
                 {"kind": "free", "ids": [f"gone{i}" for i in range(frees)]}]
        parts, _ = pack_frames({"id": "p", "steps": steps}, [data])
        return b"".join(bytes(p) for p in parts)

    settings = Settings()
    for frees, thread in ((0, False), (20_000, True)):
        body = framed(frees)
        assert (header_length(body) > guards.INLINE_BYTES) is thread and len(body) > guards.INLINE_BYTES
        program, key = asyncio.run(guards.admit_program(body, FRAMES, settings))
        assert len(hops) == thread
        hops.clear()
        assert program == guards.decode_program(body, FRAMES, settings)[0] and key
        assert program.steps[0].value.data.nbytes == 256 << 10

"""A big fetched tensor answers the value it had, though another request writes it while the answer streams.

A fetch's big tensor goes out as a view of the session's memory (no copy). These tests hold
such an answer half read, run a program that writes the tensor in place on another connection,
then read the rest: the session must run that program only after the answer is sent
(``LocalSessions.answer_program``), and ``GET .../tensors/{tid}``, which holds no session gate,
answers copies.
"""

from __future__ import annotations

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import MSGPACK, decode_tensor, encode_tensor
from remote_autograd.proto.codec import FRAMES, extract_frames, pack_frames, unpack_frames

from ...conftest import PROTOCOL_HEADERS

pytestmark = pytest.mark.backends("inprocess", "tenants", "ray")

N = 8 << 20  # float32 elements: 32 MiB, far more than the sockets buffer between the two sides


@pytest.fixture
def sid(http: httpx.Client):
    sid = http.post("/v1/sessions").json()["session_id"]
    header, frames = extract_frames({"id": "put", "steps": [
        {"kind": "put", "id": "x", "value": encode_tensor(torch.zeros(N))}]}, 1)
    parts, _ = pack_frames(header, frames)
    r = http.post(f"/v1/sessions/{sid}/programs", content=b"".join(bytes(p) for p in parts),
                  headers={"Content-Type": FRAMES})
    assert r.status_code == 200, r.text
    yield sid
    http.delete(f"/v1/sessions/{sid}")


def _read_while_another_writes(http: httpx.Client, server_url: str, sid: str, method: str, path: str,
                               **kw) -> bytes:
    """The body of ``method path``, read partly, then (once a program adding 1 to x ran, or was
    still waiting for the session after a second) read to its end."""
    writer = httpx.Client(base_url=server_url, headers=PROTOCOL_HEADERS, timeout=1.0)
    with writer, http.stream(method, path, headers={"Accept": FRAMES, "Content-Type": MSGPACK}, **kw) as answer:
        assert answer.status_code == 200
        pieces = answer.iter_raw(1 << 16)
        got = [next(pieces)]
        try:
            r = writer.post(f"/v1/sessions/{sid}/programs", json={"id": "w", "steps": [
                {"kind": "call", "op": "add_", "args": [{"ref": "x"}, 1.0], "out": []}]})
            assert r.status_code == 200, r.text
        except httpx.ReadTimeout:  # the session waits for the answer being read: as it must
            pass
        got.extend(pieces)
    return b"".join(got)


def _fetched_value(body: bytes) -> torch.Tensor:
    message = unpack_frames(bytearray(body))
    message = message["results"][0]["tensor"] if "results" in message else message
    return decode_tensor(message["value"])


def test_a_program_fetching_a_big_tensor(http: httpx.Client, server_url: str, sid: str):
    body = msgpack.packb({"id": "f", "steps": [{"kind": "fetch", "id": "x"}]})
    got = _fetched_value(_read_while_another_writes(http, server_url, sid, "POST", f"/v1/sessions/{sid}/programs",
                                                    content=body))
    assert torch.count_nonzero(got) == 0


def test_reading_a_big_tensor(http: httpx.Client, server_url: str, sid: str):
    got = _fetched_value(_read_while_another_writes(http, server_url, sid, "GET", f"/v1/sessions/{sid}/tensors/x"))
    assert torch.count_nonzero(got) == 0

"""Connections cannot lock others out: idle ones are closed, headers must arrive in time and in bounds.

The server runs with few file descriptors (``nofile``), as a container's ``ulimits`` would give it,
so a few dozen idle connections hold them all unless the server closes them; short idle and
header timeouts keep the test quick.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import Iterator

import httpx
import pytest

from ...servers import running

NOFILE = 64  # the server itself holds about 16
SETTINGS = {"REMOTE_AUTOGRAD_IDLE_TIMEOUT_SECONDS": "1.0", "REMOTE_AUTOGRAD_HEADER_TIMEOUT_SECONDS": "1.0"}


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    with running(nofile=NOFILE, **SETTINGS) as server:
        yield "127.0.0.1", server.port


def _answer(raw: socket.socket, seconds: float = 10) -> str:
    """What the server wrote before closing (or within ``seconds``)."""
    raw.settimeout(seconds)
    data = b""
    with contextlib.suppress(socket.timeout):
        while piece := raw.recv(65536):
            data += piece
    return data.decode(errors="replace")


def test_idle_connections_are_closed_and_the_next_client_is_served(address: tuple[str, int]):
    idle = [socket.create_connection(address, timeout=5) for _ in range(2 * NOFILE)]  # more than it has files
    try:
        half = idle[: NOFILE // 2]
        for raw in half:  # a request begun, never finished, counts as idle until its header timeout
            raw.sendall(b"GET /healthz HTTP/1.1\r\n")
        # while every file is held, a new connection is accepted and dropped at once (libuv's answer
        # to EMFILE): the client retries, as the SDK does, until the idle ones are closed
        deadline, answer = time.monotonic() + 10, None
        while answer is None and time.monotonic() < deadline:
            try:
                answer = httpx.get(f"http://{address[0]}:{address[1]}/healthz", timeout=5)
            except httpx.TransportError:
                time.sleep(0.1)
        assert answer is not None and answer.status_code == 200, "locked out by idle connections"
        assert "408" in _answer(half[0], 5) and _answer(idle[-1], 5) == ""  # each was closed, not forgotten
    finally:
        for raw in idle:
            raw.close()


def test_headers_that_trickle_in_are_cut_off_at_the_header_timeout(address: tuple[str, int]):
    with socket.create_connection(address, timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\n")
        start = time.monotonic()
        answer = ""
        while time.monotonic() - start < 5 and not answer:  # a byte every 0.2 s: never silent for long
            with contextlib.suppress(OSError):
                raw.sendall(b"x")
            if select.select([raw], [], [], 0.2)[0]:
                answer = _answer(raw)
    assert answer.startswith("HTTP/1.1 408"), answer
    assert '"code":"request_timeout"' in answer and "header_timeout_seconds=1.0" in answer
    assert time.monotonic() - start < 4


def test_a_64_mib_header_is_refused(address: tuple[str, int]):
    with socket.create_connection(address, timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece, sent, answer = b"a" * (64 << 10), 0, ""
        while sent < (64 << 20) and not answer:
            try:
                raw.sendall(piece)
            except OSError:  # the server stopped reading: its answer is waiting
                break
            sent += len(piece)
            if select.select([raw], [], [], 0)[0]:
                answer = _answer(raw)
        answer = answer or _answer(raw)
    assert answer.startswith("HTTP/1.1 431"), answer[:300]
    assert '"code":"headers_too_large"' in answer and "max_header_bytes=65536" in answer
    assert sent < (64 << 20)  # the answer came before the header was all sent


def _request(head_size: int, body: bytes = b"", method: bytes = b"POST") -> bytes:
    """A complete request to ``/healthz`` whose line and headers take ``head_size`` bytes, then ``body``."""
    start = b"%s /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nX-Big: " % (method, len(body))
    end = b"\r\n\r\n"
    return start + b"a" * (head_size - len(start) - len(end)) + end + body


@pytest.mark.parametrize("writes", [1, 8])
def test_the_header_limit_holds_however_the_bytes_arrive(address: tuple[str, int], writes: int):
    """In one write, httptools parses the whole head before the piece is counted; in several, the
    last piece completes it: each was served, past the limit. A body and a second request in the
    same write are dropped with it."""
    data = _request(65536 + 4096, b"{}") + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(address, timeout=5) as raw:
        size = -(-len(data) // writes)
        for i in range(0, len(data), size):
            raw.sendall(data[i:i + size])
            time.sleep(0.05 if writes > 1 else 0)  # each its own read on the server
        answer = _answer(raw)
    assert answer.startswith("HTTP/1.1 431"), answer[:300]
    assert '"code":"headers_too_large"' in answer and "max_header_bytes=65536" in answer
    assert answer.count("HTTP/1.1") == 1, answer[-300:]


def test_a_header_within_the_limit_in_one_write_is_served(address: tuple[str, int]):
    with socket.create_connection(address, timeout=5) as raw:
        raw.sendall(_request(65536 - 64, method=b"GET"))
        answer = _answer(raw, 2)
    assert answer.startswith("HTTP/1.1 200"), answer[:300]

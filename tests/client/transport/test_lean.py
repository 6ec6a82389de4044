"""``LeanTransport`` (``client/transport/_lean.py``), the SDK's http:// path, against its plain path
(``TunedTransport``, httpx's own): the same answers from a real server, and each way an answer can end
from a scripted one (lengths, chunks, the connection's end, a stale kept socket, truncation, silence)."""

from __future__ import annotations

import socket
import threading
from typing import Callable

import httpx
import pytest
import torch

from remote_autograd import client
from remote_autograd.client.transport._http import TunedTransport
from remote_autograd.client.transport._lean import LeanTransport
from remote_autograd.client.transport._transport import Transport


def test_both_paths_give_the_same_answers_from_a_real_server(server_url):
    """Small programs, a framed upload and download of 4 MiB, a refused step, an unknown route."""
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    results = []
    for transport in (TunedTransport(), LeanTransport()):
        with client.connect(server_url, transport=transport) as sess:
            r = sess.tensor(x)
            got = [(r * 2 + 1).cpu(), (r.sum()).item()]
            with pytest.raises(client.RemoteError) as refused:  # an index only the values say is out of range
                r.index_select(0, torch.tensor([2 << 20]).to(sess.device)).cpu()
            got.append(refused.value.status)
            status, body = sess._transport.request("GET", "/v1/no-such-route")
            got.append((status, body))
        results.append(got)
    lean, plain = results[1], results[0]
    assert torch.equal(lean[0], plain[0]) and torch.equal(lean[0], x * 2 + 1)
    assert lean[1:] == plain[1:]


def test_the_sdk_speaks_http_through_the_lean_path_and_https_through_the_plain_one(server_url):
    transport = Transport(server_url)
    try:
        assert isinstance(transport._transport, LeanTransport)
        for _ in range(3):
            status, body = transport.request("GET", "/healthz")
            assert status == 200 and body["status"] == "ok"
        assert not transport._transport.plain._pool.connections  # nothing went the plain way
        assert sum(map(len, transport._transport._idle.values())) == 1  # one socket, kept and reused
    finally:
        transport.close()


def test_a_body_of_unknown_length_and_a_request_without_a_host_go_as_on_the_plain_path(server_url):
    """Both are httpx's own refusals on either path (nothing a session of the SDK sends)."""
    class Pieces(httpx.SyncByteStream):  # a body no Content-Length announces
        def __iter__(self):
            yield b"not msgpack"

    host = httpx.URL(server_url).netloc.decode()
    refusals = []
    for transport in (TunedTransport(), LeanTransport()):
        with pytest.raises(Exception, match="Content-Length") as unannounced:  # h11's own, unmapped by httpx
            transport.handle_request(httpx.Request("POST", server_url + "/v1/sessions", stream=Pieces(),
                                                   headers={"host": host}))
        with pytest.raises(httpx.LocalProtocolError, match="Host"):
            transport.handle_request(httpx.Request("GET", server_url + "/healthz", stream=httpx.ByteStream(b"")))
        refusals.append(type(unannounced.value))
        transport.close()
    assert refusals[0] is refusals[1]


class _Scripted:
    """An HTTP server answering each request with ``answer(n)`` (raw bytes; None: close without
    answering), counting the connections it accepted; ``close_after`` answers end their connection."""

    def __init__(self, answer: Callable[[int], bytes | None], close_after: bool = False) -> None:
        self.answer, self.close_after = answer, close_after
        self.connections = self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._converse, args=(conn,), daemon=True).start()

    def _converse(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    piece = conn.recv(65536)
                    if not piece:
                        break
                    data += piece
                if b"\r\n\r\n" not in data:
                    break
                head, _, data = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                answer = self.answer(self.requests)
                self.requests += 1
                if answer is None:
                    break
                conn.sendall(answer)
                if self.close_after:
                    break

    def close(self) -> None:
        self.sock.close()


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def _get(transport: httpx.BaseTransport, url: str, body: bytes = b"", timeout: float = 5.0) -> tuple[int, bytes]:
    headers = [(b"host", b"x"), (b"content-length", str(len(body)).encode())] if body else [(b"host", b"x")]
    request = httpx.Request("POST" if body else "GET", url + "/p", headers=headers, stream=httpx.ByteStream(body),
                            extensions={"timeout": {"connect": timeout, "read": timeout, "write": timeout,
                                                    "pool": timeout}})
    response = transport.handle_request(request)
    try:
        return response.status_code, b"".join(response.iter_raw())
    finally:
        response.close()


ENDINGS = {
    "length": _ok(b"hello"),
    "chunked": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhe\r\n3;x=y\r\nllo\r\n0\r\ntrailer: 1\r\n\r\n",
    "no content": b"HTTP/1.1 204 No Content\r\n\r\n",
    "closing": _ok(b"hello", b"connection: close\r\n"),
    "after an interim answer": b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"hello"),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_each_way_an_answer_ends_reads_alike_on_both_paths(ending):
    server = _Scripted(lambda n: ENDINGS[ending], close_after=ending == "closing")
    try:
        answers = [_get(t, server.url) for t in (TunedTransport(), LeanTransport(), LeanTransport())]
        assert answers[0] == answers[1] == answers[2] == ((204, b"") if ending == "no content" else (200, b"hello"))
    finally:
        server.close()


def test_a_body_read_to_the_connections_end():
    server = _Scripted(lambda n: b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 300_000, close_after=True)
    try:
        lean = LeanTransport()
        assert _get(lean, server.url) == (200, b"x" * 300_000) == _get(TunedTransport(), server.url)
        assert not lean._idle.get(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))  # not kept: it ended
    finally:
        server.close()


def test_bodies_of_every_size_go_out_whole_and_the_socket_is_reused():
    sizes = [1, 1000, 64 << 10, (64 << 10) + 1, 3 << 20]
    server = _Scripted(lambda n: _ok(str(sizes[n]).encode()))
    try:
        lean = LeanTransport()
        for size in sizes:
            assert _get(lean, server.url, b"b" * size) == (200, str(size).encode())
        assert server.connections == 1
    finally:
        server.close()


def test_a_kept_socket_the_server_closed_is_not_used():
    """The server ends each connection after its answer without saying so (as a keep-alive timeout does)."""
    server = _Scripted(lambda n: _ok(b"%d" % n), close_after=True)
    try:
        lean = LeanTransport()
        for n in range(3):
            assert _get(lean, server.url) == (200, b"%d" % n)
            threading.Event().wait(0.05)  # its close arrives
        assert server.connections == 3
    finally:
        server.close()


@pytest.mark.parametrize("answer, error", [
    (lambda n: None, httpx.RemoteProtocolError),  # closed without answering
    (lambda n: b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", httpx.RemoteProtocolError),
    (lambda n: b"SMTP ready\r\n\r\n", httpx.RemoteProtocolError),
    (lambda n: b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n", httpx.RemoteProtocolError),
])
def test_a_broken_answer_is_httpxs_error_on_both_paths(answer, error):
    server = _Scripted(answer, close_after=True)
    try:
        for transport in (TunedTransport(), LeanTransport()):
            with pytest.raises(error):
                _get(transport, server.url)
    finally:
        server.close()


def test_a_silent_server_is_a_read_timeout_and_nothing_listening_a_connect_error():
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog), never answers
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        with pytest.raises(httpx.ReadTimeout):
            _get(LeanTransport(), url, timeout=0.3)
    finally:
        silent.close()
    with pytest.raises(httpx.ConnectError):
        _get(LeanTransport(), url)

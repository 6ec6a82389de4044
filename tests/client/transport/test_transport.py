"""The SDK's tuned socket layer (``client._http``, the plain path for what ``_lean`` does not speak): one send
per small request, reads that grow."""

from __future__ import annotations

import httpcore
import httpx

from remote_autograd.client.transport import _http
from remote_autograd.client.transport._http import TunedTransport, _TunedStream
from remote_autograd.client.transport._errors import RemoteError
from remote_autograd.client.transport._transport import Transport


class _Recorder(httpcore.NetworkStream):
    """A network stream that records writes and answers reads from a script."""

    def __init__(self, reads: list[bytes] = ()) -> None:
        self.writes: list[bytes] = []
        self.read_sizes: list[int] = []
        self._reads = list(reads)

    def write(self, buffer, timeout=None) -> None:
        self.writes.append(bytes(buffer))

    def read(self, max_bytes, timeout=None) -> bytes:
        self.read_sizes.append(max_bytes)
        return self._reads.pop(0)[:max_bytes] if self._reads else b""

    def close(self) -> None:
        pass


def test_small_writes_leave_together_when_the_answer_is_read():
    inner = _Recorder([b"HTTP/1.1 200 OK\r\n"])
    stream = _TunedStream(inner)
    stream.write(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\n")
    stream.write(b"body")
    assert inner.writes == []
    stream.read(65536)
    assert inner.writes == [b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody"]


def test_a_big_write_goes_straight_out_after_what_was_held():
    inner = _Recorder()
    stream = _TunedStream(inner)
    big = memoryview(bytearray(_http._COALESCE_BYTES))
    stream.write(b"headers")
    stream.write(big)
    assert inner.writes == [b"headers", bytes(big)]


def test_reads_grow_while_full_and_shrink_after_a_short_one():
    size = _http._READ_MIN
    inner = _Recorder([b"x" * size, b"x" * 2 * size, b"short", b"x"])
    stream = _TunedStream(inner)
    for _ in range(4):
        stream.read(size)
    assert inner.read_sizes == [size, 2 * size, 4 * size, size]


def test_the_sdk_transports_plain_path_uses_the_tuned_streams(server_url):
    """http:// goes the lean way (``test_lean``); the plain path it hands the rest to is the tuned one."""
    transport = Transport(server_url)
    try:
        plain = transport._transport.plain
        assert isinstance(plain, TunedTransport)
        response = plain.handle_request(httpx.Request("GET", server_url + "/healthz"))
        assert response.status_code == 200 and response.read()
        pool = plain._pool  # fails loudly if httpx stops keeping its pool there
        assert isinstance(pool._network_backend, _http._TunedBackend)
        assert all(isinstance(c._connection._network_stream, _TunedStream) for c in pool.connections)
    finally:
        transport.close()


def test_the_sdk_transport_speaks_tls(tmp_path, monkeypatch):
    """Through a TLS proxy (README): the tuned streams wrap the TLS stream, verified against SSL_CERT_FILE."""
    import http.server
    import json
    import shutil
    import ssl
    import subprocess
    import threading

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)

    class Health(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"status": "ok"}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    transport = Transport(f"https://127.0.0.1:{server.server_address[1]}")
    try:
        for _ in range(3):  # the connection is kept and reused
            status, body = transport.request("GET", "/healthz")
            assert status == 200 and body == {"status": "ok"}
        streams = [c._connection._network_stream for c in transport._transport.plain._pool.connections]
        assert streams and all(isinstance(s, _TunedStream) for s in streams)
        monkeypatch.delenv("SSL_CERT_FILE")
        unverified = Transport(f"https://127.0.0.1:{server.server_address[1]}", retries=0)
        with pytest.raises(RemoteError, match="CERTIFICATE_VERIFY_FAILED"):  # the certificate is still checked
            unverified.request("GET", "/healthz")
        unverified.close()
    finally:
        transport.close()
        server.shutdown()

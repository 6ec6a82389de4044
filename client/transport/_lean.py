"""``LeanTransport``: plain-http requests on kept-alive sockets, HTTP/1.1 written and read here (a speed path).

The plain path it stands in for is ``TunedTransport`` (``_http``): httpx's own transport, whose
connection pool (httpcore) and HTTP state machine (h11) cost each request some hundreds of
microseconds of Python: events, header validation, pool bookkeeping, a trace context per phase.
A training step is one request, so that is paid once per step, as much as a small model's kernels.
The exchange our server has is narrow, and this module speaks that much of HTTP/1.1 itself: a
request with a ``Content-Length`` body (or none), written in one ``send`` where it is small; an
answer with ``Content-Length``, chunked, or read to the connection's end; the socket kept for the
next request unless the answer says ``connection: close`` or was not read whole. An idle socket the
server closed (its keep-alive timeout) is seen before it is used, as httpcore sees it.

Anything else goes to the plain path: https (TLS, certificates); a body no ``Content-Length`` announces,
and a request without a ``Host`` header, which httpx refuses there with its own errors.
Errors are httpx's own types (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError``...), which
``Transport.request`` retries or reports as before. ``tests/client/transport/test_lean.py`` checks both
paths answer the same requests alike, bodies of every size and each way an answer can end.
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Iterator

import httpx

from ._http import _COALESCE_BYTES, _READ_MAX, TunedTransport

_MAX_HEAD = 64 << 10  # an answer's status line and headers; ours are a few hundred bytes
_NO_BODY = {204, 304}


class LeanTransport(httpx.BaseTransport):
    """``http://`` requests over this module's sockets, the rest over ``TunedTransport``."""

    def __init__(self) -> None:
        self.plain = TunedTransport()
        self._idle: dict[tuple[str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if _for_the_plain_path(request):
            return self.plain.handle_request(request)
        url = request.url
        timeouts = request.extensions.get("timeout") or {}
        where = (url.host, url.port or 80)
        sock = self._take(where) or _connect(where, timeouts.get("connect"))
        try:
            _send(sock, request, timeouts.get("write"))
            sock.settimeout(timeouts.get("read"))
            status, headers, start = _read_head(sock)
            body = _Body(self, where, sock, request.method, status, headers, start)
        except BaseException:
            sock.close()
            raise
        return httpx.Response(status, headers=headers, stream=body, request=request)

    def _take(self, where: tuple[str, int]) -> socket.socket | None:
        """An idle socket to ``where`` that the server has not closed (one it did reads as readable)."""
        while True:
            with self._lock:
                idle = self._idle.get(where)
                if not idle:
                    return None
                sock = idle.pop()
            if not _readable(sock):
                return sock
            sock.close()  # closed by the server (keep-alive timeout), or it sent what nothing asked for

    def _keep(self, where: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(where, []).append(sock)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            for sock in socks:
                sock.close()
        self.plain.close()


def _for_the_plain_path(request: httpx.Request) -> bool:
    """https; a request without a ``Host``, or with a body no ``Content-Length`` announces (the plain path
    refuses both with httpx's own errors, as HTTP/1.1 does)."""
    headers = request.headers
    if request.url.scheme != "http" or "host" not in headers:
        return True
    if "content-length" in headers:
        return False
    return "transfer-encoding" in headers or not isinstance(request.stream, httpx.ByteStream) or bool(request.read())


def _readable(sock: socket.socket) -> bool:
    """Whether an idle socket has something to read (its end, most often): ``poll`` where there is one,
    as ``select`` refuses descriptors past 1024 (a notebook with many files open)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


def _connect(where: tuple[str, int], timeout: float | None) -> socket.socket:
    try:
        sock = socket.create_connection(where, timeout=timeout)
    except socket.timeout as exc:
        raise httpx.ConnectTimeout(str(exc) or "timed out connecting") from exc
    except OSError as exc:
        raise httpx.ConnectError(str(exc)) from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _send(sock: socket.socket, request: httpx.Request, timeout: float | None) -> None:
    """The request line, its headers and its body; a small body leaves with the head in one ``send``."""
    head = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
    head += [b"%s: %s\r\n" % (name, value) for name, value in request.headers.raw]
    head.append(b"\r\n")
    held, size = head, 0
    sock.settimeout(timeout)
    try:
        for piece in request.stream:
            n = memoryview(piece).nbytes
            if size + n < _COALESCE_BYTES:
                held.append(piece)
                size += n
                continue
            if held:
                sock.sendall(b"".join(held))
                held, size = [], 0
            sock.sendall(piece)
        if held:
            sock.sendall(b"".join(held))
    except socket.timeout as exc:
        raise httpx.WriteTimeout(str(exc) or "timed out writing") from exc
    except OSError as exc:
        raise httpx.WriteError(str(exc)) from exc


def _recv(sock: socket.socket, size: int) -> bytes:
    try:
        return sock.recv(size)
    except socket.timeout as exc:
        raise httpx.ReadTimeout(str(exc) or "timed out reading") from exc
    except OSError as exc:
        raise httpx.ReadError(str(exc)) from exc


def _read_head(sock: socket.socket, data: bytes = b"") -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers, the body's first bytes read with them); an interim ``1xx`` answer is read past."""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(data) > _MAX_HEAD:
            raise httpx.RemoteProtocolError("an answer whose head does not end")
        piece = _recv(sock, _READ_MAX)
        if not piece:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        data += piece
    lines = data[:end].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or not code.isdigit():
        raise httpx.RemoteProtocolError(f"not an HTTP/1.1 status line: {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"not a header line: {line[:100]!r}")
        headers.append((name, value.strip()))
    if code.startswith(b"1") and code != b"101":
        return _read_head(sock, data[end + 4:])
    return int(code), headers, data[end + 4:]


class _Body(httpx.SyncByteStream):
    """An answer's body, read from the socket as it is iterated; the socket goes back to the transport's
    idle ones once the body was read whole (and the answer keeps the connection), else it is closed."""

    def __init__(self, transport: LeanTransport, where: tuple[str, int], sock: socket.socket, method: str,
                 status: int, headers: list[tuple[bytes, bytes]], start: bytes) -> None:
        self._transport, self._where, self._sock, self._start = transport, where, sock, start
        values = {name.lower(): value for name, value in headers}
        self._keep = values.get(b"connection", b"").lower() != b"close"
        self._chunked = False
        if method == "HEAD" or status in _NO_BODY or status == 101:
            self._length: int | None = 0
        elif b"chunked" in values.get(b"transfer-encoding", b"").lower():
            self._length, self._chunked = None, True
        else:
            length = values.get(b"content-length")
            if length is not None and not length.isdigit():
                raise httpx.RemoteProtocolError(f"Content-Length {length[:40]!r}")
            self._length = None if length is None else int(length)
            if length is None:
                self._keep = False  # read to the end: the connection ends with it
        self._done = False

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks() if self._chunked else self._plain()
        self._finish()

    def _plain(self) -> Iterator[bytes]:
        left = self._length
        data, self._start = self._start, b""
        while True:
            if data:
                if left is not None and len(data) > left:
                    raise httpx.RemoteProtocolError("an answer longer than its Content-Length")
                if left is not None:
                    left -= len(data)
                yield data
            if left == 0:
                return
            data = _recv(self._sock, _READ_MAX if left is None else min(left, _READ_MAX))
            if not data:
                if left is None:
                    return  # the body ends with the connection
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def _chunks(self) -> Iterator[bytes]:
        buf, self._start = bytearray(self._start), b""

        def need(n: int) -> None:
            while len(buf) < n:
                piece = _recv(self._sock, _READ_MAX)
                if not piece:
                    raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
                buf.extend(piece)

        def line() -> bytes:
            while (end := buf.find(b"\r\n")) < 0:
                if len(buf) > _MAX_HEAD:
                    raise httpx.RemoteProtocolError("a chunk size line that does not end")
                need(len(buf) + 1)
            out = bytes(buf[:end])
            del buf[:end + 2]
            return out

        while True:
            size_text = line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise httpx.RemoteProtocolError(f"a chunk size {size_text[:40]!r}") from None
            if size == 0:
                while line():  # trailers, to the blank line
                    pass
                return
            need(size + 2)
            yield bytes(buf[:size])
            del buf[:size + 2]

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            if self._keep:
                self._transport._keep(self._where, self._sock)
            else:
                self._sock.close()

    def close(self) -> None:
        if not self._done:  # not read whole: what is left of it would be read as the next answer
            self._done = True
            self._sock.close()

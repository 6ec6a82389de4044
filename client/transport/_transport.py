"""HTTP for the SDK: one long-lived httpx transport and prebuilt requests.

Going through the transport's ``handle_request`` directly skips the ``httpx.Client``
layer and its per-request cost. The transport is any ``httpx.BaseTransport``: by
default httpx's own over a tuned socket layer (``_http``); ``InProcessTransport``
calls an ASGI app in this process; a wrapper of either can record or replay.
Bodies are msgpack both ways; a body carrying big tensors goes framed
(``proto.codec``): the tensors' own bytes stream out in 1 MiB pieces and answers
land in one preallocated buffer that the decoded tensors then view in place.
"""

from __future__ import annotations

import os
import ssl
import time
from typing import Any

import httpx

from remote_autograd.proto import MSGPACK, PROTOCOL_HEADER, PROTOCOL_VERSION, ProtocolError, decode_body, encode_body
from remote_autograd.proto.codec import FRAME_MIN_BYTES, FRAMES, extract_frames, is_frames, pack_frames

from remote_autograd._fill_buffer import FillBuffer

from . import _progress
from ._backoff import BusyWait
from ._errors import RemoteError, SessionLost
from ._lean import LeanTransport
from ._progress import UploadStream


class Transport:
    """Sends msgpack requests to one server and returns decoded bodies; counts requests."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 600.0, retries: int = 3,
                 busy_wait: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = checked_url(base_url).rstrip("/")
        self._transport = transport if transport is not None else LeanTransport()
        self.own_socket_layer = transport is None  # else another transport reaches who-knows-what at this URL
        self._timeout = {"connect": 10.0, "read": timeout, "write": timeout, "pool": timeout}
        self._headers = [
            (b"content-type", MSGPACK.encode()),
            (b"accept", f"{FRAMES}, {MSGPACK}".encode()),
            (PROTOCOL_HEADER.lower().encode(), PROTOCOL_VERSION.encode()),
            (b"host", httpx.URL(self.base_url).netloc),
        ]
        token = token if token is not None else os.environ.get("REMOTE_AUTOGRAD_TOKEN")
        if token:
            self._headers.append((b"authorization", f"Bearer {token}".encode()))
        self._headers = httpx.Headers(self._headers)
        self._raw_headers = list(self._headers.raw)  # a Request made from a list and a stream skips ~6 us of parsing
        self._extensions = {"timeout": self._timeout}
        self._urls: dict[str, httpx.URL] = {}
        self._retries = retries
        self._busy_wait = busy_wait  # seconds of resending a 429 before it is the caller's error
        self.requests = 0  # every request that went on the wire, for tests and benchmarks
        self._timing_header: str | None = None  # the last answer's Server-Timing, read when asked for

    @property
    def last_server_timing(self) -> dict[str, float]:
        """ms, from the last answer's Server-Timing: ``{"steps": 1.2, "worker": 1.4}`` from
        ``Server-Timing: steps;dur=1.2, worker;dur=1.4`` (parsed when asked for, not per request)."""
        timing = {}
        for item in (self._timing_header or "").split(","):
            name, _, dur = item.strip().partition(";dur=")
            try:
                timing[name] = float(dur)
            except ValueError:
                continue
        return timing

    def request(self, method: str, path: str, body: Any = None, *, idempotent: bool = True,
                big: bool = True) -> tuple[int, Any]:
        """(status, decoded body). Connection failures are retried with backoff when ``idempotent``;
        a ``429`` (the server busy) is resent with growing, jittered waits for up to ``busy_wait`` s.

        ``big=False`` promises the body holds no tensor worth framing (skips looking for one).
        """
        url = self._urls.get(path)
        if url is None:  # parsing a URL costs ~15 us: once per path
            url = self._urls[path] = httpx.URL(self.base_url + path)
        header, frames = extract_frames(body, FRAME_MIN_BYTES) if big and body is not None else (None, [])
        if frames:
            parts, total = pack_frames(header, frames)
            headers = self._headers.copy()
            headers["content-type"], headers["content-length"] = FRAMES, str(total)
            req = httpx.Request(method, url, headers=headers, stream=UploadStream(parts, total, f"{method} {path}"),
                                extensions=self._extensions)
        else:
            content = encode_body(body, True) if body is not None else b""
            headers = [*self._raw_headers, (b"content-length", str(len(content)).encode())] if content else self._raw_headers
            req = httpx.Request(method, url, headers=headers, stream=httpx.ByteStream(content), extensions=self._extensions)
            if len(content) > _progress.THRESHOLD and _progress.bars_enabled():  # big uploads, where someone watches
                req.stream = UploadStream([content], len(content), f"{method} {path}")
        delay, attempt, busy = 0.05, 0, None  # busy: a BusyWait from the first 429 on
        while True:
            try:
                self.requests += 1
                response = self._transport.handle_request(req)
                try:
                    data = read_body(response)
                finally:
                    response.close()
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
                    httpx.WriteError) as exc:
                if not idempotent or attempt == self._retries or tls_failure(exc) is not None:  # TLS fails alike again
                    raise RemoteError(unreachable(self.base_url, exc), code="connection_error") from exc
                time.sleep(delay)
                delay *= 4
                attempt += 1
                continue
            # 429: refused before anything ran, so resending is safe whatever the request (BusyWait)
            if response.status_code != 429:
                break
            if busy is None:
                busy = BusyWait(self._busy_wait)
            if not busy.wait():
                break
        self._timing_header = response.headers.get("server-timing")
        ctype = response.headers.get("content-type")
        try:  # msgpack, JSON or framed (decode_body reads all three)
            decoded = decode_body(data, ctype) if data or is_frames(ctype) else None
        except ProtocolError:
            if is_frames(ctype):  # a framed answer that is not whole: says so
                raise
            # an answer in none of our formats: something else listens at the URL
            raise RemoteError(not_ours(self.base_url, response.status_code, ctype), code="not_remote_autograd",
                              status=response.status_code) from None
        if response.status_code == 429 and isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
            decoded["error"]["message"] = busy.say(str(decoded["error"].get("message", "")))
        return response.status_code, decoded

    def call(self, method: str, path: str, body: Any = None, *, session: str | None = None) -> Any:
        """Like ``request`` but raises ``RemoteError``/``SessionLost`` (naming ``session``) for any error status."""
        status, decoded = self.request(method, path, body)
        if status >= 400:
            raise error_from(status, decoded, session=session)
        return decoded

    def close(self) -> None:
        """Closes the httpx transport too, given or not (as ``httpx.Client`` does)."""
        self._transport.close()


def checked_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host and no ``/v1`` in its path (the SDK adds the routes);
    else a ``ValueError`` saying how to write it."""
    parsed = httpx.URL(url) if "://" in url else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        guess = f"http://{url.split('://', 1)[-1]}" if url else "http://127.0.0.1:8000"
        raise ValueError(f"{url!r} is not a server URL (connect(url) or REMOTE_AUTOGRAD_URL): it starts with "
                         f"http:// or https://, e.g. {guess!r}")
    path = parsed.path.rstrip("/")
    if path == "/v1" or path.endswith("/v1") or "/v1/" in path:
        base = url[:url.index("/v1", url.index("://") + 3)]
        raise ValueError(f"{url!r} names the API's /v1 routes: give connect() (or REMOTE_AUTOGRAD_URL) the "
                         f"server's base URL, {base!r}; the SDK adds /v1/... itself")
    return url


def unreachable(url: str, exc: Exception) -> str:
    tls = tls_failure(exc)
    if tls is not None and tls.reason in _PLAIN_HTTP_ANSWER:
        plain = "http://" + url.split("://", 1)[1]
        return (f"the server at {url} answered without TLS ({tls.reason}): it speaks plain http. Connect to "
                f"{plain!r}; for https, put a TLS proxy in front of the server (README, Operators)")
    if tls is not None:
        return (f"TLS with {url} failed ({exc}): the server's certificate is not one this machine trusts, or "
                f"the proxy in front of it refused; SSL_CERT_FILE names a CA bundle to trust")
    return (f"cannot reach a remote-autograd server at {url} ({exc}). Start one there (`make serve` or "
            f"`remote-autograd-serve`) and check the URL; or call client.connect() without a URL for a server "
            f"of this process's own")


# What OpenSSL says when the other side answers a TLS hello in plain text (an http server's 400 page)
_PLAIN_HTTP_ANSWER = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                                "HTTP_REQUEST"})


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind a connection error (httpx wraps httpcore's, which wraps the ssl module's)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, ssl.SSLError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def not_ours(url: str, status: int, content_type: str | None) -> str:
    return (f"{url} answered HTTP {status} in {content_type or 'no content type'}, not as a remote-autograd "
            f"server does: check the URL (host and port) names one")



def read_body(response: httpx.Response) -> memoryview | bytes:
    """The whole answer body, the one place every response's bytes come through: into one preallocated
    buffer when its length is known (no joining copy, and framed tensors can view it), with a progress
    bar when it is big and someone watches."""
    if response.is_stream_consumed:  # a transport that read it already (httpx.MockTransport's answers)
        return response.content
    size = response.headers.get("content-length", "")
    total = int(size) if size.isdigit() else 0
    show = total > _progress.THRESHOLD and _progress.bars_enabled()
    if total < _progress.CHUNK and not show:  # the raw bytes: our server never encodes an answer (gzip...)
        return b"".join(response.iter_raw())
    buf = FillBuffer(total)  # every byte is overwritten, or the answer refused below
    bar = _progress.bar(total, "download") if show else None
    try:
        for piece in response.iter_raw():
            if buf.filled + len(piece) > total:
                raise httpx.RemoteProtocolError(f"answer longer than its Content-Length {total}")
            buf.append(piece)
            if bar is not None:
                bar.update(len(piece))
    finally:
        if bar is not None:
            bar.close()
    if buf.filled != total:
        raise httpx.RemoteProtocolError(f"answer of {buf.filled} bytes, but Content-Length said {total}")
    return buf.view


def error_from(status: int, body: Any, where: str | None = None, session: str | None = None) -> RemoteError:
    """The exception for an error answer: ``SessionLost`` (naming ``session``) for 410 or an unknown session."""
    err = (body or {}).get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {"code": "http_error", "message": f"HTTP {status}"}
    fields = dict(code=err.get("code", "error"), status=status, step=err.get("step"), op=err.get("op"), where=where)
    message = str(err.get("message", ""))
    if status == 410 or err.get("code") == "unknown_session":
        return SessionLost(message, session_id=session, **fields)
    return RemoteError(message, **fields)

"""``TunedTransport``: httpx's own HTTP transport over a socket layer tuned for this protocol.

Two things httpcore does that cost us, fixed in the network stream it writes to
and reads from (our own transport, so no library is patched process-wide):

- it writes a request's headers and its body in separate ``send`` calls. With
  ``TCP_NODELAY`` they leave as two segments, and the server wakes twice: ~40 µs
  a request here. Writes are held until the response is read (or 64 KiB pile up).
- it reads 64 KiB at a time, which caps a download near 1 GB/s in Python-level
  chunk handling. Reads grow to 256 KiB while they keep coming back full: a chunk is
  copied four times on its way up (socket, h11's buffer, its slice, httpcore's bytes),
  and at 256 KiB the copies stay in cache (1 MiB: 1.1-1.2 GB/s, 256 KiB: 1.6-1.8).
"""

from __future__ import annotations

from typing import Any

import httpcore
import httpx

_COALESCE_BYTES = 64 << 10  # writes smaller than this are held and sent together
_READ_MIN, _READ_MAX = 64 << 10, 256 << 10


class TunedTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` (its request mapping and exception types) over ``_TunedBackend``,
    with the pool httpx would build by default: its TLS context (certifi, ``SSL_CERT_FILE``) and limits."""

    def __init__(self) -> None:
        super().__init__(retries=0)
        # HTTPTransport keeps its connection pool in ``_pool``; tests check the swap took. The
        # limits are httpx.Limits' defaults, as HTTPTransport passes them.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=100, max_keepalive_connections=20,
            keepalive_expiry=5.0, retries=0, network_backend=_TunedBackend())


class _TunedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, whose streams are wrapped in ``_TunedStream``."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _TunedStream(self._inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        return _TunedStream(self._inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _TunedStream(httpcore.NetworkStream):
    """Coalesces small writes until the next read; reads grow while the data keeps coming."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._read_size = _READ_MIN

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if len(buffer) >= _COALESCE_BYTES:  # a big piece goes straight from the caller's memory
            self._flush(timeout)
            self._inner.write(buffer, timeout)
            return
        self._held.append(bytes(buffer))
        self._held_bytes += len(buffer)
        if self._held_bytes >= _COALESCE_BYTES:
            self._flush(timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._flush(timeout)  # the request is complete once its answer is awaited
        data = self._inner.read(max(max_bytes, self._read_size), timeout)
        self._read_size = min(self._read_size * 2, _READ_MAX) if len(data) >= self._read_size else _READ_MIN
        return data

    def _flush(self, timeout: float | None) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held, self._held_bytes = [], 0
            self._inner.write(data, timeout)

    def close(self) -> None:
        self._held, self._held_bytes = [], 0
        self._inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        self._flush(kwargs.get("timeout"))
        return _TunedStream(self._inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

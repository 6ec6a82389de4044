"""``guarded_http_protocol``: uvicorn's httptools protocol with the connection limits it lacks (our transport tuning).

uvicorn 0.5x closes a connection left idle after an answer (``timeout_keep_alive``), and that
is all: a connection that never sends a request is never closed (the timer is armed only after
an answer), a request's line and headers may take forever to arrive, and they may be any size
(httptools gathers a header's pieces before handing it over: a 64 MiB header is read, joined
and parsed). Enough such connections hold every file descriptor and shut everyone else out.
``h11_max_incomplete_event_size`` bounds headers for the h11 protocol only; nothing bounds
their time. So the class passed to ``uvicorn.run`` as ``http=`` (a subclass: nothing of uvicorn
is patched, and other servers in the process are untouched) adds:

- ``idle_timeout_seconds``: uvicorn's keep-alive timer, armed when the connection opens too;
- ``header_timeout_seconds``: from a request's first byte to the end of its headers, else
  ``408 request_timeout`` and the connection closes (total time, not silence: a header
  trickled a byte at a time does not hold a connection forever);
- ``max_header_bytes``: the request line and headers, else ``431 headers_too_large`` and the
  connection closes, however the bytes arrive: counted as pieces arrive, before httptools has
  gathered more, and counted again as httptools hands the head over, so a head that came whole
  in one piece (or whose last piece completed it) is refused before its request starts;
- ``answer_timeout_seconds``: an answer the client stops reading (the transport's buffer full,
  its writes paused) for that long is dropped and the connection aborted. An answer waiting
  for its reader pins its bytes (a 256 MiB fetch, encoded) and its session's gate; 12 clients
  that never read pinned 3.4 GB. Silence, not total time, as for bodies: a slow link that
  keeps reading gets the whole answer.

Their answers carry the protocol's error body in JSON (no request was parsed: its
``Accept`` is not known). The body's own limits are the program route's (``guards.read_body``).
"""

from __future__ import annotations

from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from remote_autograd.proto import ErrorCode, ProtocolError, encode_body

from ..settings import Settings

# The request line and the head's end besides the method and URL: " ", " HTTP/1.1\r\n", "\r\n".
_LINE_AND_END = 1 + len(" HTTP/1.1\r\n") + 2


def guarded_http_protocol(settings: Settings) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.run(http=...)`` with ``settings``' header limits (uvicorn's
    own ``timeout_keep_alive`` is the idle timeout: pass ``settings.idle_timeout_seconds``)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {
        "max_header_bytes": settings.max_header_bytes, "header_timeout_seconds": settings.header_timeout_seconds,
        "answer_timeout_seconds": settings.answer_timeout_seconds})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with the idle timer armed at once, a header-read timeout and a header-size limit."""

    max_header_bytes = Settings.max_header_bytes
    header_timeout_seconds = Settings.header_timeout_seconds
    answer_timeout_seconds = Settings.answer_timeout_seconds
    LINGER_SECONDS = 1.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = False  # a request has begun and its headers are not all in
        self._head_bytes = 0  # the pieces that arrived while the head was open
        self._parsed_bytes = 0  # the head as httptools handed it over (the line and each header)
        self._head_timer = None
        self._refused = False  # answered 408 or 431: what else comes is dropped
        self._stall_timer = None  # armed while the client takes none of the answer (writes paused)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # the first byte cancels it (uvicorn's data_received), as after an answer
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        self._end_stall()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.answer_timeout_seconds, self._answer_stalled)

    def resume_writing(self) -> None:
        self._end_stall()
        super().resume_writing()

    def _end_stall(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _answer_stalled(self) -> None:
        """Nothing of the answer taken for ``answer_timeout_seconds``: drop it. ``abort``, not ``close``
        (which would keep the buffer until the client reads it); uvicorn then marks the request
        disconnected, its remaining sends do nothing, and the answer's memory and the session go free."""
        self._stall_timer = None
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered and closing (see _refuse): the rest is dropped unread
            return
        super().data_received(data)
        if self._head_open and not self.transport.is_closing():
            # the whole piece counts while the head is unfinished after it: at most one piece too many
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse_size()

    # httptools' callbacks. Once refused, the rest of the piece being parsed is dropped: no request of
    # it starts, and the body of the refused one is never handed to a cycle (there is none).

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._end_head()
        self._head_open, self._head_bytes, self._parsed_bytes = True, 0, _LINE_AND_END
        self._head_timer = self.loop.call_later(self.header_timeout_seconds, self._head_timed_out)

    def on_url(self, url: bytes) -> None:
        if not self._refused:
            self._parsed_bytes += len(url)
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._refused:
            self._parsed_bytes += len(name) + len(value) + 4  # "name: value\r\n"
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._end_head()
        if self._parsed_bytes + len(self.parser.get_method()) > self.max_header_bytes:
            self._refuse_size()  # the head came whole in one piece, or its last piece completed it
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def _end_head(self) -> None:
        self._head_open = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._head_open or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined request's head waits behind the answer under way: its time starts after it
            self._head_timer = self.loop.call_later(self.header_timeout_seconds, self._head_timed_out)
            return
        self._refuse(ErrorCode.REQUEST_TIMEOUT, f"request headers not complete after {self.header_timeout_seconds} s: "
                     f"limit header_timeout_seconds={self.header_timeout_seconds}")

    def _refuse_size(self) -> None:
        self._refuse(ErrorCode.HEADERS_TOO_LARGE, f"request line and headers over {self.max_header_bytes} bytes: "
                     f"limit max_header_bytes={self.max_header_bytes}")

    def _refuse(self, code: ErrorCode, message: str) -> None:
        """Answer ``code`` with the protocol's error body and close the connection.

        A lingering close: the answer, then our half of the connection shut, and what the client
        still sends read and dropped for ``LINGER_SECONDS``. Closing at once with its bytes unread
        would reset the connection, and the client could lose the answer before reading it.
        """
        self._end_head()
        self._refused = True
        body = encode_body(ProtocolError(code, message).answer(), False)
        head = (f"HTTP/1.1 {code.status} {HTTPStatus(code.status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(self.LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()

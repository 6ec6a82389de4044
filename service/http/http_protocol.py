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
- ``answer_timeout_seconds`` and ``min_answer_bytes_per_second``: once an answer has to wait for
  its reader (the transport's buffer full, its writes paused), the reader must take at least
  ``min_answer_bytes_per_second`` times ``answer_timeout_seconds`` bytes of it in each
  ``answer_timeout_seconds`` (and at least a byte), else the answer is dropped and the
  connection aborted. An answer waiting for its reader pins its bytes (a 256 MiB fetch,
  encoded) and its session's gate: 12 clients that never read pinned 3.4 GB; a reader taking
  1 MiB every 40 s kept one for ever (and a restart waiting for it). A link slower than the
  minimum rate is too slow for tensors anyway. While it waits, the answer is charged to the
  caller's token (``waiting_answers``).

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
        "answer_timeout_seconds": settings.answer_timeout_seconds,
        "min_answer_bytes_per_second": settings.min_answer_bytes_per_second})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with the idle timer armed at once, a header-read timeout and a header-size limit."""

    max_header_bytes = Settings.max_header_bytes
    header_timeout_seconds = Settings.header_timeout_seconds
    answer_timeout_seconds = Settings.answer_timeout_seconds
    min_answer_bytes_per_second = Settings.min_answer_bytes_per_second
    LINGER_SECONDS = 1.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head_open = False  # a request has begun and its headers are not all in
        self._head_bytes = 0  # the pieces that arrived while the head was open
        self._parsed_bytes = 0  # the head as httptools handed it over (the line and each header)
        self._head_timer = None
        self._refused = False  # answered 408 or 431: what else comes is dropped
        self._window = None  # (cycle, its bytes left to write, bytes buffered) when the reader's window began
        self._window_timer = None  # armed from the first pause of the writes while the reader has bytes to take
        self._waiting = None  # (ledger, owner, bytes): an answer waiting for its reader, charged to its token

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # the first byte cancels it (uvicorn's data_received), as after an answer
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        if self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        self._release_waiting()
        super().connection_lost(exc)

    # -- a slow reader ----------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._window_timer is None:
            self._open_window()
        if self._waiting is None:
            self._hold_waiting()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.cycle is None or self.cycle.response_complete:
            self._release_waiting()

    def on_response_complete(self) -> None:
        if not self.flow.write_paused:  # all of it in the socket's hands: nothing waits here any more
            self._release_waiting()
        super().on_response_complete()

    def _open_window(self) -> None:
        cycle = self.cycle
        self._window = (cycle, cycle.expected_content_length if cycle is not None else 0,
                        self.transport.get_write_buffer_size())
        self._window_timer = self.loop.call_later(self.answer_timeout_seconds, self._window_ended)

    def _window_ended(self) -> None:
        """``answer_timeout_seconds`` since the window opened: what did the reader take? Too little:
        drop the answer. ``abort``, not ``close`` (which would keep the buffer until the client reads
        it); uvicorn then marks the request disconnected, its remaining sends do nothing, and the
        answer's memory and the session go free."""
        self._window_timer = None
        cycle, left, buffered = self._window
        now_buffered = self.transport.get_write_buffer_size()
        if cycle is not self.cycle:  # a new request's answer began (the last one was all written): judge it afresh
            if self.flow.write_paused or now_buffered:
                self._open_window()
            return
        # written since (uvicorn counts down a Content-Length answer), less what still waits to be sent
        taken = (left - cycle.expected_content_length if cycle is not None else 0) - (now_buffered - buffered)
        if taken < max(1, self.min_answer_bytes_per_second * self.answer_timeout_seconds):
            self.transport.abort()
        elif self.flow.write_paused or now_buffered:
            self._open_window()

    def _hold_waiting(self) -> None:
        """Charge what the answer still holds here (its unwritten rest and the buffer) to the caller's token."""
        cycle = self.cycle
        app = cycle.scope.get("app") if cycle is not None else None
        ledger = getattr(getattr(app, "state", None), "waiting_answers", None)
        if ledger is None or (cycle.response_complete and not self.transport.get_write_buffer_size()):
            return
        nbytes = cycle.expected_content_length + self.transport.get_write_buffer_size()
        owner = cycle.scope.get("state", {}).get("owner")
        ledger.hold(owner, nbytes)
        self._waiting = (ledger, owner, nbytes)

    def _release_waiting(self) -> None:
        if self._waiting is not None:
            ledger, owner, nbytes = self._waiting
            self._waiting = None
            ledger.release(owner, nbytes)

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

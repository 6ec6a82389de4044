"""``Channel``: the private protocol between the front and a tenant's worker process.

Both ends run it over their end of one socketpair, with asyncio streams. A frame is::

    u32 LE header length H | u64 LE body length B | H bytes msgpack header | B bytes body

and its header is a msgpack array ``[kind, call, name, fields]``:

- ``CALL``: ``name`` is one method of the receiving side's fixed table (a dict of
  handlers it was built with: a name that is not a key is refused, never looked up
  with ``getattr``), ``fields`` a map of plain values, the body the request's bytes.
- ``ANSWER``: the answer to call number ``call``: ``fields``, and the body (a
  program's encoded answer, as the worker encoded it).
- ``ERROR``: the call failed; ``fields`` is the ``ProtocolError``'s wire dict, raised
  again on the calling side as the same 4xx.
- ``CANCEL``: the caller stopped waiting for ``call`` (its HTTP client went away, or
  the route's task was cancelled); the callee cancels the task serving it, so the
  worker sees what an in-process backend sees: a ``CancelledError`` in the awaiting code.

Bodies are passed on as the bytes they are: never decoded, re-encoded or joined here
(a program's body is decoded once, in the worker). msgpack carries only plain values;
nothing is pickled. Either side may call the other (the worker asks the front for
bytes of the server-wide budget). A frame the peer cannot have meant (a bad header)
closes the channel: the other side treats that peer as gone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Sequence

import msgpack

from remote_autograd.proto import ErrorCode, ProtocolError

log = logging.getLogger("remote_autograd.service")

CALL, ANSWER, ERROR, CANCEL = 0, 1, 2, 3
_PREFIX = struct.Struct("<IQ")
_MAX_HEADER = 64 << 20  # fields are ids, flags and small maps: anything bigger is not a peer of ours
_JOIN_BELOW = 64 << 10  # a small body goes out in the header's write (one send), a big one as it is
STREAM_LIMIT = 1 << 20  # the reader's buffer target: fewer pauses of the socket while a big body arrives


class ChannelClosed(Exception):
    """The peer is gone: its process ended, it closed the socket, or it sent a frame we cannot read."""


@dataclass
class Call:
    """A call being served: its ``fields`` and ``body``; the handler answers it once with ``answer``."""

    fields: dict
    body: bytes
    channel: "Channel"
    number: int
    answered: bool = field(default=False)

    async def answer(self, fields: dict | None = None, parts: Sequence[bytes | memoryview] = (), *,
                     flush: bool = False) -> None:
        """Send the answer. ``flush``: return only once the socket has taken every byte, for parts that
        are views of memory the caller will let change afterwards (a session's tensors)."""
        self.answered = True
        self.channel._write(ANSWER, self.number, None, fields or {}, parts)
        if flush:
            await self.channel._flushed()


Handler = Callable[[Call], Awaitable[None]]


class Channel:
    """One end of the protocol: ``call`` the peer's methods; serve ``handlers`` (this end's fixed table)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 handlers: Mapping[str, Handler], *, on_close: Callable[[str], None] | None = None) -> None:
        self._reader, self._writer = reader, writer
        self._handlers = dict(handlers)
        self._on_close = on_close
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._serving: dict[int, asyncio.Task] = {}
        self.closed_because: str | None = None
        self._read_task: asyncio.Task | None = None

    def start(self) -> None:
        """Read frames until the peer goes (from a running event loop)."""
        self._read_task = asyncio.ensure_future(self._read_forever())

    @property
    def closed(self) -> bool:
        return self.closed_because is not None

    @property
    def in_flight(self) -> int:
        """Calls of ours not answered yet, and calls of the peer's being served."""
        return len(self._pending) + len(self._serving)

    async def wait_closed(self) -> None:
        if self._read_task is not None:
            await asyncio.shield(self._read_task)

    async def call(self, name: str, fields: dict | None = None,
                   body: bytes | bytearray | memoryview = b"") -> tuple[dict, bytes]:
        """The peer's answer to ``name`` as ``(fields, body)``; its ``ProtocolError`` raised here;
        ``ChannelClosed`` if it went away first. Cancelling the caller sends ``CANCEL``."""
        if self.closed_because is not None:
            raise ChannelClosed(self.closed_because)
        number = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        self._write(CALL, number, name, fields or {}, (body,) if len(body) else ())
        try:
            if self._writer.transport.get_write_buffer_size() > STREAM_LIMIT:
                await self._flushed()  # a big body: let the socket take it before the next one queues
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(number, None) is not None and self.closed_because is None:
                self._write(CANCEL, number, None, None, ())
            raise
        finally:
            self._pending.pop(number, None)

    def close(self, because: str = "closed") -> None:
        """Stop: pending calls raise ``ChannelClosed``, calls being served are cancelled, the socket closes."""
        if self.closed_because is not None:
            return
        self.closed_because = because
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelClosed(because))
        self._pending.clear()
        for task in self._serving.values():
            task.cancel()
        self._writer.close()
        if self._read_task is not None and self._read_task is not asyncio.current_task():
            self._read_task.cancel()
        if self._on_close is not None:
            self._on_close(because)

    # -- frames ----------------------------------------------------------------------------

    def _write(self, kind: int, number: int, name: str | None, fields: dict | None,
               parts: Sequence[bytes | memoryview]) -> None:
        if self.closed_because is not None:
            return  # the peer is gone: nobody reads an answer now
        header = msgpack.packb([kind, number, name, fields], use_bin_type=True)
        size = sum(memoryview(p).nbytes for p in parts)
        head = _PREFIX.pack(len(header), size) + header
        if size < _JOIN_BELOW:  # one write (one send) for the whole frame
            self._writer.write(b"".join((head, *parts)))
            return
        # Written back to back, with no await between them: frames never interleave.
        self._writer.write(head)
        for part in parts:
            self._writer.write(part)

    async def _flushed(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError:
            pass  # the peer is gone; the reader closes the channel

    async def _read_forever(self) -> None:
        reader = self._reader
        because = "the peer closed the channel"
        try:
            while True:
                header_size, body_size = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
                if header_size > _MAX_HEADER:
                    because = f"a frame header of {header_size} bytes"
                    break
                header = msgpack.unpackb(await reader.readexactly(header_size), raw=False)
                body = await reader.readexactly(body_size) if body_size else b""
                if not self._dispatch(header, body):
                    because = "a malformed frame header"
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except (ValueError, msgpack.UnpackException) as exc:
            because = f"an unreadable frame header ({exc})"
        except asyncio.CancelledError:
            return
        self.close(because)

    def _dispatch(self, header, body: bytes) -> bool:
        if not (isinstance(header, list) and len(header) == 4 and type(header[0]) is int and type(header[1]) is int):
            return False
        kind, number, name, fields = header
        if kind == CALL:
            if not isinstance(fields, dict):
                return False
            handler = self._handlers.get(name) if isinstance(name, str) else None
            if handler is None:
                self._write(ERROR, number, None, ProtocolError(
                    ErrorCode.BAD_REQUEST, f"no method {name!r} in this end's table").to_wire(), ())
                return True
            call = Call(fields, body, self, number)
            self._serving[number] = asyncio.ensure_future(self._serve(handler, call))
        elif kind in (ANSWER, ERROR):
            future = self._pending.pop(number, None)
            if future is None or future.done():
                return True  # the caller stopped waiting (cancelled): the answer has nowhere to go
            if kind == ANSWER:
                future.set_result((fields if isinstance(fields, dict) else {}, body))
            else:
                future.set_exception(_error_from(fields))
        elif kind == CANCEL:
            task = self._serving.get(number)
            if task is not None:
                task.cancel()
        else:
            return False
        return True

    async def _serve(self, handler: Handler, call: Call) -> None:
        try:
            await handler(call)
            if not call.answered:
                await call.answer()
        except asyncio.CancelledError:
            pass  # the caller stopped waiting: nothing to answer
        except ProtocolError as exc:
            self._write(ERROR, call.number, None, exc.to_wire(), ())
        except Exception as exc:  # a bug of ours: the caller gets an error, this end goes on
            log.exception("channel call %d failed", call.number)
            self._write(ERROR, call.number, None, {"code": ErrorCode.OP_ERROR.value,
                                                   "message": f"{type(exc).__name__}: {exc}"}, ())
        finally:
            self._serving.pop(call.number, None)


def _error_from(wire) -> ProtocolError:
    wire = wire if isinstance(wire, dict) else {}
    try:
        code = ErrorCode(wire.get("code"))
    except ValueError:
        code = ErrorCode.OP_ERROR
    return ProtocolError(code, str(wire.get("message", "")), step=wire.get("step"), op=wire.get("op"))


async def open_channel(sock, handlers: Mapping[str, Handler], *, flush_every_write: bool = False,
                       on_close: Callable[[str], None] | None = None) -> Channel:
    """A started ``Channel`` over a connected socket. ``flush_every_write``: ``drain`` waits until the
    socket has taken every byte (the worker's end: see ``Call.answer``'s ``flush``)."""
    reader, writer = await asyncio.open_connection(sock=sock, limit=STREAM_LIMIT)
    if flush_every_write:
        writer.transport.set_write_buffer_limits(high=0)
    channel = Channel(reader, writer, handlers, on_close=on_close)
    channel.start()
    return channel

"""``Channel``: the private protocol between the front and a tenant's worker process.

Both ends run it over their end of one socketpair, on asyncio (frames: ``tenant_frames``,
``u32 header length | u64 body length | msgpack header | body``). A frame's header is a
msgpack array ``[kind, call, name, fields]``:

- ``CALL``: ``name`` is one method of the receiving side's fixed table (a dict of
  handlers it was built with: a name that is not a key is refused, never looked up
  with ``getattr``), ``fields`` a map of plain values, the body the request's bytes.
- ``ANSWER``: the answer to call number ``call``: ``fields``, and the body (a
  program's encoded answer, as the worker encoded it).
- ``ERROR``: the call failed; ``fields`` is the ``ProtocolError``'s wire dict, raised
  again on the calling side as the same 4xx.
- ``CANCEL``: the caller cancels ``call``: its task was cancelled (it stops waiting), or
  the ``watch`` it called with was (its HTTP client went away: it waits for the answer).
  The callee cancels the task serving the call, so the worker sees what a cancelled
  in-process ``async with`` sees (a ``CancelledError``: a program stops at its next
  step), and answers ``409 cancelled`` if the caller still waits.

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
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Sequence

import msgpack

from remote_autograd.proto import ErrorCode, ProtocolError

from .tenant_frames import FrameError, FrameProtocol, connect

log = logging.getLogger("remote_autograd.service")

CALL, ANSWER, ERROR, CANCEL = 0, 1, 2, 3
_BACKPRESSURE_BYTES = 1 << 20  # a caller waits for the socket once this much is queued


class ChannelClosed(Exception):
    """The peer is gone: its process ended, it closed the socket, or it sent a frame we cannot read."""


@dataclass
class Call:
    """A call being served: its ``fields`` and ``body``; the handler answers it once with ``answer``."""

    fields: dict
    body: bytes | bytearray
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
            await self.channel._frames.drained()


Handler = Callable[[Call], Awaitable[None]]


class Channel:
    """One end of the protocol: ``call`` the peer's methods; serve ``handlers`` (this end's fixed table)."""

    def __init__(self, handlers: Mapping[str, Handler], *, on_close: Callable[[str], None] | None = None) -> None:
        self._handlers = dict(handlers)
        self._on_close = on_close
        self._frames: FrameProtocol | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._serving: dict[int, asyncio.Task] = {}
        self.closed_because: str | None = None

    @property
    def closed(self) -> bool:
        return self.closed_because is not None

    @property
    def in_flight(self) -> int:
        """Calls of ours not answered yet, and calls of the peer's being served."""
        return len(self._pending) + len(self._serving)

    async def call(self, name: str, fields: dict | None = None, body: bytes | bytearray | memoryview = b"", *,
                   watch=None) -> tuple[dict, bytes | bytearray]:
        """The peer's answer to ``name`` as ``(fields, body)``; its ``ProtocolError`` raised here;
        ``ChannelClosed`` if it went away first. Cancelling the caller, or ``watch`` (a
        ``ProgramWatch``: anything with ``on_cancel``), sends ``CANCEL``."""
        if self.closed_because is not None:
            raise ChannelClosed(self.closed_because)
        number = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        self._write(CALL, number, name, fields or {}, (body,) if len(body) else ())
        if watch is not None:
            watch.on_cancel(lambda: self._cancel(number))
        try:
            if self._frames.transport.get_write_buffer_size() > _BACKPRESSURE_BYTES:
                await self._frames.drained()  # a big body: let the socket take it before the next one queues
            return await future
        except asyncio.CancelledError:
            self._cancel(number)
            raise
        finally:
            self._pending.pop(number, None)

    def _cancel(self, number: int) -> None:
        if number in self._pending:  # (once answered there is nothing to cancel)
            self._write(CANCEL, number, None, None, ())

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
        if self._frames is not None:
            self._frames.transport.close()
        if self._on_close is not None:
            self._on_close(because)

    # -- frames ----------------------------------------------------------------------------

    def _write(self, kind: int, number: int, name: str | None, fields: dict | None,
               parts: Sequence[bytes | memoryview]) -> None:
        if self.closed_because is None:  # (once the peer is gone nobody reads an answer)
            self._frames.write(msgpack.packb([kind, number, name, fields], use_bin_type=True), parts)

    def _on_frame(self, header, body: bytes | bytearray) -> None:
        if not (isinstance(header, list) and len(header) == 4 and type(header[0]) is int and type(header[1]) is int):
            raise FrameError("a malformed frame header")
        kind, number, name, fields = header
        if kind == CALL:
            if not isinstance(fields, dict):
                raise FrameError("a call without fields")
            handler = self._handlers.get(name) if isinstance(name, str) else None
            if handler is None:
                self._write(ERROR, number, None, ProtocolError(
                    ErrorCode.BAD_REQUEST, f"no method {name!r} in this end's table").to_wire(), ())
                return
            call = Call(fields, body, self, number)
            self._serving[number] = asyncio.ensure_future(self._serve(handler, call))
        elif kind in (ANSWER, ERROR):
            future = self._pending.pop(number, None)
            if future is None or future.done():
                return  # the caller stopped waiting (cancelled): the answer has nowhere to go
            if kind == ANSWER:
                future.set_result((fields if isinstance(fields, dict) else {}, body))
            else:
                future.set_exception(_error_from(fields))
        elif kind == CANCEL:
            task = self._serving.get(number)
            if task is not None:
                task.cancel()
        else:
            raise FrameError(f"a frame of kind {kind!r}")

    async def _serve(self, handler: Handler, call: Call) -> None:
        try:
            await handler(call)
            if not call.answered:
                await call.answer()
        except asyncio.CancelledError:  # CANCEL, or this end closing (then nothing goes out)
            self._write(ERROR, call.number, None, ProtocolError(
                ErrorCode.CANCELLED, "the client disconnected while its program ran: it stopped at its next step "
                "boundary, the steps before it stay done").to_wire(), ())
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
    """A ``Channel`` over a connected Unix socket, reading from now on. ``flush_every_write``: a flushed
    answer waits until the socket has taken every byte (the worker's end: see ``Call.answer``)."""
    channel = Channel(handlers, on_close=on_close)
    channel._frames = await connect(sock, channel._on_frame, channel.close, flush_every_write=flush_every_write)
    return channel

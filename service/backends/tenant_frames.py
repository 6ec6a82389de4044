"""``FrameProtocol``: the frames of the front-worker protocol (``tenant_channel``) on a socket, each body read once.

A frame is::

    u32 LE header length H | u64 LE body length B | H bytes msgpack header | B bytes body

A speed path for reading. The plain path is asyncio's ``StreamReader`` with
``readexactly``: it appends every received chunk to its buffer, then slices a body out
of it and copies that into ``bytes``, three copies of every byte, and hands out bodies
that cannot be written (a framed upload's tensors must then be copied once more). Here
small frames are parsed out of one scratch buffer, many per receive, and a body that is
not all in hand gets a buffer of its own that the socket then fills directly: the bytes
land once, where they stay. Such a body is handed over as a writable ``bytearray`` (the
tensors of a framed upload are views of it, as in a single server); smaller ones as
``bytes``. ``bench tenants`` prints the 16 MiB upload and download through a worker
beside one process; ``tests/service/backends/test_tenant_channel.py`` checks bodies of every size
against what was sent.

Writing is the transport's own, with asyncio's flow control: ``drained`` waits until
the socket takes what is queued (to below ``high`` bytes; all of it with ``high=0``).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Any, Callable, Sequence

import msgpack

PREFIX = struct.Struct("<IQ")
MAX_HEADER = 64 << 20  # fields are ids, flags and small maps: anything bigger is not a peer of ours
MAX_BODY = 1 << 40
_SCRATCH = 256 << 10
_OWN_BUFFER = 64 << 10  # a body at least this big, not yet all in hand, is read into a buffer of its own
_JOIN_BELOW = 64 << 10  # a smaller body goes out in the header's write (one send)


class FrameError(Exception):
    """The peer sent something no peer of ours sends."""


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls ``on_frame(header, body)`` for each frame received, ``on_lost(why)`` once at the end."""

    def __init__(self, on_frame: Callable[[Any, bytes | bytearray], None], on_lost: Callable[[str], None]) -> None:
        self._on_frame, self._on_lost = on_frame, on_lost
        self._scratch = bytearray(_SCRATCH)
        self._have = 0  # bytes in scratch not parsed yet
        self._body: bytearray | None = None  # a body being filled in place, with its header
        self._header: Any = None
        self._filled = 0
        self._broken: str | None = None
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._waiters: deque[asyncio.Future] = deque()
        self.lost = False

    # -- writing ---------------------------------------------------------------------------

    def write(self, header: bytes, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """One frame, written whole (no await inside: frames never interleave)."""
        size = sum(memoryview(p).nbytes for p in parts)
        head = PREFIX.pack(len(header), size) + header
        if size < _JOIN_BELOW:
            self.transport.write(b"".join((head, *parts)))
        else:
            self.transport.writelines((head, *parts))

    async def drained(self) -> None:
        while self._paused and not self.lost:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # -- reading ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()
        self._on_lost(self._broken or ("the peer closed the channel" if exc is None else f"the socket failed: {exc}"))

    def eof_received(self) -> bool:
        return False  # the peer is done: close

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return memoryview(self._body)[self._filled:]
        return memoryview(self._scratch)[self._have:]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._body is not None:
                self._filled += nbytes
                if self._filled == len(self._body):
                    header, body, self._body, self._header = self._header, self._body, None, None
                    self._on_frame(header, body)
                return
            self._have += nbytes
            self._parse()
        except FrameError as exc:
            self._broken = str(exc)
            self.transport.close()

    def _parse(self) -> None:
        scratch, pos = self._scratch, 0
        while self._have - pos >= PREFIX.size:
            header_size, body_size = PREFIX.unpack_from(scratch, pos)
            if header_size > MAX_HEADER or body_size > MAX_BODY:
                raise FrameError(f"a frame of {header_size} + {body_size} bytes")
            body_at = pos + PREFIX.size + header_size
            if body_at > self._have:
                break  # the header is not all here yet
            try:
                header = msgpack.unpackb(scratch[pos + PREFIX.size:body_at], raw=False)
            except (ValueError, msgpack.UnpackException) as exc:
                raise FrameError(f"an unreadable frame header ({exc})") from None
            end = body_at + body_size
            if end <= self._have:
                pos = end
                self._on_frame(header, bytes(scratch[body_at:end]) if body_size else b"")
                continue
            if body_size >= _OWN_BUFFER or end - pos > len(scratch):
                try:
                    own = bytearray(body_size)
                except MemoryError:
                    raise FrameError(f"a frame body of {body_size} bytes") from None
                own[:self._have - body_at] = scratch[body_at:self._have]
                self._body, self._header, self._filled = own, header, self._have - body_at
                pos = self._have
            break
        left = self._have - pos
        if pos and left:
            scratch[:left] = scratch[pos:self._have]
        self._have = left
        if left >= PREFIX.size:  # a header bigger than the scratch buffer: a bigger one
            needed = PREFIX.size + PREFIX.unpack_from(scratch, 0)[0]
            if needed > len(scratch):
                grown = bytearray(needed)
                grown[:left] = scratch[:left]
                self._scratch = grown


async def connect(sock, on_frame: Callable[[Any, bytes | bytearray], None], on_lost: Callable[[str], None], *,
                  flush_every_write: bool = False) -> FrameProtocol:
    """A ``FrameProtocol`` on a connected Unix socket. ``flush_every_write``: ``drained`` waits until the
    socket has taken every byte."""
    _, protocol = await asyncio.get_running_loop().create_unix_connection(
        lambda: FrameProtocol(on_frame, on_lost), sock=sock)
    if flush_every_write:
        protocol.transport.set_write_buffer_limits(high=0)
    return protocol

"""The front-to-worker protocol (``service/backends/tenant_channel.py``, ``tenant_frames.py``) on a real socketpair,
the in-place frame reader against asyncio's StreamReader, and cancellation through the protocol.

A cancelled caller must reach the worker as a cancelled task: a program queued behind
another and cancelled at the front never runs, on the per-tenant backend exactly as on
the in-process one (the behaviour routes rely on when a client goes away).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket

import msgpack
import pytest

from remote_autograd.proto import MSGPACK, ProtocolError
from remote_autograd.service.backends.local_sessions import LocalSessions
from remote_autograd.service.ops import load_configured_ops
from remote_autograd.service.engine.program_watch import ProgramWatch
from remote_autograd.service.settings import Settings
from remote_autograd.service.backends.tenant_channel import ChannelClosed, open_channel
from remote_autograd.service.backends.tenant_frames import PREFIX, FrameProtocol
from remote_autograd.service.backends.tenant_processes import TenantProcesses

from ...servers import call, put


async def _pair(handlers: dict):
    ours, theirs = socket.socketpair()
    return await open_channel(ours, {}), await open_channel(theirs, handlers, flush_every_write=True)


def test_bodies_cross_as_they_are_and_only_the_table_is_served():
    async def echo(c) -> None:
        await c.answer({"n": len(c.body), **c.fields}, [c.body[:10], memoryview(c.body)[10:]], flush=True)

    async def main():
        caller, callee = await _pair({"echo": echo})
        body = os.urandom(3 << 20)  # a big one: written in pieces, read whole
        fields, back = await caller.call("echo", {"k": [1, "two"]}, body)
        assert fields == {"n": len(body), "k": [1, "two"]} and back == body
        assert (await caller.call("echo"))[1] == b""
        with pytest.raises(ProtocolError, match="no method '__init__'"):  # names outside the table are refused
            await caller.call("__init__")
        caller.close(), callee.close()

    asyncio.run(main())


SIZES = (0, 1, 100, (64 << 10) - 1, 64 << 10, 200 << 10, 300 << 10, 3 << 20)


def _stream(rng: random.Random) -> tuple[bytes, list]:
    """Frames of every size class back to back, and what each one holds."""
    frames, sent = [], []
    for i, size in enumerate(SIZES * 3):
        header = msgpack.packb([1, i, None, {"pad": "x" * rng.randrange(0, 300)}])
        body = rng.randbytes(size)
        frames.append(PREFIX.pack(len(header), size) + header + body)
        sent.append((msgpack.unpackb(header), body))
    return b"".join(frames), sent


def test_frames_read_in_place_are_what_the_plain_stream_reader_reads():
    rng = random.Random(5)
    stream, sent = _stream(rng)
    got: list = []
    protocol = FrameProtocol(lambda header, body: got.append((header, bytes(body), type(body))), lambda why: None)
    at = 0
    while at < len(stream):  # the socket hands over whatever it has: pieces of any size
        buffer = protocol.get_buffer(-1)
        n = min(len(buffer), rng.choice((1, 7, 4096, 65536, 1 << 20)), len(stream) - at)
        buffer[:n] = stream[at:at + n]
        protocol.buffer_updated(n)
        at += n

    async def plain() -> list:  # the path it stands in for: asyncio's StreamReader
        reader = asyncio.StreamReader(limit=1 << 20)
        reader.feed_data(stream)
        reader.feed_eof()
        frames = []
        for _ in sent:
            header_size, body_size = PREFIX.unpack(await reader.readexactly(PREFIX.size))
            header = msgpack.unpackb(await reader.readexactly(header_size))
            frames.append((header, await reader.readexactly(body_size)))
        return frames

    assert [(h, b) for h, b, _ in got] == asyncio.run(plain()) == sent
    assert all(kind is bytearray for _, body, kind in got if len(body) > 256 << 10)  # big ones: writable, in place


def test_a_peer_that_breaks_the_framing_is_gone():
    async def hang(c) -> None:
        await asyncio.sleep(60)

    async def main():
        ours, theirs = socket.socketpair()
        caller = await open_channel(ours, {})
        waiting = asyncio.ensure_future(caller.call("anything"))
        await asyncio.sleep(0.05)
        theirs.sendall(b"\xff" * 12)  # a header length no peer of ours sends
        with pytest.raises(ChannelClosed, match="a frame of"):
            await waiting
        with pytest.raises(ChannelClosed):
            await caller.call("anything")
        theirs.close()

    asyncio.run(main())


def _body(pid: str, steps: list) -> bytes:
    return msgpack.packb({"id": pid, "steps": steps}, use_bin_type=True)


async def _answer(backend, sid: str, pid: str, steps: list, watch=None) -> tuple[int, dict]:
    """The program's status and body; a refusal raised by the backend as the error body it becomes."""
    try:
        async with backend.answer_program(sid, None, _body(pid, steps), MSGPACK, MSGPACK, watch) as answer:
            return answer.status, msgpack.unpackb(b"".join(bytes(p) for p in answer.parts))
    except ProtocolError as err:
        return err.status, err.answer()


@contextlib.asynccontextmanager
async def _session_on(kind: str):
    """``(backend, session id)`` on a started backend of ``kind``, closed afterwards."""
    load_configured_ops((), test_ops=True)
    settings = Settings(test_ops=True, tenant_processes="on" if kind == "tenant-process" else "off")
    backend = TenantProcesses(settings) if kind == "tenant-process" else LocalSessions(settings)
    backend.start()
    try:
        yield backend, (await backend.create_session(None))["session_id"]
    finally:
        closing = backend.close()
        if closing is not None:
            await closing


@pytest.mark.parametrize("kind", ["inprocess", pytest.param("tenant-process", marks=pytest.mark.slow)])  # a worker process: seconds
def test_a_cancelled_caller_cancels_its_queued_program(kind: str):
    async def main():
        async with _session_on(kind) as (backend, sid):
            first = asyncio.ensure_future(_answer(backend, sid, "p1", [call("_test_sleep", 1.0, out=["s"])]))
            await asyncio.sleep(0.3)
            queued = asyncio.ensure_future(_answer(backend, sid, "p2", [put("x", [1.0])]))
            await asyncio.sleep(0.2)  # p2 waits behind p1 for the session
            queued.cancel()
            assert (await first)[0] == 200
            with pytest.raises(asyncio.CancelledError):
                await queued
            # p2 never ran: x is unknown, and its id is free (a program that ran keeps its id: 409)
            status, body = await _answer(backend, sid, "p3", [{"kind": "fetch", "id": "x"}])
            assert status == 404 and body["error"]["code"] == "unknown_tensor", body
            assert (await _answer(backend, sid, "p2", [put("y", [2.0])]))[0] == 200

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["inprocess", pytest.param("tenant-process", marks=pytest.mark.slow)])  # a worker process: seconds
def test_a_cancelled_watch_stops_the_program_at_its_next_step(kind: str):
    """The route cancels its program's watch when the client disconnects: through a worker process too."""
    async def main():
        async with _session_on(kind) as (backend, sid):
            watch = ProgramWatch(60.0)
            steps = [call("_test_sleep", 0.6, out=["a"]), call("_test_sleep", 0.6, out=["b"])]
            running = asyncio.ensure_future(_answer(backend, sid, "p1", steps, watch))
            await asyncio.sleep(0.2)
            watch.cancel()
            status, body = await running
            assert status == 409 and body["error"]["code"] == "cancelled", body
            fetched = await _answer(backend, sid, "p2", [{"kind": "fetch", "id": "a"}, {"kind": "fetch", "id": "b"}])
            assert fetched[0] == 404 and fetched[1]["error"]["step"] == 1, fetched  # a ran, b never did

    asyncio.run(main())

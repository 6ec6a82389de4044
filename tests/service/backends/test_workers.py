"""``WorkerThreads``, ``read_body`` and ``ProgramSlots`` without HTTP: halves of a program's trip through the server."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from remote_autograd.proto import ProtocolError
from remote_autograd._fill_buffer import FILL_MIN_BYTES
from remote_autograd.service.engine.guards import BodyBytes, ProgramSlots, declared_length, read_body
from remote_autograd.service.backends.workers import WorkerThreads

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_var", default="unset")


def test_each_index_is_one_thread_and_carries_the_callers_context():
    workers = WorkerThreads(2)

    async def main():
        _VAR.set("request-7")
        names = [await workers.run(i % 2, lambda: (threading.current_thread().name, _VAR.get())) for i in range(6)]
        return names

    try:
        names = asyncio.run(main())
    finally:
        workers.shutdown()
    assert {n for n, _ in names[0::2]} == {"remote-autograd-0"}
    assert {n for n, _ in names[1::2]} == {"remote-autograd-1"}
    assert {v for _, v in names} == {"request-7"}


def test_an_exception_reaches_the_caller_and_the_thread_lives_on():
    workers = WorkerThreads(1)

    def fail():
        raise ValueError("boom")

    async def main():
        with pytest.raises(ValueError, match="boom"):
            await workers.run(0, fail)
        return await workers.run(0, lambda x: x + 1, 41)

    try:
        assert asyncio.run(main()) == 42
    finally:
        workers.shutdown()


def _receiver(*messages):
    queue = list(messages)

    async def receive():
        return queue.pop(0)

    return receive


def _body(data: bytes, more: bool = False) -> dict:
    return {"type": "http.request", "body": data, "more_body": more}


@pytest.mark.parametrize("declared", ["10", None])
def test_read_body_joins_pieces_with_or_without_a_length(declared):
    receive = _receiver(_body(b"01234", True), _body(b"567", True), _body(b"89"))
    assert bytes(asyncio.run(read_body(receive, declared, declared_length(declared), 100, 5.0))) == b"0123456789"


def test_read_body_returns_a_single_message_as_it_came():
    data = b"x" * 50
    assert asyncio.run(read_body(_receiver(_body(data)), "50", 50, 100, 5.0)) is data


@pytest.mark.parametrize("declared, messages, status, words", [
    ("200", [_body(b"x")], 413, "max_body_bytes=100"),
    (None, [_body(b"x" * 60, True), _body(b"x" * 60)], 413, "max_body_bytes=100"),
    ("5", [_body(b"0123456789")], 400, "longer than its Content-Length 5"),
    ("10", [_body(b"01234")], 400, "Content-Length said 10"),
    ("10", [_body(b"01234", True), {"type": "http.disconnect"}], 400, "disconnected after 5 bytes"),
])
def test_read_body_refuses_what_does_not_fit(declared, messages, status, words):
    with pytest.raises(ProtocolError) as info:
        asyncio.run(read_body(_receiver(*messages), declared, declared_length(declared), 100, 5.0))
    assert info.value.status == status and words in str(info.value)


@pytest.mark.parametrize("nbytes", [10, FILL_MIN_BYTES])
def test_a_declared_body_in_pieces_comes_whole_below_and_above_the_fill_buffers_size(nbytes):
    """Under ``FILL_MIN_BYTES`` a body grows a plain bytearray; from it on, a ``FillBuffer`` (its view)."""
    data = bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256)
    receive = _receiver(_body(data[:7], True), _body(data[7:], True), _body(b""))
    body = asyncio.run(read_body(receive, str(nbytes), nbytes, nbytes, 5.0))
    assert bytes(body) == data and isinstance(body, bytearray if nbytes < FILL_MIN_BYTES else memoryview)


def test_read_body_counts_its_bytes_among_all_bodies_and_gives_them_back_when_it_refuses():
    bodies = BodyBytes(limit=12)
    body = asyncio.run(read_body(_receiver(_body(b"01234", True), _body(b"56789")), "10", 10, 100, 5.0, bodies))
    assert bytes(body) == b"0123456789" and bodies.held == 10  # held until the route has answered
    with pytest.raises(ProtocolError, match="max_body_bytes_in_flight=12"):
        asyncio.run(read_body(_receiver(_body(b"01", True), _body(b"234")), None, None, 100, 5.0, bodies))
    assert bodies.held == 10  # the refused body's first 2 bytes were given back
    with pytest.raises(ProtocolError, match="Content-Length said 5"):
        asyncio.run(read_body(_receiver(_body(b"0", True), _body(b"")), "5", 5, 100, 5.0, bodies))
    assert bodies.held == 10


def test_program_slots_given_back_leave_no_count():
    slots = ProgramSlots(2, per_session=1)
    slots.take("s1", "t")
    with pytest.raises(ProtocolError, match="max_programs_per_session=1"):
        slots.take("s1", "t")
    slots.take("s2", "t")
    with pytest.raises(ProtocolError, match="max_concurrent_programs=2"):
        slots.take("s3", None)
    slots.give("s1", "t")
    assert slots.busy == 1 and slots.held_by("t") == 1
    slots.give("s2", "t")
    assert slots.busy == 0 and slots.held_by("t") == 0 and not slots._sessions and not slots._tokens


def test_sessions_go_to_the_least_loaded_thread_lowest_first():
    workers = WorkerThreads(3)
    try:
        assert workers.least_loaded([]) == 0
        assert workers.least_loaded([0]) == 1
        assert workers.least_loaded([0, 1]) == 2
        assert workers.least_loaded([0, 1, 2, 0]) == 1
        assert workers.least_loaded([1, 2]) == 0  # the session on 0 closed: the next one takes its place
    finally:
        workers.shutdown()

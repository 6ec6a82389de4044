"""``WorkerThreads`` and ``read_body`` without HTTP: the two halves of a program's trip through the server."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from remote_autograd.proto import ProtocolError
from remote_autograd.service.engine.guards import declared_length, read_body
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

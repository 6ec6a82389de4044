"""``FillBuffer`` (``remote_autograd/_fill_buffer.py``), the speed path of reading a body with a
known length, holds what the plain path (a ``bytearray`` grown piece by piece) holds."""

from __future__ import annotations

import threading
import time

import pytest

from remote_autograd import _fill_buffer as fill
from remote_autograd._fill_buffer import FillBuffer


def _pieces(nbytes: int, piece: int) -> list[bytes]:
    """Uneven pieces of a pattern that differs at every offset of a page (a misplaced piece shows)."""
    pattern = bytes((i * 7 + i // 251) % 256 for i in range(piece))
    out, left = [], nbytes
    while left:
        size = min(left, piece - (len(out) % 3) * 17)  # pieces of three lengths, as sockets deliver them
        out.append(pattern[:size])
        left -= size
    return out


def _wait_for_populate_threads(seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while any(t.name == "remote-autograd-populate" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("nbytes", [0, 1, 4095, fill.FILL_MIN_BYTES - 1, fill.FILL_MIN_BYTES, fill._POPULATE_MIN_BYTES + 12345],
                         ids=["empty", "one", "under-a-page", "small-bytearray", "torch-backed", "populated-ahead"])
def test_a_fill_buffer_holds_what_a_plain_bytearray_fill_holds(nbytes):
    pieces = _pieces(nbytes, 65536)
    plain = bytearray()
    for piece in pieces:
        plain += piece
    fast = FillBuffer(nbytes)
    for piece in pieces:
        fast.append(piece)
    _wait_for_populate_threads()
    assert fast.filled == len(plain) == nbytes
    assert fast.view.nbytes == nbytes and bytes(fast.view) == bytes(plain)


def test_a_big_buffer_keeps_what_is_written_while_its_pages_are_mapped_ahead():
    size = fill._POPULATE_AHEAD * 2
    buf = FillBuffer(size)
    pattern = bytes(range(256)) * 4096  # 1 MiB
    for _ in range(size // len(pattern)):  # written while the populating thread runs
        buf.append(pattern)
    _wait_for_populate_threads()
    assert buf.filled == size
    assert all(buf.view[start:start + len(pattern)] == pattern for start in range(0, size, len(pattern)))


def test_the_pages_of_a_stalled_buffer_are_not_all_mapped_and_the_helper_stops_with_it():
    if fill._madvise() is None:
        pytest.skip("no madvise here")
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * fill.mmap.PAGESIZE  # noqa: E731
    before = rss()
    buf = FillBuffer(fill._POPULATE_AHEAD * 4)  # nothing is ever appended
    time.sleep(0.3)
    assert rss() - before <= fill._POPULATE_AHEAD + fill._POPULATE_STEP
    del buf
    _wait_for_populate_threads(5)
    assert not any(t.name == "remote-autograd-populate" for t in threading.enumerate())


def test_a_buffer_that_got_a_few_bytes_maps_a_few_pages_not_its_whole_claim():
    # a body that claims 256 MiB and sends 10 bytes must not cost 64 MiB of mapped pages (it did:
    # 32 such connections held 2 GB); the helper maps only as far ahead as the filling has come
    if fill._madvise() is None:
        pytest.skip("no madvise here")
    rss = lambda: int(open("/proc/self/statm").read().split()[1]) * fill.mmap.PAGESIZE  # noqa: E731
    before = rss()
    buf = FillBuffer(fill._POPULATE_AHEAD * 4)
    buf.append(b"0123456789")
    time.sleep(0.3)
    assert rss() - before <= 1 << 20
    buf.append(bytes(4 << 20))  # the filling goes on: the mapping follows it, ahead by what was filled
    deadline = time.monotonic() + 5
    while rss() - before < (6 << 20) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (6 << 20) <= rss() - before <= (16 << 20)
    del buf
    _wait_for_populate_threads(5)

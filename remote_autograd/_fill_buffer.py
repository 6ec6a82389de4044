"""``FillBuffer``: memory filled front to back as a body arrives, its pages mapped ahead by a thread.

A speed path. The plain path it stands in for is a ``bytearray`` grown by ``+=`` (or
``bytearray(n)`` filled by slices, then ``bytes``): that zero-fills or re-copies, and
takes a page fault per 4 KiB as the copy first touches fresh memory. A ``FillBuffer``
is not zero-filled, is filled in place (no joining copy, so framed tensors can be
views of it), and for a big one a helper thread maps the pages a little ahead of the
filling (``madvise(MADV_POPULATE_WRITE)``). It shows in ``make bench``'s ``[bulk]``
lines, "upload (sess.tensor + sync)" (the server reads the body into one) and
"download (x.cpu())" (the SDK reads the answer into one). ``tests/proto/test_fill_buffer.py``
checks it holds what a plain ``bytearray`` fill holds.

It lives at the package top, not in ``proto`` (the wire format: what both sides agree
on) nor in ``service`` or ``client`` (which never import each other): both the server
(``service/engine/guards.py``, ``read_body``) and the SDK (``client/transport/_transport.py``) use it,
and it is about memory, not the protocol.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import threading
import time
import weakref
from typing import Any


class FillBuffer:
    """``nbytes`` of memory that its owner fills front to back with ``append``; ``view`` is all of it.

    Not zero-filled first (``bytearray(n)`` would touch every page twice); the owner overwrites
    all of it or drops it. A big one has its pages mapped by a thread of its own a little ahead
    of the filling: copying pieces into fresh memory takes a page fault per 4 KiB (2.1 GB/s
    here, 11 GB/s into mapped pages). Never further past the filling than what has been filled
    (and never more than ``_POPULATE_AHEAD``): the memory a body holds grows with the bytes that
    arrived, at most twice them, so a client that claims 1 GiB and sends 10 bytes holds a page,
    and a steady upload still finds its pages mapped once its first megabytes are in. (The
    memory itself is reserved but not touched: pages the filling never reaches are never mapped.)
    """

    def __init__(self, nbytes: int) -> None:
        self.filled = 0
        if nbytes < FILL_MIN_BYTES:  # small: a plain bytearray is cheaper than a torch-backed buffer (the
            # server's ``read_body`` grows a plain bytearray for a body this small, without one of these)
            self.view = memoryview(bytearray(nbytes))
            return
        import torch

        memory = torch.empty(nbytes, dtype=torch.uint8)
        self.view = memoryview(memory.numpy()).cast("B")
        madvise = _madvise() if nbytes >= _POPULATE_MIN_BYTES else None
        if madvise is not None:
            threading.Thread(target=_populate_ahead, args=(madvise, weakref.ref(self), memory.data_ptr(), nbytes),
                             name="remote-autograd-populate", daemon=True).start()

    def append(self, piece: bytes | memoryview) -> None:
        end = self.filled + len(piece)
        self.view[self.filled:end] = piece
        self.filled = end


FILL_MIN_BYTES = 1 << 20  # below this a FillBuffer is a plain bytearray
_POPULATE_MIN_BYTES = 8 << 20
_POPULATE_STEP = 8 << 20
_POPULATE_AHEAD = 64 << 20
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: map pages writable without writing to them


def _populate_ahead(madvise: Any, owner: "weakref.ref[FillBuffer]", start: int, nbytes: int) -> None:
    """Map the pages of ``[start, start + nbytes)`` front to back, never further past the filling
    than ``_populate_target`` allows, until done or the buffer is dropped. Contents are never
    touched: racing the writer is safe."""
    page = mmap.PAGESIZE
    offset, end = -(-start // page) * page, (start + nbytes) // page * page  # madvise wants whole pages
    while offset < end:
        buffer = owner()  # held during the call: the memory stays mapped
        if buffer is None:
            return
        ahead = _populate_target(start, buffer.filled, page)
        if offset >= ahead:
            del buffer
            time.sleep(0.001)
            continue
        step = min(_POPULATE_STEP, end - offset, ahead - offset)
        if madvise(offset, step, _MADV_POPULATE_WRITE) != 0:
            return  # not supported here: the writer's own page faults do it
        offset += step
        del buffer


def _populate_target(start: int, filled: int, page: int) -> int:
    """Where the mapping may reach now: as far past the filling as the filling has come (never more
    than ``_POPULATE_AHEAD``), rounded up to a page; nothing before the first byte arrives."""
    if not filled:
        return start
    reach = start + filled + min(filled, _POPULATE_AHEAD)
    return -(-reach // page) * page


@functools.lru_cache(maxsize=1)
def _madvise() -> Any:
    """libc's ``madvise`` through ctypes (which lets other threads run during the call), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn

"""The user's line of an op that torch's own code called, without walking the whole stack for each op.

Plain path: ``_callsite.where()`` walks from the op up through torch's frames and ours to the
first frame of the user's; for every op of an optimizer's step or of ``clip_grad_norm_`` that
is a dozen frames (the optimizer, its wrappers, torch's dynamo guards), each made into a
frame object as it is read.

Speed path: remember the torch frame that called the last op and the line found above it.
While that same frame object is the one calling again, it has been running all along, so
every frame above it is still suspended in the same call and the user's line is the same:
the answer is one identity check. A frame that can be suspended and resumed from another
caller (a generator or coroutine) is never remembered. The frame is held (with its locals)
until another frame replaces it or the session sends its queue (``forget``), so that a
tensor dropped in between is still freed in the same program.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Iterator

from ._callsite import _KIND_OF_CODE, TORCHS, USER, frame_kind, user_line

_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
_last: tuple = (None, None)  # (torch's frame that called the last op, the user's line above it)
_checking = False


def where() -> str | None:
    """What ``_callsite.where()`` answers for the current call."""
    global _last
    f = sys._getframe(2)
    while f is not None:
        code = f.f_code
        known = _KIND_OF_CODE.get(id(code))  # frame_kind's own cache, read here: no call per frame
        kind = known[1] if known is not None else frame_kind(code)
        if kind == USER:  # the op's caller is the user's own code: nothing above it to walk
            return f"{code.co_filename}:{f.f_lineno}"
        if f is _last[0]:
            if _checking:
                _check(_last[1], user_line(f))
            return _last[1]
        if kind == TORCHS and not code.co_flags & _RESUMABLE:
            line = user_line(f)
            _last = (f, line)
            return line
        f = f.f_back
    return None


def forget() -> None:
    """Let go of the remembered frame (the session is about to send its queue)."""
    global _last
    _last = (None, None)


@contextlib.contextmanager
def verifying() -> Iterator[None]:
    """Every remembered answer is also walked for (the plain path); a difference raises ``AssertionError``."""
    global _checking
    before, _checking = _checking, True
    try:
        yield
    finally:
        _checking = before


def _check(kept: str | None, walked: str | None) -> None:
    if kept != walked:
        raise AssertionError(f"caller memo: {kept} remembered, {walked} walked")

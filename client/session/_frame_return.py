"""A check run as a given Python frame returns, with the thread's state of that moment.

Why: a user's ``autograd.Function`` runs its forward with grad mode off whatever the caller's
mode was (torch's C++ ``apply`` turns it off and restores it as it returns). Inside the forward
nothing tells ``with torch.no_grad(): F.apply(x)`` from ``F.apply(x)``: torch keeps the
caller's mode in a C++ guard on its stack. The Python frame of ``Function.apply`` returns just
after that guard has restored it, so a check run at that return reads the caller's mode with
``torch.is_grad_enabled()``.

How: ``sys.setprofile`` (the current thread's) is the hook Python gives on a frame's return
without changing anyone's code; it is set only while a frame is watched, and unset at the last
watched frame's return. A check that raises makes that frame raise (its caller sees the error
at its own line) and Python unsets the profile function. Where another profile function is set
already (cProfile, a tracer), ``watch`` declines: the caller decides without it.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any, Callable

_local = threading.local()  # .watched: id(frame) -> (frame, check), this thread's


def watch(frame: FrameType, check: Callable[[Any], None], abandon: Callable[[], None] | None = None) -> bool:
    """Run ``check(returned value)`` as ``frame`` returns (``None`` when it raises); False if another
    profile function is set (nothing is watched then). A frame already watched keeps its first check.
    ``abandon()`` runs instead if the watch ends before ``frame`` returns (another check raised)."""
    watched = _watched()
    if id(frame) in watched:
        return True
    current = sys.getprofile()
    if current is not None and current is not _on_event:
        return False
    watched[id(frame)] = (frame, check, abandon)
    if current is None:
        sys.setprofile(_on_event)
    return True


def watching(frame: FrameType) -> bool:
    """Whether ``frame`` is watched (by this thread)."""
    return id(frame) in _watched()


def _watched() -> dict:
    watched = getattr(_local, "watched", None)
    if watched is None:
        watched = _local.watched = {}
    return watched


def _on_event(frame: FrameType, event: str, arg: Any) -> None:
    if event != "return":
        return
    watched = _local.watched
    entry = watched.get(id(frame))
    if entry is None or entry[0] is not frame:
        return
    del watched[id(frame)]
    if not watched:
        sys.setprofile(None)
    try:
        entry[1](arg)
    except BaseException:
        # Python unsets a profile function that raises: nothing is watched any more
        abandoned = [e[2] for e in watched.values() if e[2] is not None]
        watched.clear()
        for abandon in abandoned:
            abandon()
        raise


ON_EVENT_CODE = _on_event.__code__  # a frame running it is the profile callback of a watched frame's return

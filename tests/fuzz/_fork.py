"""The value fuzz's cases run in forked children: a crash, a stuck kernel or a corrupted heap ends a child, never the run.

The parent has torch, the op table and the base calls loaded (on one thread: no thread pool to
inherit); each child is a ``fork`` of it that runs a list of cases of one op in turn and reports
each case's answer as a line on a pipe. A child that dies mid-case (a signal, or an exit without its
answer) leaves that case a ``crash``; one silent for ``CASE_SECONDS`` is killed, its case ``slow``.
The rest of its list goes on in a new child. A case that crashed after others in the same child
is run again alone: a heap written by an earlier case can fail a later one's ``free()``, and the
record says which (``alone``). Children run under an address-space limit, so a kernel's huge
temporary fails its allocation (an error, as on a real worker with its memory limit) instead of
taking the machine.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

CASE_SECONDS = 10.0
HEADROOM = 3 << 30  # address space a child may take beyond the parent's


@dataclass
class _Child:
    pid: int
    fd: int
    cases: list[int]  # what it was given, in order
    done: int = 0  # answers read
    since: float = field(default_factory=time.monotonic)
    buffer: bytes = b""
    rerun: bool = False  # one case that crashed after others, run again on its own
    hung: bool = False


def run_all(units: list[list[int]], one: Callable[[int], dict], jobs: int,
            progress: Callable[[int, dict], None] | None = None) -> dict[int, dict]:
    """Each case of ``units`` (lists of case numbers run in one child, in order) answered by
    ``one(case)`` in a child: {case: answer}; a crash's or a slow case's answer is made here."""
    answers: dict[int, dict] = {}
    queue = deque((u, False) for u in units if u)
    sel = selectors.DefaultSelector()
    children: dict[int, _Child] = {}
    limit = _address_space() + HEADROOM
    while queue or children:
        while queue and len(children) < jobs:
            cases, rerun = queue.popleft()
            child = _start(cases, one, limit)
            child.rerun = rerun
            children[child.fd] = child
            sel.register(child.fd, selectors.EVENT_READ)
        for key, _ in sel.select(timeout=1.0):
            child = children[key.fd]
            chunk = os.read(child.fd, 1 << 16)
            if chunk:
                child.buffer += chunk
                *lines, child.buffer = child.buffer.split(b"\n")
                for line in lines:
                    case = child.cases[child.done]
                    if child.rerun:  # it did not crash on its own: an earlier case broke the heap
                        answers[case]["alone"] = False
                    else:
                        answers[case] = json.loads(line)
                    child.done += 1
                    child.since = time.monotonic()
                    if progress:
                        progress(case, answers[case])
                continue
            sel.unregister(child.fd)
            del children[child.fd]
            os.close(child.fd)
            _ended(child, _wait(child.pid), answers, queue, progress)
        for child in list(children.values()):
            if time.monotonic() - child.since > CASE_SECONDS:
                os.kill(child.pid, signal.SIGKILL)
                child.since = float("inf")  # its pipe closes next: _ended says slow
                child.hung = True
    return answers


def _ended(child: _Child, status: int, answers: dict, queue: deque, progress) -> None:
    if child.done == len(child.cases):
        return
    case = child.cases[child.done]
    if child.rerun:
        answers[case]["alone"] = True
        return
    if child.hung:
        answer = {"outcome": "slow", "detail": f"no answer in {CASE_SECONDS:.0f} s (killed)"}
    elif os.WIFSIGNALED(status):
        answer = {"outcome": "crash", "detail": signal.Signals(os.WTERMSIG(status)).name}
    else:
        answer = {"outcome": "crash", "detail": f"exit status {os.WEXITSTATUS(status)}"}
    if child.done == 0:  # the first case of a fresh child: it did it on its own
        answer["alone"] = True
    elif answer["outcome"] == "crash":
        queue.appendleft(([case], True))  # again on its own: does it crash by itself?
    answers[case] = answer
    if progress:
        progress(case, answer)
    rest = child.cases[child.done + 1:]
    if rest:
        queue.appendleft((rest, False))


def _start(cases: list[int], one: Callable[[int], dict], limit: int) -> _Child:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # glibc's "free(): invalid pointer" and torch's warnings: the answer says what happened
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            for case in cases:
                line = json.dumps(one(case)).encode() + b"\n"
                os.write(write, line)
        except BaseException:  # a failure of the harness itself: the parent sees a crash with this status
            code = 3
        os._exit(code)
    os.close(write)
    return _Child(pid, read, cases)


def _wait(pid: int) -> int:
    return os.waitpid(pid, 0)[1]


def _address_space() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))

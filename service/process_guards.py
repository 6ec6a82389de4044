"""What the server's processes set on themselves so that one tenant's process can reach no other's (Linux).

- ``die_with_parent``: a tenant's worker process is killed (SIGKILL) when its front dies,
  whatever it is doing (``PR_SET_PDEATHSIG``). The front may die before the worker gets
  to ask for that, so the worker also checks that its parent is still the process that
  started it, and exits at once if not. Without it, a worker whose front was killed kept
  running its kernel until the kernel ended, for minutes.
- ``forbid_reading``: the process is not dumpable (``PR_SET_DUMPABLE`` 0). Its
  ``/proc/<pid>/environ``, ``mem``, ``maps`` and ``fd`` then belong to root: another
  process of the same user (a tenant's worker, where a kernel bug may run an attacker's
  reads) cannot read the front's tokens or memory, nor another worker's tensors, and
  cannot attach a debugger to it. What it costs: no core dump, and a profiler that
  attaches (``py-spy``) needs root (``py-spy --pid`` under sudo, or ``CAP_SYS_PTRACE``).
  ``/proc/<pid>/status`` and ``cmdline`` stay readable (memory figures, process lists).
- ``drop_privileges``: a worker started by a front running as root keeps uid 0 (the files
  it writes, the state volume, stay the front's) but gives up every capability, for good
  (the bounding set too, and no new privileges on exec). Without ``CAP_SYS_PTRACE`` and
  ``CAP_DAC_*`` root is one more user: a non-dumpable process is closed to it. (The image
  runs as uid 10001: nothing to drop there.)
- ``limit_data``: ``RLIMIT_DATA``, the private writable memory of the process (its heap,
  every anonymous mapping a kernel's temporaries live in, thread stacks), so that a
  kernel's hidden copy fails inside that process (the allocator refuses it: a ``507``)
  or ends it, never the host. Not ``RLIMIT_AS``: that counts address space merely
  reserved, which grows by 64 MiB per thread with glibc's arenas (a worker with eight
  threads reserved 1 GiB more and used 85 MiB more), and CUDA reserves far more.

Elsewhere than Linux each does nothing and answers False.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import signal
import sys

log = logging.getLogger("remote_autograd.service")

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _prctl(option: int, value: int, quiet: bool = False) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        if not quiet:
            log.warning("prctl(%d, %d) failed: %s", option, value, os.strerror(ctypes.get_errno()))
        return False
    return True


def drop_privileges() -> bool:
    """Give up every capability of this process (and of what it may execute), keeping its uid."""
    if not sys.platform.startswith("linux"):
        return False
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if not _has_capabilities():
        return True
    cap = 0
    while _prctl(_PR_CAPBSET_DROP, cap, quiet=True):  # until EINVAL: past the kernel's last capability
        cap += 1
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, quiet=True)
    header, data = _CapHeader(_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.capset(ctypes.byref(header), data) != 0:
        log.error("capset failed: %s; this worker keeps its capabilities", os.strerror(ctypes.get_errno()))
        return False
    return True


def _has_capabilities() -> bool:
    try:
        with open("/proc/self/status") as status:
            return any(int(line.split()[1], 16) for line in status if line.startswith(("CapEff:", "CapPrm:")))
    except (OSError, ValueError):
        return os.geteuid() == 0


def guard_worker(parent: int) -> None:
    """All of the above that a tenant's worker sets on itself, before it imports torch (which starts
    a thread: capabilities are dropped per thread, so no other thread may exist yet)."""
    drop_privileges()
    forbid_reading()
    die_with_parent(parent)


def die_with_parent(parent: int) -> bool:
    """SIGKILL this process when its parent dies; exit now if ``parent`` (its pid) is gone already."""
    armed = _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the prctl (we were reparented): nobody will tell us
        os._exit(0)
    return armed


def forbid_reading() -> bool:
    """Close this process's ``/proc`` files and memory to every other process of its user."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def data_bytes() -> int:
    """This process's private writable memory now (``VmData``), in bytes; 0 where unknown."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))
    except (OSError, StopIteration, ValueError):
        return 0


def limit_data(limit: int) -> bool:
    """``RLIMIT_DATA`` of this process (and what it starts) at ``limit`` bytes."""
    if not sys.platform.startswith("linux") or limit <= 0:
        return False
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return True


def stack_bytes() -> int:
    """What each new thread's stack takes (counted by ``RLIMIT_DATA``): the stack limit, 8 MiB when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return soft if 0 < soft < (1 << 30) else 8 << 20

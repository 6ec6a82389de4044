"""Test-only ops, registered only when ``Settings.test_ops`` is on (never in production).

They exercise paths real ops reach only by bad luck: device out of memory (507), a
step failing at a chosen place (atomicity), a long-running step (concurrency,
graceful shutdown; one that keeps the interpreter's lock as some kernels do), a kernel
crashing the process that runs it (a tenant's worker process: only that tenant loses its
sessions), and a kernel reading what its process can reach of ``/proc`` (what a heap bug
in a tenant's worker could read: its front's environment and memory, its own
environment). Names start with ``_test`` so the generated op tests skip them.
"""

from __future__ import annotations

import ctypes
import os
import time

import torch

from remote_autograd.proto import DTYPES, dtype_name, torch_globals
from remote_autograd.proto.messages import TorchGlobals

from ._registry import OP_TABLE, op
from ._context import current


def _nothing_to_check(*args, **kwargs) -> None:
    """The test ops' contract: they call no kernel with their arguments, and must not run on meta
    (a sleep or an injected failure would happen twice)."""


_TEST_OP = dict(reference=None, exact=False, differentiable=False, shape_rule="none", check=_nothing_to_check)
_MAX_SLEEP_SECONDS = 30.0


class _FailInBackward(torch.autograd.Function):
    """Identity forward; a backward that raises once autograd reaches it (mid-way through a backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("_test_fail: injected failure in backward")


def _test_oom(input, host=False):
    """always raises torch.OutOfMemoryError, or with ``host=True`` Python's MemoryError (the 507 path)"""
    if host:
        raise MemoryError("cannot allocate 1024.00 GiB (test op)")
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB (test op)")


def _test_fail(input=None, when="forward"):
    """raises at once (``when="forward"``), or returns ``input`` and raises in its backward"""
    if when == "backward" and isinstance(input, torch.Tensor):
        return _FailInBackward.apply(input)
    raise RuntimeError("_test_fail: injected failure")


def _test_sleep(seconds, hold_gil=False):
    """sleeps ``seconds`` (at most 30) in the worker, then returns a zero scalar; ``hold_gil=True``
    keeps the interpreter's lock meanwhile, as a kernel that never releases it does (nothing else
    of the process's Python runs: its event loop neither)"""
    seconds = min(max(float(seconds), 0.0), _MAX_SLEEP_SECONDS)
    if hold_gil:
        ctypes.PyDLL(None).usleep(int(seconds * 1e6))  # a PyDLL call keeps the GIL
    else:
        time.sleep(seconds)
    return torch.zeros((), device=current().device)


_PROC_FILES = {"front_environ": "/proc/{parent}/environ", "front_mem": "/proc/{parent}/mem",
               "own_environ": "/proc/self/environ"}


def _test_read_proc(what):
    """the bytes of ``/proc`` file ``what`` (``front_environ``, ``front_mem``: of the process that
    started this one, its front; ``own_environ``) as a uint8 tensor: at most 1 MiB (``front_mem``:
    its first readable page, a heap address past its start). Raises naming the error if unreadable"""
    if not isinstance(what, str) or what not in _PROC_FILES:
        raise ValueError(f"_test_read_proc: what is one of {sorted(_PROC_FILES)}")
    path = _PROC_FILES[what].format(parent=os.getppid())
    try:
        with open(path, "rb") as f:
            if what == "front_mem":
                f.seek(_first_heap_address(os.getppid()))
                data = f.read(4096)
            else:
                data = f.read(1 << 20)
    except OSError as exc:
        raise RuntimeError(f"_test_read_proc: {type(exc).__name__}: {exc.strerror}: {path}") from None
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone().to(current().device)


def _first_heap_address(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return next(int(line.split("-")[0], 16) for line in maps if "[heap]" in line)
    except (OSError, StopIteration):
        return 0x10000  # maps unreadable too: an address anyway, for the read to say what mem allows


def _test_abort(input=None):
    """ends the process running it at once (``os.abort``: SIGABRT, no cleanup), as a crashing kernel does"""
    os.abort()


def _test_torch_globals():
    """the server's process-global torch settings as the step runs, in ``proto/torch_globals.py``'s
    order: each a number (the default dtype and the matmul precision by their index among the wire's names)"""
    dtype, *flags = torch_globals.read()
    precision = TorchGlobals.model_fields["float32_matmul_precision"].annotation.__args__.index(flags[3])
    values = [list(DTYPES).index(dtype_name(dtype)), *flags[:3], precision, *flags[4:]]
    return torch.tensor([int(v) for v in values], device=current().device)


for _fn in (_test_oom, _test_fail, _test_sleep, _test_abort, _test_read_proc, _test_torch_globals):
    if _fn.__name__ not in OP_TABLE:  # the module may be imported by several apps of one process
        op(_fn.__name__, **_TEST_OP)(_fn)

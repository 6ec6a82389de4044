"""Test-only ops, registered only when ``Settings.test_ops`` is on (never in production).

They exercise paths real ops reach only by bad luck: device out of memory (507), a
step failing at a chosen place (atomicity), a long-running step (concurrency,
graceful shutdown), and a kernel crashing the process that runs it (a tenant's
worker process: only that tenant loses its sessions). Names start with ``_test`` so the generated op tests skip them.
"""

from __future__ import annotations

import os
import time

import torch

from remote_autograd.proto import DTYPES, dtype_name, torch_globals
from remote_autograd.proto.messages import TorchGlobals

from . import OP_TABLE, op
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


def _test_sleep(seconds):
    """sleeps ``seconds`` (at most 30) in the worker, then returns a zero scalar"""
    time.sleep(min(max(float(seconds), 0.0), _MAX_SLEEP_SECONDS))
    return torch.zeros((), device=current().device)


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


for _fn in (_test_oom, _test_fail, _test_sleep, _test_abort, _test_torch_globals):
    if _fn.__name__ not in OP_TABLE:  # the module may be imported by several apps of one process
        op(_fn.__name__, **_TEST_OP)(_fn)

"""Test-only ops, registered only when ``Settings.test_ops`` is on (never in production)."""

from __future__ import annotations

import torch

from .ops import OP_TABLE, op

if "_test_oom" not in OP_TABLE:

    @op("_test_oom", reference=None, exact=False, differentiable=False, shape_rule="none")
    def _test_oom(input):
        """always raises torch.OutOfMemoryError (exercises the 507 path)"""
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 GiB (test op)")

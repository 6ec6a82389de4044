"""What an op may know about the program running it: the session's generator and device.

Set (``CURRENT.set``, ``CURRENT.reset``) by the runner around a program's steps, and around a meta
run or a recomputation (a context variable, so worker threads never mix sessions); read by random
ops and factories (``current``). What it holds has a ``RunContext``'s three attributes: the runner
sets its ``ProgramRun`` itself (``engine.values``), no object of its own per program.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RunContext:
    generator: torch.Generator
    device: torch.device
    max_elements: int | None = None  # the session's max_tensor_elements: factories check it first


CURRENT: ContextVar = ContextVar("remote_autograd_run_context", default=None)  # a RunContext, or its like


def current() -> RunContext:
    ctx = CURRENT.get()
    if ctx is None:  # outside a program (tests calling ops directly): process defaults
        return RunContext(torch.default_generator, torch.device("cpu"))
    return ctx


def torch_fills_uninitialised() -> bool:
    """Whether torch fills the memory it hands out uninitialised itself (NaN, an integer's largest
    value), as under deterministic algorithms (``torch.utils.deterministic.fill_uninitialized_memory``,
    the program's ``torch_globals``); otherwise the server zeroes it (memory a session receives never
    shows another's data)."""
    return torch._C._get_deterministic_algorithms() and torch._C._get_deterministic_fill_uninitialized_memory()

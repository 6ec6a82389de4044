"""What an op may know about the program running it: the session's generator and device.

Set by the runner around each step (a context variable, so worker threads never mix
sessions); read by random ops and factories.
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


_CURRENT: ContextVar[RunContext | None] = ContextVar("remote_autograd_run_context", default=None)


def current() -> RunContext:
    ctx = _CURRENT.get()
    if ctx is None:  # outside a program (tests calling ops directly): process defaults
        return RunContext(torch.default_generator, torch.device("cpu"))
    return ctx


def set_current(ctx: RunContext | None):
    return _CURRENT.set(ctx)


def reset(token) -> None:
    _CURRENT.reset(token)


def torch_fills_uninitialised() -> bool:
    """Whether torch fills the memory it hands out uninitialised itself (NaN, an integer's largest
    value), as under deterministic algorithms (``torch.utils.deterministic.fill_uninitialized_memory``,
    the program's ``torch_globals``); otherwise the server zeroes it (memory a session receives never
    shows another's data)."""
    return torch._C._get_deterministic_algorithms() and torch._C._get_deterministic_fill_uninitialized_memory()

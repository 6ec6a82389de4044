"""A step's cost, known before its kernel runs, and held to the step's budget (DESIGN principle 4).

Meta sees shapes, and shapes say how much a kernel will do: a ``conv2d`` of two ``expand``ed
one-element tensors (a 2048x2048 image, a 1024x1024 kernel) holds 4 MiB and runs 2.2e12 FLOPs,
eight minutes on a CPU. ``meta_check`` derives each call on meta under ``counting()``, a dispatch
mode that charges every aten op the call reaches its work (``cost_formulas``: torch's own FLOP
formulas, ours, or the elements it touches); the count is memoized with the call's layouts, so a
repeated call, a replayed plan (``program_plan``) and a CUDA graph's replay (``graph_steps``,
which records its calls' costs at capture) know it without a meta run. A data-dependent call,
whose outputs meta cannot say, is charged from its bound (``bounded``).

``hold`` holds a call's cost, before its kernel runs, to ``max_step_flops`` (413 ``too_large``
naming it) and to the time its program has left: ``max_program_seconds`` less the time it has run,
at the device's rate ``device_flops_per_second`` (413 ``time_limit``): a step that could not end in
time does not start. ``settings.py`` has each device's defaults, ``docs/limits.md`` how they were
chosen.
"""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from remote_autograd.proto import ErrorCode, ProtocolError

from . import cost_formulas

# work a call may start with whatever time its program has left (see ``hold``): up to it (within the
# budget: ``ProgramRun.untimed``), the runner does not ask ``hold`` at all (most calls are far below)
UNTIMED_SECONDS = 0.01


class _Counting(TorchDispatchMode):
    """Charges each aten op run under it its work (on meta: no kernel runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.flops += cost_formulas.work(func, args, kwargs, out)
        return out


def counting() -> _Counting:
    """A dispatch mode whose ``flops`` is the work of the aten ops run under it so far."""
    return _Counting()


def touched(args: list, kwargs: dict) -> float:
    """The cost of a call not derived on meta (an entry of our own, checked by its contract): the
    elements of its arguments."""
    return cost_formulas.ELEMENT_FLOPS * (cost_formulas.elements(args) + cost_formulas.elements(list(kwargs.values())))


def bounded(name: str, args: list, kwargs: dict, elements: int) -> float:
    """The cost of a call of data-dependent entry ``name`` whose outputs are bounded to ``elements``."""
    return cost_formulas.bounded_work(name, tuple(args), kwargs, elements)


def in_time(run: Any, flops: float) -> bool:
    """Whether the time ``run``'s program has left is worth ``flops`` at the device's rate: ``hold``'s test,
    for the work of many calls run at once (a CUDA graph's replay, a template run as its graph)."""
    watch = run.watch
    return watch is None or flops <= watch.left() * run.settings.device_flops_per_second


def hold(run: Any, op: str, flops: float) -> None:
    """Refuse (413) call ``op`` of ``run`` (a ``ProgramRun``) when its ``flops`` are over the step's
    budget or more than its program's time left is worth at the device's rate. A call of less than
    ``UNTIMED_SECONDS`` of work is not held to the time left: the watch stops its program before
    the next step (a step is never cut short)."""
    settings = run.settings
    if flops > settings.max_step_flops:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{op}: about {flops:.3g} FLOPs of work: limit "
                            f"max_step_flops={settings.max_step_flops}; it did not start")
    rate = settings.device_flops_per_second
    watch = run.watch
    if flops > rate * UNTIMED_SECONDS and watch is not None:  # most calls: too short to ask the clock
        left = watch.left()
        if flops > left * rate:
            raise ProtocolError(ErrorCode.TIME_LIMIT, f"{op}: about {flops:.3g} FLOPs of work, {flops / rate:.3g} s "
                                f"at device_flops_per_second={rate:g}, more than the {max(0.0, left):.3g} s left of "
                                f"max_program_seconds={watch.seconds}; it did not start, the steps before it stay "
                                "done")

"""Sample inputs declared by op entries; the test suite is generated from them.

A ``T`` is a recipe for a tensor, materialised per test in the dtype under
test (float specs) or a fixed dtype (index/bool specs), from a seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class T:
    """A sample tensor: shape, value range, and whether gradients flow into it."""

    shape: tuple[int, ...]
    low: float = -2.0
    high: float = 2.0
    dtype: str | None = None  # None: the floating dtype under test
    requires_grad: bool = True
    noncontiguous: bool = False
    integers: bool = False  # float values rounded to integers (ties/plateaus tests)

    def make(self, float_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
        dtype = _dtype_named(self.dtype) if self.dtype else float_dtype
        shape = tuple(reversed(self.shape)) if self.noncontiguous else self.shape
        base = torch.rand(shape, generator=gen, dtype=torch.float64)
        base = self.low + (self.high - self.low) * base
        if self.integers or not dtype.is_floating_point:
            base = base.floor()
        t = base.to(dtype)
        if self.noncontiguous:
            t = t.permute(*reversed(range(t.dim())))
        if dtype.is_floating_point and self.requires_grad:
            t.requires_grad_(True)
        return t


def _dtype_named(name: str) -> torch.dtype:
    from remote_autograd.proto import dtype_from_name

    return dtype_from_name(name)


@dataclass(frozen=True)
class Sample:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def materialise(self, float_dtype: torch.dtype, seed: int = 0) -> tuple[tuple, dict]:
        gen = torch.Generator().manual_seed(seed)
        return _make(self.args, float_dtype, gen), {k: _make(v, float_dtype, gen) for k, v in self.kwargs.items()}


def _make(value: Any, float_dtype: torch.dtype, gen: torch.Generator) -> Any:
    if isinstance(value, T):
        return value.make(float_dtype, gen)
    if isinstance(value, tuple):
        return tuple(_make(v, float_dtype, gen) for v in value)
    if isinstance(value, list):
        return [_make(v, float_dtype, gen) for v in value]
    return value


def S(*args: Any, **kwargs: Any) -> Sample:
    """Shorthand for a ``Sample``: ``S(T((2, 3)), T((3,)), alpha=2)``."""
    return Sample(args, kwargs)

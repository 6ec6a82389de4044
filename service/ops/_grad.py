"""Small helpers shared by backward formulas; all differentiable."""

from __future__ import annotations

from typing import NamedTuple

import torch


class TensorLike(NamedTuple):
    """An input's shape and dtype, kept for backward without keeping the tensor alive."""

    shape: torch.Size
    dtype: torch.dtype


def like_of(x) -> TensorLike | None:
    """What backward needs to know about an input: the tensor's (shape, dtype), or None for a number."""
    return TensorLike(x.shape, x.dtype) if isinstance(x, torch.Tensor) else None


def sum_to(grad: torch.Tensor, like: torch.Tensor | TensorLike | None) -> torch.Tensor | None:
    """``grad`` reduced over broadcast dims to ``like``'s shape and cast to its dtype.

    ``None`` when ``like`` is None (a Python number gets no gradient).
    """
    if like is None or not isinstance(like, (torch.Tensor, TensorLike)):
        return None
    if grad.shape != like.shape:
        grad = grad.sum_to_size(like.shape) if len(like.shape) else grad.sum()
    if grad.dtype != like.dtype and like.dtype.is_floating_point:
        grad = grad.to(like.dtype)
    return grad


def needs(ctx, i: int) -> bool:
    return bool(ctx.needs_input_grad[i])

"""Small helpers several test files share: a bit-for-bit comparison, a plain training loop, and the
copying kernels torch ran."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` is ``want`` bit for bit, laid out alike, and alike in whether it records a graph."""
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), (got, want)
    assert got.requires_grad == want.requires_grad
    as_bytes = lambda t: t.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731  (NaNs compare too)
    assert torch.equal(as_bytes(got), as_bytes(want)), (got, want)


def fit(model, opt, loss_fn, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    """``steps`` plain steps of ``loss_fn(model(x), y)`` on fixed data; the losses, read with ``.item()``."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


COPY_KERNELS = frozenset({"aten::clone", "aten::copy_", "aten::contiguous"})


@contextlib.contextmanager
def torch_copies() -> Iterator[list[str]]:
    """The copying kernels (``COPY_KERNELS``) torch ran inside the block, by name, read from torch's
    profiler (which records every kernel without changing how any is dispatched)."""
    seen: list[str] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield seen
    seen.extend(e.name for e in prof.events() if e.name in COPY_KERNELS)

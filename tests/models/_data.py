"""Batches the way training scripts usually get them: a shuffling ``DataLoader`` over CPU tensors.

The loader shuffles with its own seeded generator, so the batches are the same
on every run and the global generator (which dropout draws from on the CPU) is
left alone.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import torch
from torch.utils.data import DataLoader, TensorDataset


def batches(*tensors: torch.Tensor, batch_size: int, steps: int, seed: int = 0) -> Iterator[list[torch.Tensor]]:
    """``steps`` batches, going round the data set (reshuffled each pass) as often as needed."""
    loader = DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    return itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), steps)

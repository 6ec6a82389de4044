"""``RegionMemo``: what a ``torch.func`` span's meta pass answered, remembered by the layouts of what it reads.

The plain path is ``functorch_regions.run_region``'s meta pass on every run: the span run on meta
stand-ins (torch's checks and batching rules, its work and its tensors' bytes counted), which costs more
than the span itself on small tensors (torch's meta kernels under functorch are Python). A pass that
answered reads nothing but layouts: the shapes, strides, dtypes and ``requires_grad`` of the tensors the
span reads from outside it, the template's numbers (a batch size, sizes), and the default dtype its
factories take. A run whose key was answered before takes that answer (its work held, its bytes reserved
as before); a refusal is never remembered, so a run that was refused is checked again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

_SIZE = 64  # keys per span: a run with another layout (a dynamic batch size) adds one


class Answer(NamedTuple):
    flops: float  # the span's work, held to the step's budget
    made_bytes: int  # its tensors' bytes below functorch's wrappers, as if none were freed before its end


class RegionMemo:
    """One span's answers by key (``key``); at most ``_SIZE``, forgotten all at once when full."""

    __slots__ = ("answers",)

    def __init__(self) -> None:
        self.answers: dict[tuple, Answer] = {}

    def get(self, key: tuple) -> Answer | None:
        return self.answers.get(key)

    def put(self, key: tuple, answer: Answer) -> None:
        if len(self.answers) >= _SIZE:
            self.answers.clear()
        self.answers[key] = answer


def key(tensors: list[torch.Tensor], scalars: dict | None) -> tuple:
    """What a meta pass reads of a run: the layouts of ``tensors`` (what the span reads from outside it), the
    template's numbers and the default dtype."""
    layouts: list[Any] = [torch.get_default_dtype(), tuple(sorted(scalars.items())) if scalars else ()]
    for t in tensors:
        layouts.append((tuple(t.shape), t.stride(), t.dtype, t.requires_grad))
    return tuple(layouts)

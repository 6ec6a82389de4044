"""Upper bounds of a data-dependent op's output size, from its real arguments, before it runs.

``nonzero``'s output has as many rows as its input has non-zero elements: no meta kernel can say
how many. The server still charges every output's bytes before the kernel allocates them
(DESIGN principle 8), so each data-dependent entry has a bound here: ``BOUNDS`` (entry name ->
function of the call's arguments -> an upper bound of the element count of all its outputs
together). A data-dependent op without a bound is refused (``surface.json`` says so). A bound may
read values (``bincount``'s largest input): one reduction, which the kernel would do anyway.

A bound that is the size of the op's one output, not only a bound of it, is marked ``exact``:
the runner then holds it to ``max_tensor_elements`` before the kernel too (``one_hot`` of a
value of 2^30 is refused before it allocates 8 GiB). Any other is held to it after the kernel
(``nonzero``'s output is mostly far below its bound).
"""

from __future__ import annotations

import math
from typing import Callable

import torch


def exact(bound: Callable[..., int]) -> Callable[..., int]:
    """Mark ``bound`` as the size of its op's one output (``meta_check._bound`` reads the mark)."""
    bound.exact = True
    return bound


def _tensors(values) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def _broadcast_numel(*tensors: torch.Tensor) -> int:
    return math.prod(torch.broadcast_shapes(*(t.shape for t in tensors)))


def _indices(input, *args, **kwargs) -> int:
    """``nonzero``, ``argwhere``, ``where(cond)``: at most every element, times its number of dims."""
    return input.numel() * max(1, input.dim())


def _where(condition, *args, **kwargs) -> int:
    if not args and not kwargs:
        return _indices(condition)
    return _broadcast_numel(condition, *_tensors((*args, *kwargs.values())))


def _masked_select(input, mask, **kwargs) -> int:
    return _broadcast_numel(input, mask)


def _largest(t: torch.Tensor) -> int:
    return int(t.max()) if t.numel() else -1


@exact
def _bincount(input, weights=None, minlength=0) -> int:
    return max(int(minlength), _largest(input) + 1)


@exact
def _one_hot(input, num_classes=-1) -> int:
    return input.numel() * (num_classes if num_classes >= 0 else max(_largest(input) + 1, 0))


def _unique(input, *args, **kwargs) -> int:
    """values, inverse indices and counts: none longer than the input."""
    return 3 * input.numel()


@exact
def _repeat_interleave(input, repeats=None, dim=None, *, output_size=None) -> int:
    if repeats is None:  # repeat_interleave(repeats): 0, 0, 1, ... each index repeats[i] times
        return int(input.sum()) if input.numel() else 0
    total = int(repeats.sum()) if isinstance(repeats, torch.Tensor) and repeats.numel() > 1 else None
    if dim is None:
        return total if total is not None else int(repeats) * input.numel()
    size = input.shape[dim]
    per_slice = input.numel() // size if size else 0
    return (total if total is not None else int(repeats) * size) * per_slice


def _same_elements(input, *args, **kwargs) -> int:
    """Pieces of the input (``tensor_split``, packing a padded batch): never more elements than it."""
    return input.numel() + (input.shape[0] if input.dim() else 1)


def _packed(data, batch_sizes, hx, *rest) -> int:
    """Elements a packed recurrent call ``(data, batch_sizes, hx, params, has_biases, num_layers,
    dropout, train, bidirectional)`` makes: an output row of ``hidden x directions`` per packed row,
    and the final states (shaped as ``hx``). Unpacked calls are derived on meta and never get here."""
    states = hx if isinstance(hx, (list, tuple)) else [hx]
    hidden = states[0].shape[-1] if states[0].dim() else 1
    bidirectional = len(rest) > 5 and rest[5] is True
    return data.shape[0] * hidden * (2 if bidirectional else 1) + sum(h.numel() for h in states)


def _padded(data, batch_sizes, batch_first=False, padding_value=0.0, total_length=None) -> int:
    """``_pad_packed_sequence``'s output: the longest length (or ``total_length``) x the batch x a
    row's elements, and the lengths."""
    steps = max(len(batch_sizes), int(total_length or 0))
    batch = int(batch_sizes[0]) if len(batch_sizes) else 0
    return steps * batch * math.prod(data.shape[1:]) + batch


def _broadcast_of_tensors(*args, **kwargs) -> int:
    """An elementwise composite (``gaussian_nll_loss``): its output no bigger than its inputs broadcast."""
    return 2 * _broadcast_numel(*_tensors((*args, *kwargs.values())))


@exact
def _square_of_rows(input, *args, **kwargs) -> int:
    """``cov``, ``corrcoef``: a variables x variables matrix."""
    rows = input.shape[0] if input.dim() == 2 else 1
    return rows * rows


@exact
def _combinations(input, r=2, with_replacement=False) -> int:
    n = input.numel()
    return (math.comb(n + r - 1, r) if with_replacement else math.comb(n, r)) * max(r, 1)


def _histogram(input, bins=100, *args, **kwargs) -> int:
    edges = bins.numel() if isinstance(bins, torch.Tensor) else int(bins) + 1
    return 2 * edges


BOUNDS: dict[str, Callable[..., int]] = {
    "nn.functional.gaussian_nll_loss": _broadcast_of_tensors, "cov": _square_of_rows, "corrcoef": _square_of_rows,
    "combinations": _combinations, "histogram": _histogram,
    "nonzero": _indices, "argwhere": _indices, "where": _where, "masked_select": _masked_select,
    "bincount": _bincount, "nn.functional.one_hot": _one_hot, "unique": _unique, "unique_consecutive": _unique,
    "repeat_interleave": _repeat_interleave, "tensor_split": _same_elements,
    "_pack_padded_sequence": _same_elements, "_pad_packed_sequence": _padded,
    "lstm": _packed, "gru": _packed, "rnn_tanh": _packed, "rnn_relu": _packed,
}


def getitem_bound(input, key) -> int:
    """``x[mask]`` and friends: at most every element, once per element of each index tensor."""
    items = key if isinstance(key, (list, tuple)) else (key,)
    return input.numel() * math.prod(max(1, t.numel()) for t in _tensors(items) if t.dtype != torch.bool)

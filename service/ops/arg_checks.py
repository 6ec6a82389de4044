"""Argument contracts for torch ops whose meta kernel cannot vouch for their arguments.

Before a native entry runs, the server derives its outputs on the meta device: torch's own
argument checks, without touching memory (DESIGN principle 4). A few ops have no meta kernel,
or one that fails on some of their valid calls; ``CHECKS`` (entry name -> check) gives each of
those a contract run on the real arguments first (the runner calls it before anything else). A
check raises ``ValueError`` naming the argument (a 422) or returns quietly. An op without meta and
without a check is refused (``surface.json`` says so, with the reason).

The CPU fused optimizer kernels trust their callers about list lengths and shapes: their
contracts are in ``_contracts.py``; the others here stand for meta kernels that are missing.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ._contracts import CONTRACTS


def _fail(message: str) -> None:
    raise ValueError(message)


def _no_move(input, *args, **kwargs) -> None:
    """``to``/``as_tensor``: a dtype or layout change; a device other than the tensor's own is refused."""
    devices = [a for a in args if isinstance(a, (str, torch.device))]
    if kwargs.get("device") is not None:
        devices.append(kwargs["device"])
    for d in devices:
        want = torch.device(d)
        if want.type != input.device.type or (want.index is not None and want.index != input.device.index):
            _fail(f"to(): this server keeps the tensor on {input.device} and does not move it to {want}; "
                  "the client moves tensors itself (tensor.to(device), .cpu())")


def _gaussian_nll(input, target, var, *args, **kwargs) -> None:
    for name, t in (("input", input), ("target", target), ("var", var)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            _fail(f"gaussian_nll_loss(): {name} must be a floating tensor")
    try:
        torch.broadcast_shapes(input.shape, target.shape)
    except RuntimeError as exc:
        _fail(f"gaussian_nll_loss(): input and target: {exc}")


def _ctc(log_probs, targets, input_lengths, target_lengths, *args, **kwargs) -> None:
    """The lengths index ``log_probs`` and ``targets``: each within the sizes it indexes (the labels
    themselves: ``value_checks.py``)."""
    if log_probs.dim() not in (2, 3):
        _fail(f"ctc_loss(): log_probs must be 2-d or 3-d, got {log_probs.dim()}-d")
    steps, batch = log_probs.shape[0], (log_probs.shape[1] if log_probs.dim() == 3 else 1)
    lengths = [torch.as_tensor(x) for x in (input_lengths, target_lengths)]
    for name, t in zip(("input_lengths", "target_lengths"), lengths):
        if t.numel() != batch:
            _fail(f"ctc_loss(): {name} has {t.numel()} entries for a batch of {batch}")
        if t.numel() and (int(t.min()) < 0):
            _fail(f"ctc_loss(): {name} must not be negative")
    if lengths[0].numel() and int(lengths[0].max()) > steps:
        _fail(f"ctc_loss(): input_lengths must be at most the input length {steps}")
    if isinstance(targets, torch.Tensor) and targets.dim() >= 2 and lengths[1].numel() \
            and int(lengths[1].max()) > targets.shape[-1]:
        _fail(f"ctc_loss(): target_lengths must be at most the targets' length {targets.shape[-1]}")
    # Python ints: a tensor's sum of huge lengths wraps around int64 and passes (the value fuzz's 2^62)
    if isinstance(targets, torch.Tensor) and targets.dim() == 1 and sum(lengths[1].reshape(-1).tolist()) > targets.numel():
        _fail("ctc_loss(): target_lengths sum to more than the concatenated targets")


def _pack_padded(input, lengths, batch_first) -> None:
    batch = input.shape[0 if batch_first else 1] if input.dim() >= 2 else -1
    steps = input.shape[1 if batch_first else 0] if input.dim() >= 2 else -1
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.numel() != batch:
        _fail(f"_pack_padded_sequence(): lengths must be 1-d with one entry per batch element ({batch})")
    if lengths.numel() and (int(lengths.min()) < 1 or int(lengths.max()) > steps):
        _fail(f"_pack_padded_sequence(): lengths must be in [1, {steps}]")


def _at_most_2d(input, *args, **kwargs) -> None:
    if input.dim() > 2:
        _fail(f"expected a 1-d or 2-d input, got {input.dim()}-d")


def _combinations(input, r=2, with_replacement=False) -> None:
    if input.dim() != 1:
        _fail(f"combinations(): expected a 1-d input, got {input.dim()}-d")
    n = input.numel()
    count = math.comb(n + r - 1, r) if with_replacement else math.comb(n, r)
    if count * max(r, 1) > 1 << 31:
        _fail(f"combinations(): {count} combinations of {r} are too many")


def _histogram(input, bins=100, *args, **kwargs) -> None:
    if isinstance(bins, int) and bins <= 0:
        _fail("histogram(): bins must be positive")
    if isinstance(bins, torch.Tensor) and bins.dim() != 1:
        _fail("histogram(): bins must be an int or a 1-d tensor of edges")


def _no_growth(input, *sizes, **kwargs) -> None:
    """``resize_``: torch leaves new elements uninitialised, and memory a session receives is never unset."""
    shape = sizes[0] if len(sizes) == 1 and isinstance(sizes[0], (list, tuple, torch.Size)) else sizes
    _not_bigger(input, math.prod(int(s) for s in shape), list(shape))


def _no_growth_as(input, other, **kwargs) -> None:
    _not_bigger(input, other.numel(), list(other.shape))


def _not_bigger(input, needed: int, shape: list) -> None:
    if needed > input.numel():
        _fail(f"resize_ to {shape} would grow the tensor from {input.numel()} elements to {needed}: torch leaves "
              "new elements uninitialised; use torch.zeros or cat instead")


CHECKS: dict[str, Callable[..., Any]] = {
    "to": _no_move, "as_tensor": _no_move,
    **CONTRACTS,  # the fused optimizers' (_contracts.py)
    "nn.functional.gaussian_nll_loss": _gaussian_nll, "nn.functional.ctc_loss": _ctc,
    "_pack_padded_sequence": _pack_padded,
    "cov": _at_most_2d, "corrcoef": _at_most_2d, "combinations": _combinations, "histogram": _histogram,
    "resize": _no_growth, "resize_as": _no_growth_as,
}

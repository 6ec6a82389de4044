"""``CustomTensor``: what the server holds for each id of a session."""

from __future__ import annotations

import torch


class CustomTensor:
    """``value`` (the live torch tensor, in the autograd graph) and ``grad`` (the leaf's ``.grad``, or
    ``None``), named as the wire names them; the original design called them ``_custom_data`` and
    ``_custom_grad``.

    Its boundary (``from_torch``, ``to_torch``) never hands out a reference to a value or a grad
    (``detach().clone()``), and a missing grad is ``None``, never zeros. Inside the server the
    step handlers use ``value`` and ``grad`` themselves: that is how ops see the graph.
    """

    __slots__ = ("value", "grad", "retains_grad", "held")

    def __init__(self, value: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        self.value = value
        self.grad = grad
        self.retains_grad = False
        self.held: tuple = ()  # the storage keys its session counts it under (``storage_ledger``)

    @classmethod
    def from_torch(
        cls,
        t: torch.Tensor,
        *,
        device: torch.device | str | None = None,
        requires_grad: bool | None = None,
    ) -> "CustomTensor":
        """A new leaf holding copies of ``t``'s values and grad; later changes to ``t`` never reach it."""
        rg = t.requires_grad if requires_grad is None else requires_grad
        value = t.detach().to(device=device or t.device, copy=True)
        if rg:
            value.requires_grad_(True)
        grad = None
        if t.grad is not None:
            grad = t.grad.detach().to(device=value.device, dtype=value.dtype, copy=True)
        return cls(value, grad)

    def to_torch(self, device: torch.device | str | None = None) -> torch.Tensor:
        """A new leaf with this tensor's values, ``requires_grad`` as recorded, and a copy of the grad."""
        out = self.value.detach().to(device=device or self.device, copy=True)
        out.requires_grad_(self.requires_grad)
        if self.grad is not None:
            out.grad = self.grad.detach().to(device=out.device, dtype=out.dtype, copy=True)
        return out

    @property
    def requires_grad(self) -> bool:
        return self.value.requires_grad

    @property
    def is_leaf(self) -> bool:
        return self.value.is_leaf

    @property
    def dtype(self) -> torch.dtype:
        return self.value.dtype

    @property
    def device(self) -> torch.device:
        return self.value.device

    @property
    def shape(self) -> torch.Size:
        return self.value.shape

    def __repr__(self) -> str:
        return f"CustomTensor(shape={list(self.shape)}, dtype={self.dtype}, requires_grad={self.requires_grad})"

"""``CustomTensor``: what the server holds for each id of a session.

``_custom_data`` is the value, live in the autograd graph; ``_custom_grad`` is
its accumulated gradient (``None`` until a backward reaches it). The
``from_torch``/``to_torch`` boundary follows these rules: values and grads
cross it as ``detach().clone()``, never as references, and a missing grad
stays ``None`` rather than becoming zeros.
"""

from __future__ import annotations

import torch


class CustomTensor:
    __slots__ = ("_custom_data", "_custom_grad", "retains_grad")

    def __init__(self, data: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        self._custom_data = data
        self._custom_grad = grad
        self.retains_grad = False

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
        data = t.detach().to(device=device or t.device, copy=True)
        if rg:
            data.requires_grad_(True)
        grad = None
        if t.grad is not None:
            grad = t.grad.detach().to(device=data.device, dtype=data.dtype, copy=True)
        return cls(data, grad)

    def to_torch(self, device: torch.device | str | None = None) -> torch.Tensor:
        """A new leaf with this tensor's values, ``requires_grad`` as recorded, and a copy of the grad."""
        out = self._custom_data.detach().to(device=device or self.device, copy=True)
        out.requires_grad_(self.requires_grad)
        if self._custom_grad is not None:
            out.grad = self._custom_grad.detach().to(device=out.device, dtype=out.dtype, copy=True)
        return out

    @property
    def requires_grad(self) -> bool:
        return self._custom_data.requires_grad

    @property
    def is_leaf(self) -> bool:
        return self._custom_data.is_leaf

    @property
    def dtype(self) -> torch.dtype:
        return self._custom_data.dtype

    @property
    def device(self) -> torch.device:
        return self._custom_data.device

    @property
    def shape(self) -> torch.Size:
        return self._custom_data.shape

    @property
    def nbytes(self) -> int:
        return self._custom_data.nbytes + (0 if self._custom_grad is None else self._custom_grad.nbytes)

    def __repr__(self) -> str:
        return f"CustomTensor(shape={list(self.shape)}, dtype={self.dtype}, requires_grad={self.requires_grad})"

"""Linear algebra: matmul and friends, with broadcasting over batch dims."""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import needs, sum_to
from ._registry import op
from ._samples import S, T


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.matmul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        # Treat vectors as matrices (a row on the left, a column on the right), do the
        # matrix rule, reduce broadcast batch dims, then drop the added dims again.
        a2 = a.unsqueeze(0) if a.dim() == 1 else a
        b2 = b.unsqueeze(-1) if b.dim() == 1 else b
        g2 = g
        if a.dim() == 1:
            g2 = g2.unsqueeze(-2 if b.dim() > 1 else 0)
        if b.dim() == 1:
            g2 = g2.unsqueeze(-1)
        ga = gb = None
        if needs(ctx, 0):
            ga = sum_to(g2 @ b2.mT, a2)
            ga = ga.squeeze(0) if a.dim() == 1 else ga
        if needs(ctx, 1):
            gb = sum_to(a2.mT @ g2, b2)
            gb = gb.squeeze(-1) if b.dim() == 1 else gb
        return ga, gb


@op("matmul", torch_names=("torch.matmul", "torch.Tensor.matmul", "torch.Tensor.__matmul__",
                           "torch.Tensor.__rmatmul__"),
    samples=(S(T((2, 3)), T((3, 4))), S(T((3,)), T((3,))), S(T((3,)), T((3, 2))), S(T((2, 3)), T((3,))),
             S(T((2, 2, 3)), T((3, 4))), S(T((4, 1, 2, 3)), T((5, 3, 2))), S(T((3, 2), noncontiguous=True), T((2, 4))),
             S(T((0, 3)), T((3, 2)))),
    reference=torch.matmul)
def matmul(input, other):
    """matrix product with torch's broadcasting and vector rules"""
    return MatMul.apply(input, other)

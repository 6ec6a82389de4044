"""Matrix functions: inverse, solve, determinant, and the triangle / diagonal / trace family."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch.autograd import Function

from ._grad import TensorLike, needs, sum_to
from ._registry import op
from ._samples import S, T
from .reductions import prod_others


@dataclass(frozen=True)
class Invertible(T):
    """A square matrix (or a batch) of values in [-1, 1) plus n * identity: diagonally dominant, so invertible."""

    low: float = -1.0
    high: float = 1.0

    def make(self, float_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
        t = T.make(replace(self, requires_grad=False), float_dtype, gen)
        t.diagonal(dim1=-2, dim2=-1).add_(t.shape[-1])
        return t.requires_grad_(self.requires_grad and t.dtype.is_floating_point)


class Inv(Function):
    @staticmethod
    def forward(ctx, A):
        out = torch.linalg.inv(A)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):  # d(A^-1) = -A^-1 dA A^-1
        (inv,) = ctx.saved_tensors
        return -inv.mT @ (g @ inv.mT)


_INV_SAMPLES = (S(Invertible((3, 3))), S(Invertible((2, 3, 3))), S(Invertible((2, 2), noncontiguous=True)),
                S(T((1, 1), low=0.5, high=2.0)), S(Invertible((0, 0))))


@op("inv", torch_names=("torch.linalg.inv",), samples=_INV_SAMPLES, reference=torch.linalg.inv)
def inv(A):
    """inverse of a square matrix (or a batch of them)"""
    return Inv.apply(A)


@op("inverse", torch_names=("torch.inverse", "torch.Tensor.inverse"), samples=_INV_SAMPLES[:2], reference=torch.inverse)
def inverse(input):
    """``torch.inverse``: the same as ``torch.linalg.inv``"""
    return Inv.apply(input)


class Solve(Function):
    @staticmethod
    def forward(ctx, A, B, left):
        ctx.A, ctx.B, ctx.left = TensorLike(A.shape, A.dtype), TensorLike(B.shape, B.dtype), left
        ctx.vector = B.dim() == 1 or (B.dim() == A.dim() - 1 and B.shape == A.shape[:-1])  # torch's rule
        X = torch.linalg.solve(A, B, left=left)
        ctx.save_for_backward(A, X)
        return X

    @staticmethod
    def backward(ctx, g):  # X = A^-1 B: gB = A^-T g, gA = -gB X^T (mirrored when left=False: X = B A^-1)
        A, X = ctx.saved_tensors
        gB = torch.linalg.solve(A.mT, g, left=ctx.left)
        gA = None
        if needs(ctx, 0):
            gB2, X2 = (gB.unsqueeze(-1), X.unsqueeze(-1)) if ctx.vector else (gB, X)
            gA = sum_to(-(gB2 @ X2.mT if ctx.left else X2.mT @ gB2), ctx.A)
        return gA, sum_to(gB, ctx.B) if needs(ctx, 1) else None, None


@op("solve", torch_names=("torch.linalg.solve",), reference=torch.linalg.solve,
    samples=(S(Invertible((3, 3)), T((3, 2))), S(Invertible((3, 3)), T((3,))), S(Invertible((2, 3, 3)), T((3,))),
             S(Invertible((2, 3, 3)), T((2, 3))), S(Invertible((3, 3)), T((2, 3, 2))),
             S(Invertible((3, 3)), T((2, 3)), left=False),
             S(Invertible((3, 3), noncontiguous=True), T((3, 1), requires_grad=False)),
             S(Invertible((2, 2), requires_grad=False), T((2, 4), noncontiguous=True))))
def solve(A, B, *, left=True):
    """X with A X = B (``left=False``: X A = B); B is a vector when torch would treat it as one"""
    return Solve.apply(A, B, left)


def _cofactors(A):
    """d det(A) / dA for any square A, singular or not: through the SVD, A = U diag(S) Vh, where the
    cofactor matrix is det(U) det(Vh) U diag(product of the other singular values) Vh."""
    U, S, Vh = torch.linalg.svd(A)
    sign = (torch.linalg.det(U) * torch.linalg.det(Vh))[..., None, None]
    return sign * ((U * prod_others(S, -1).unsqueeze(-2)) @ Vh)


class Det(Function):
    @staticmethod
    def forward(ctx, A):
        out = torch.linalg.det(A)
        ctx.save_for_backward(A, out)
        return out

    @staticmethod
    def backward(ctx, g):  # d det = det tr(A^-1 dA): the gradient is det A^-T, the cofactor matrix
        A, det = ctx.saved_tensors
        if A.numel() == 0:
            return torch.zeros_like(A)
        if (det == 0).any():  # an exactly singular matrix has no inverse: take the cofactors from the SVD
            return g[..., None, None] * _cofactors(A)
        return (g * det)[..., None, None] * torch.linalg.inv(A).mT


_DET_SAMPLES = (S(Invertible((3, 3))), S(T((2, 2))), S(T((2, 3, 3), low=-1.0, high=1.0)), S(T((1, 1))),
                S(Invertible((3, 3), noncontiguous=True)), S(T((0, 0))))


@op("linalg_det", torch_names=("torch.linalg.det",), samples=_DET_SAMPLES, reference=torch.linalg.det)
def linalg_det(A):
    """determinant of a square matrix (or a batch); exact gradients for singular matrices too"""
    return Det.apply(A)


@op("det", torch_names=("torch.det", "torch.Tensor.det"), samples=_DET_SAMPLES[:3], reference=torch.det)
def det(input):
    """``torch.det``: the same as ``torch.linalg.det``"""
    return Det.apply(input)


class Trace(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return torch.trace(x)

    @staticmethod
    def backward(ctx, g):
        return g * torch.eye(*ctx.shape, dtype=g.dtype, device=g.device)


@op("trace", torch_names=("torch.trace", "torch.Tensor.trace"), reference=torch.trace,
    samples=(S(T((3, 3))), S(T((2, 3))), S(T((4, 2), noncontiguous=True)), S(T((0, 2)))))
def trace(input):
    """sum of the main diagonal of a 2-D tensor"""
    return Trace.apply(input)


def _masking(name: str, keep):
    """A Function keeping part of the input (``keep(x, k)``); its gradient keeps the same part of ``g``."""

    class Masking(Function):
        @staticmethod
        def forward(ctx, x, k):
            ctx.k = k
            return keep(x, k)

        @staticmethod
        def backward(ctx, g):
            return keep(g, ctx.k), None

    Masking.__name__ = Masking.__qualname__ = name
    return Masking


Tril, Triu = _masking("Tril", torch.tril), _masking("Triu", torch.triu)
_TRIANGLE_SAMPLES = (S(T((3, 4))), S(T((3, 4)), 1), S(T((2, 3, 3)), -1), S(T((3, 3)), diagonal=-5),
                     S(T((4, 3), noncontiguous=True), 2), S(T((0, 2))))


@op("tril", torch_names=("torch.tril", "torch.Tensor.tril", "torch.Tensor.tril_"), samples=_TRIANGLE_SAMPLES,
    reference=torch.tril)
def tril(input, diagonal=0):
    """lower triangle of the last two dims (on and below ``diagonal``), the rest zero"""
    return Tril.apply(input, diagonal)


@op("triu", torch_names=("torch.triu", "torch.Tensor.triu", "torch.Tensor.triu_"), samples=_TRIANGLE_SAMPLES,
    reference=torch.triu)
def triu(input, diagonal=0):
    """upper triangle of the last two dims (on and above ``diagonal``), the rest zero"""
    return Triu.apply(input, diagonal)


@op("diagonal", kind="native", torch_names=("torch.diagonal", "torch.Tensor.diagonal"), reference=torch.diagonal,
    samples=(S(T((3, 4))), S(T((3, 4)), 1), S(T((2, 3, 4)), -1, 0, 2), S(T((2, 3, 4)), offset=1, dim1=-1, dim2=-2),
             S(T((3, 3), noncontiguous=True)), S(T((2, 2)), 5)))
def diagonal(input, offset=0, dim1=0, dim2=1):
    """a view of the diagonal at ``offset`` over ``dim1`` and ``dim2`` (moved to the last dim)"""
    return torch.diagonal(input, offset, dim1, dim2)  # a view: torch's own op (see the note in ``shape``)

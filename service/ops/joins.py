"""Joining and splitting: cat/stack put tensors together, split/chunk/unbind/narrow take one apart.

cat's and stack's backward is the opposite move: the gradient is split back into pieces.
split/chunk/unbind/narrow are torch's own view ops, so the pieces share the input's memory.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._grad import TensorLike, needs, sum_to
from ._registry import op
from ._samples import S, T


def _likes(tensors) -> list[TensorLike]:
    return [TensorLike(t.shape, t.dtype) for t in tensors]


class Cat(Function):
    @staticmethod
    def forward(ctx, dim, *tensors):
        out = torch.cat(tensors, dim)
        ctx.dim, ctx.likes = dim % out.dim(), _likes(tensors)
        return out

    @staticmethod
    def backward(ctx, g):
        grads, start = [], 0
        for i, like in enumerate(ctx.likes):
            # torch.cat skips legacy empty 1-d tensors of shape (0,): they take no room.
            n = like.shape[ctx.dim] if len(like.shape) == g.dim() else 0
            grads.append(sum_to(g.narrow(ctx.dim, start, n).reshape(like.shape), like) if needs(ctx, i + 1) else None)
            start += n
        return None, *grads


_CAT_SAMPLES = (
    S([T((2, 3)), T((1, 3))]),
    S([T((2, 3)), T((2, 2))], 1),
    S((T((2, 3)), T((2, 1)), T((2, 2))), -1),
    S([T((2, 3)), T((0,))]),
    S([T((2, 3)), T((2, 3), dtype="float64")]),
    S([T((3, 2), noncontiguous=True), T((1, 2), requires_grad=False)]),
    S([T((2, 3)), T((0, 3))]),
)


@op("cat", torch_names=("torch.cat", "torch.concat"), samples=_CAT_SAMPLES + (S([T((2, 3))], dim=0),),
    reference=torch.cat)
def cat(tensors, dim=0):
    """tensors joined along an existing dim (types promoted, as in torch)"""
    return Cat.apply(dim, *tensors)


@op("concatenate", torch_names=("torch.concatenate",), samples=_CAT_SAMPLES[:3] + (S([T((2, 3))], axis=0),),
    reference=torch.concatenate)
def concatenate(tensors, axis=0):
    """``cat`` with numpy's argument name"""
    return cat(tensors, axis)


class Stack(Function):
    @staticmethod
    def forward(ctx, dim, *tensors):
        out = torch.stack(tensors, dim)
        ctx.dim, ctx.likes = dim % out.dim(), _likes(tensors)
        return out

    @staticmethod
    def backward(ctx, g):
        pieces = g.unbind(ctx.dim)
        return None, *(sum_to(p, like) if needs(ctx, i + 1) else None
                       for i, (p, like) in enumerate(zip(pieces, ctx.likes)))


@op("stack", torch_names=("torch.stack",),
    samples=(S([T((2, 3)), T((2, 3))]), S([T((2, 3)), T((2, 3))], 1), S((T((2, 3)), T((2, 3))), -1),
             S([T(()), T(())]), S([T((3, 2), noncontiguous=True), T((3, 2))]), S([T((2,))], dim=0),
             S([T((2, 3)), T((2, 3), dtype="float64")])),
    reference=torch.stack)
def stack(tensors, dim=0):
    """tensors of one shape joined along a new dim"""
    return Stack.apply(dim, *tensors)


# split, chunk, unbind and narrow return views: torch's own ops (see the note in ``shape``).


@op("split", kind="native", torch_names=("torch.functional.split", "torch.Tensor.split"),
    samples=(S(T((5, 3)), 2), S(T((5, 3)), [1, 4]), S(T((2, 6)), 3, 1), S(T((2, 6)), (2, 1, 3), -1),
             S(T((3, 4), noncontiguous=True), 2, 1), S(T((0, 2)), 2), S(T((4, 2)), 4, dim=0)),
    reference=torch.split)
def split(tensor, split_size_or_sections, dim=0):
    """pieces of ``split_size`` along ``dim`` (the last may be shorter), or pieces of the listed sizes"""
    sections = split_size_or_sections
    return tuple(tensor.split(list(sections) if isinstance(sections, (list, tuple)) else sections, dim))


@op("chunk", kind="native", torch_names=("torch.chunk", "torch.Tensor.chunk"),
    samples=(S(T((5, 3)), 2), S(T((5, 3)), 3, 1), S(T((6, 2)), 4), S(T((0, 2)), 2),
             S(T((3, 4), noncontiguous=True), 2, -1)),
    reference=torch.chunk)
def chunk(input, chunks, dim=0):
    """at most ``chunks`` pieces of equal size along ``dim`` (torch's rule: possibly fewer)"""
    return tuple(input.chunk(chunks, dim))


@op("unbind", kind="native", torch_names=("torch.unbind", "torch.Tensor.unbind"),
    samples=(S(T((2, 3))), S(T((2, 3)), 1), S(T((2, 3)), -1), S(T((3, 2), noncontiguous=True)), S(T((2, 0)))),
    reference=torch.unbind)
def unbind(input, dim=0):
    """the slices along ``dim``, that dim removed"""
    return tuple(input.unbind(dim))


@op("narrow", kind="native", torch_names=("torch.narrow", "torch.Tensor.narrow"),
    samples=(S(T((4, 3)), 0, 1, 2), S(T((4, 3)), -1, 0, 2), S(T((4, 3)), 1, -2, 2), S(T((4, 3)), 0, 2, 0),
             S(T((3, 4), noncontiguous=True), 1, 1, 3)),
    reference=torch.narrow)
def narrow(input, dim, start, length):
    """``length`` elements of ``dim`` from ``start`` (a view)"""
    return input.narrow(dim, int(start), int(length))

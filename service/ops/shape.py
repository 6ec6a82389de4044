"""Shape ops: the same elements in a new shape or order; the gradient is put back.

Sizes come in torch's three spellings: ``x.f(2, 3)``, ``x.f((2, 3))`` (a list on the
wire) and ``x.f(size=(2, 3))``. The view ops are torch's own (see the note above
``reshape``); ``repeat``, ``flip`` and ``roll`` copy, and keep their own Functions.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from ._registry import op
from ._samples import S, T


def _sizes(args: tuple, given=None, name: str = "size") -> tuple:
    """One size argument from ``f(2, 3)``, ``f((2, 3))``, ``f([2, 3])`` or ``f(name=(2, 3))``."""
    if given is not None:
        if args:
            raise TypeError(f"got {name} both positionally and as a keyword")
        args = (given,)
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = args[0]
    return tuple(args)


# The ops below are views: torch's own op with torch's own derivative (DESIGN principle 4), so the
# result shares memory with its input as in torch (``v = x[0]; v.add_(1)`` changes ``x``) and torch's
# view+autograd machinery (version counters, CopySlices after an in-place write through a view, the
# "view of a leaf Variable" error) applies. A hand-written Function could not give that: torch forbids
# in-place writes to views a custom Function returned.


@op("reshape", kind="native", torch_names=("torch.reshape", "torch.Tensor.reshape"),
    samples=(S(T((2, 3)), (3, 2)), S(T((2, 3)), (-1,)), S(T((2, 3, 4)), 6, -1), S(T((3, 2), noncontiguous=True), (6,)),
             S(T(()), (1, 1)), S(T((2, 3)), shape=[3, 2])),
    reference=torch.Tensor.reshape)
def reshape(input, *args, shape=None):
    """the same values in a new shape (``-1`` infers one dim); a view when possible"""
    return input.reshape(_sizes(args, shape, "shape"))


@op("view", kind="native", torch_names=("torch.Tensor.view",),
    samples=(S(T((2, 3)), 3, 2), S(T((2, 3)), (-1,)), S(T((2, 3, 4)), [6, -1]), S(T(()), 1, 1),
             S(T((2, 3)), size=(3, 2)), S(T((0, 3)), 3, 0), S(T((3, 2), noncontiguous=True), 3, 1, 2)),
    reference=torch.Tensor.view)
def view(input, *args, size=None):
    """a view with a new shape; fails like torch when the strides don't allow one. ``view(dtype)`` is refused"""
    shape = _sizes(args, size)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise TypeError("view(dtype) reinterprets the bits and is not supported here; use .to(dtype) to convert")
    return input.view(shape)  # torch's error when the strides don't allow a view


@op("flatten", kind="native", torch_names=("torch.flatten", "torch.Tensor.flatten"),
    samples=(S(T((2, 3, 4))), S(T((2, 3, 4)), 1), S(T((2, 3, 4)), 0, -2), S(T(())), S(T((3, 2), noncontiguous=True)),
             S(T((2, 0, 3)), start_dim=1)),
    reference=torch.flatten)
def flatten(input, start_dim=0, end_dim=-1):
    """dims start_dim..end_dim merged into one (a 0-d input becomes 1-d)"""
    return torch.flatten(input, start_dim, end_dim)


@op("unflatten", kind="native", torch_names=("torch.unflatten", "torch.Tensor.unflatten"),
    samples=(S(T((2, 6)), 1, (2, 3)), S(T((2, 6)), -1, [3, -1]), S(T((4, 6), noncontiguous=True), 0, (2, 2))),
    reference=torch.unflatten)
def unflatten(input, dim, sizes):
    """dim ``dim`` split into ``sizes`` (one may be -1)"""
    return torch.unflatten(input, dim, tuple(sizes))


@op("squeeze", kind="native", torch_names=("torch.squeeze", "torch.Tensor.squeeze"),
    samples=(S(T((2, 1, 3, 1))), S(T((2, 1, 3)), 1), S(T((2, 1, 3)), 0), S(T((1, 2, 1)), (0, -1)),
             S(T((1, 2, 1)), [0, 2]), S(T((1,))), S(T(())), S(T((1, 3, 1), noncontiguous=True)), S(T((0, 1)), dim=1)),
    reference=torch.squeeze)
def squeeze(input, dim=None):
    """size-1 dims removed: all of them, or those of ``dim`` (an int or a tuple)"""
    return input.squeeze() if dim is None else input.squeeze(tuple(dim) if isinstance(dim, list) else dim)


@op("unsqueeze", kind="native", torch_names=("torch.unsqueeze", "torch.Tensor.unsqueeze"),
    samples=(S(T((2, 3)), 0), S(T((2, 3)), -1), S(T(()), 0), S(T((3, 2), noncontiguous=True), 1)),
    reference=torch.unsqueeze)
def unsqueeze(input, dim):
    """a size-1 dim inserted at ``dim``"""
    return input.unsqueeze(dim)


@op("permute", kind="native", torch_names=("torch.permute", "torch.Tensor.permute"),
    samples=(S(T((2, 3, 4)), 1, 0, 2), S(T((2, 3, 4)), (2, 0, 1)), S(T((2, 3, 4)), [-1, 0, 1]),
             S(T((2, 3, 4)), dims=(1, 2, 0)), S(T(()), ()), S(T((3, 2), noncontiguous=True), 1, 0)),
    reference=torch.Tensor.permute)
def permute(input, *args, dims=None):
    """dims reordered: ``x.permute(1, 0, 2)`` or ``x.permute((1, 0, 2))``"""
    return input.permute(_sizes(args, dims, "dims"))


@op("transpose", kind="native", torch_names=("torch.transpose", "torch.swapaxes", "torch.swapdims", "torch.Tensor.transpose",
                              "torch.Tensor.swapaxes", "torch.Tensor.swapdims"),
    samples=(S(T((2, 3)), 0, 1), S(T((2, 3, 4)), -1, 0), S(T((3, 2), noncontiguous=True), 1, 0)),
    reference=torch.transpose)
def transpose(input, dim0, dim1):
    """swap two dims"""
    return input.transpose(dim0, dim1)


@op("t", kind="native", torch_names=("torch.t", "torch.Tensor.t"),
    samples=(S(T((2, 3))), S(T((3,))), S(T(())), S(T((3, 2), noncontiguous=True))), reference=torch.t)
def t(input):
    """transpose of a matrix; 0-d and 1-d inputs come back as they are"""
    return input.t()


@op("T", kind="native", torch_names=("torch.Tensor.T.__get__",),
    samples=(S(T((2, 3))), S(T((3,))), S(T(())), S(T((3, 2), noncontiguous=True))),
    reference=lambda x: x.T)
def reverse_dims(input):
    """``x.T``: all dims reversed (torch deprecates it for other than 2-d)"""
    return input.permute(tuple(reversed(range(input.dim()))))


@op("mT", kind="native", torch_names=("torch.Tensor.mT.__get__",),
    samples=(S(T((2, 3))), S(T((4, 2, 3))), S(T((3, 2), noncontiguous=True))), reference=lambda x: x.mT)
def matrix_transpose(input):
    """``x.mT``: the last two dims swapped (a batch of matrices transposed)"""
    return input.mT


@op("expand", kind="native", torch_names=("torch.Tensor.expand",),
    samples=(S(T((3,)), 2, 3), S(T((3,)), (2, 3)), S(T((2, 1)), -1, 4), S(T((2, 1)), [3, 2, -1]), S(T(()), 2, 2),
             S(T((1, 3)), size=(0, 3)), S(T((3, 1), noncontiguous=True), 3, 2)),
    reference=torch.Tensor.expand)
def expand(input, *args, size=None):
    """a broadcast view: size-1 dims stretched, new dims in front, ``-1`` keeps a dim"""
    return input.expand(_sizes(args, size))


@op("expand_as", kind="native", torch_names=("torch.Tensor.expand_as",),
    samples=(S(T((3,)), T((2, 3))), S(T((2, 1)), T((2, 4), requires_grad=False))), reference=torch.Tensor.expand_as,
    no_grad_args=(1, "other"))
def expand_as(input, other):
    """``input.expand(other.shape)`` (``other`` gets no gradient)"""
    return input.expand(other.shape)


@op("broadcast_to", kind="native", torch_names=("torch.broadcast_to", "torch.Tensor.broadcast_to"),
    samples=(S(T((3,)), (2, 3)), S(T((2, 1)), [2, -1, 4]), S(T(()), (2,))), reference=torch.broadcast_to)
def broadcast_to(input, size):
    """``input.expand(size)``"""
    return input.expand(tuple(size))


@op("select", kind="native", torch_names=("torch.select", "torch.Tensor.select"),
    samples=(S(T((3, 4)), 0, 1), S(T((3, 4)), -1, -2), S(T((3, 4), noncontiguous=True), 1, 0)),
    reference=torch.select)
def select(input, dim, index):
    """the slice at ``index`` of ``dim``, that dim removed (a view)"""
    return input.select(dim, index)


class Repeat(Function):
    @staticmethod
    def forward(ctx, x, repeats):
        ctx.in_shape, ctx.repeats = x.shape, repeats
        return x.repeat(repeats)

    @staticmethod
    def backward(ctx, g):
        # Output dim i is repeats[i] copies of (padded) input dim i: split it in two and sum the copies.
        shape = (1,) * (len(ctx.repeats) - len(ctx.in_shape)) + tuple(ctx.in_shape)
        split = [n for r, s in zip(ctx.repeats, shape) for n in (r, s)]
        g = g.reshape(split).sum(dim=tuple(range(0, len(split), 2)))
        return g.reshape(ctx.in_shape), None


@op("repeat", torch_names=("torch.Tensor.repeat",),
    samples=(S(T((2, 3)), 2, 1), S(T((2, 3)), (1, 2, 2)), S(T((3,)), [2, 0]), S(T(()), 3),
             S(T((3, 2), noncontiguous=True), 2, 2), S(T((2, 3)), repeats=(2, 2))),
    reference=torch.Tensor.repeat)
def repeat(input, *args, repeats=None):
    """the tensor tiled ``repeats[i]`` times along each dim (new dims in front)"""
    return Repeat.apply(input, _sizes(args, repeats, "repeats"))


class Flip(Function):
    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return torch.flip(x, dims)

    @staticmethod
    def backward(ctx, g):
        return torch.flip(g, ctx.dims), None


@op("flip", torch_names=("torch.flip", "torch.Tensor.flip"),
    samples=(S(T((2, 3)), 0), S(T((2, 3, 4)), (0, -1)), S(T((2, 3)), [1]), S(T((2, 3)), dims=(0, 1)),
             S(T(()), ()), S(T((3, 2), noncontiguous=True), 0, 1)),
    reference=torch.Tensor.flip)
def flip(input, *args, dims=None):
    """the order of elements reversed along ``dims``"""
    return Flip.apply(input, _sizes(args, dims, "dims"))


class Roll(Function):
    @staticmethod
    def forward(ctx, x, shifts, dims):
        ctx.back = ([-s for s in shifts] if isinstance(shifts, (list, tuple)) else -shifts), dims
        return torch.roll(x, shifts, dims)

    @staticmethod
    def backward(ctx, g):
        return torch.roll(g, *ctx.back), None, None


@op("roll", torch_names=("torch.roll", "torch.Tensor.roll"),
    samples=(S(T((2, 3)), 1), S(T((2, 3)), 1, 0), S(T((2, 3)), (1, -2), (0, 1)), S(T((2, 3)), shifts=2, dims=-1),
             S(T((3, 2), noncontiguous=True), [1], [1]), S(T((0, 3)), 1)),
    reference=torch.roll)
def roll(input, shifts, dims=None):
    """elements shifted along ``dims`` with wrap-around (the flattened tensor when ``dims`` is None)"""
    return Roll.apply(input, shifts, dims if dims is None or isinstance(dims, int) else tuple(dims))

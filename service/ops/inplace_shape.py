"""In-place ops that change a tensor's shape or strides: ``squeeze_``, ``unsqueeze_``, ``t_``,
``transpose_``, ``resize_``, ``as_strided_``.

Each is torch's own in-place op with torch's own derivative (DESIGN principle 4): the
runner calls it on the stored tensor itself (``shape_inplace``), so the id keeps naming
the same tensor object with its new shape, views and version counter stay torch's,
and torch's own checks (a leaf that requires grad, ``resize_`` of a tensor that
requires grad) run before anything changes, so a refused call leaves no trace.
The samples need no grad: torch refuses these ops on leaves that require grad.
"""

from __future__ import annotations

import math

import torch

from ._registry import op
from ._samples import S, T
from .shape import _sizes


def _plain(shape, **kw):
    return T(shape, requires_grad=False, **kw)


@op("squeeze_", torch_names=("torch.Tensor.squeeze_",), inplace=True, shape_inplace=True,
    samples=(S(_plain((2, 1, 3, 1))), S(_plain((2, 1, 3)), 1), S(_plain((1, 2, 1)), (0, 2)), S(_plain(()))),
    reference=lambda x, *a, **k: x.clone().squeeze_(*a, **k))
def squeeze_(input, dim=None):
    """size-1 dims removed in place: all of them, or those of ``dim``"""
    return input.squeeze_() if dim is None else input.squeeze_(tuple(dim) if isinstance(dim, list) else dim)


@op("unsqueeze_", torch_names=("torch.Tensor.unsqueeze_",), inplace=True, shape_inplace=True,
    samples=(S(_plain((2, 3)), 0), S(_plain((2, 3)), -1), S(_plain(()), 0), S(_plain((3, 2), noncontiguous=True), 1)),
    reference=lambda x, dim: x.clone().unsqueeze_(dim))
def unsqueeze_(input, dim):
    """a size-1 dim inserted in place at ``dim``"""
    return input.unsqueeze_(dim)


@op("t_", torch_names=("torch.Tensor.t_",), inplace=True, shape_inplace=True,
    samples=(S(_plain((2, 3))), S(_plain((3,))), S(_plain(()))), reference=lambda x: x.clone().t_())
def t_(input):
    """a matrix transposed in place (0-d and 1-d stay as they are)"""
    return input.t_()


@op("transpose_", torch_names=("torch.Tensor.transpose_", "torch.Tensor.swapaxes_", "torch.Tensor.swapdims_"),
    inplace=True, shape_inplace=True, samples=(S(_plain((2, 3)), 0, 1), S(_plain((2, 3, 4)), -1, 0)),
    reference=lambda x, d0, d1: x.clone().transpose_(d0, d1))
def transpose_(input, dim0, dim1):
    """two dims swapped in place"""
    return input.transpose_(dim0, dim1)


@op("resize_", torch_names=("torch.Tensor.resize_",), inplace=True, shape_inplace=True, exact=False,
    samples=(S(_plain((2, 3)), 3, 2), S(_plain((2, 3)), (6,)), S(_plain((2, 3)), [1, 2])),
    reference=lambda x, *a: x.clone().resize_(*a))
def resize_(input, *args):
    """a new shape in place (torch refuses tensors that require grad). Growing it is refused here:
    torch leaves the new elements uninitialised, and memory a session receives is never unset"""
    sizes = _sizes(args)
    needed = math.prod(sizes)
    if needed > input.numel():
        raise RuntimeError(f"resize_ to {list(sizes)} would grow the tensor from {input.numel()} elements to "
                           f"{needed}: torch leaves new elements uninitialised; use torch.zeros or cat instead")
    return input.resize_(sizes)


@op("as_strided_", torch_names=("torch.Tensor.as_strided_",), inplace=True, shape_inplace=True,
    samples=(S(_plain((2, 3)), (3, 2), (1, 3)), S(_plain((2, 3)), [2], [2], 1)),
    reference=lambda x, *a: x.clone().as_strided_(*a))
def as_strided_(input, size, stride, storage_offset=None):
    """the tensor's sizes and strides (and offset) set in place over the same memory"""
    return input.as_strided_(tuple(size), tuple(stride), storage_offset)

"""Indexing: ``x[key]``, ``x[key] = value``, and the gather / scatter / select / mask family.

The ``key`` of ``x[key]`` on the wire: the client sends it as the second positional
argument, a Python tuple becoming a list. So here a top-level LIST is ALWAYS a tuple
index (``x[1:, None]`` arrives as ``[slice(1, None), None]``, ``x[0, 1]`` as ``[0, 1]``);
the client turns a Python list index (``x[[0, 1]]``, advanced indexing) into an int64
tensor before sending. A list nested inside the tuple is an advanced index, as in torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd import Function

from ._grad import TensorLike, like_of, needs, sum_to
from ._registry import op
from ._samples import S, T

_HOLE = object()  # where an index tensor sits in a key's template


def _key(key, device) -> tuple:
    """The tuple torch would index with (see the module docstring); nested lists become index tensors."""
    items = tuple(key) if isinstance(key, (list, tuple)) else (key,)
    return tuple(torch.tensor(k, device=device, dtype=None if k else torch.int64) if isinstance(k, list) else k
                 for k in items)


def _pack(key: tuple) -> tuple[tuple, list]:
    """A key as (template, index tensors): the tensors travel as Function inputs, so saved and version-checked."""
    tensors = [k for k in key if isinstance(k, torch.Tensor)]
    return tuple(_HOLE if isinstance(k, torch.Tensor) else k for k in key), tensors


def _unpack(template: tuple, tensors) -> tuple:
    it = iter(tensors)
    return tuple(next(it) if k is _HOLE else k for k in template)


def _ref_key(key):
    return tuple(key) if isinstance(key, list) else key


_I = dict(dtype="int64", requires_grad=False)
_B = dict(dtype="bool", low=0, high=2, requires_grad=False)


def _ix(shape, high):
    """An index tensor of ``shape`` with values in [0, high)."""
    return T(shape, low=0, high=high, **_I)


_GETITEM_SAMPLES = (
    S(T((4, 3)), 1), S(T((4, 3)), slice(1, None)), S(T((4, 3)), [slice(None, None, 2), None, -1]),
    S(T((2, 3, 4)), [Ellipsis, 1]), S(T(()), None), S(T(()), Ellipsis), S(T((0, 3)), [Ellipsis, 1]),
    S(T((4, 3)), _ix((5,), 4)),  # 5 draws from 4 rows: repeats, whose gradients add up
    S(T((4, 3)), _ix((2, 2), 4)), S(T((3, 4)), [[0, 2, 0], slice(None)]),
    S(T((3, 4, 5)), [slice(None), _ix((2, 2), 4), slice(1, 3)]),  # advanced dims stay in place
    S(T((3, 4, 5)), [_ix((3,), 3), slice(None), _ix((3,), 5)]),  # separated: advanced dims go first
    S(T((3, 4, 5)), [_ix((2,), 3), 0, _ix((2,), 5)]),  # an int between: a select, as in torch
    S(T((3, 4), noncontiguous=True), [slice(1, None), _ix((3,), 4)]),
    S(T((4, 3)), T((4,), **_B)), S(T((2, 3)), T((2, 3), **_B)), S(T((2, 3, 4)), [T((2, 3), **_B), slice(None, 2)]),
    S(T((3, 4)), [True, 1]), S(T((3, 4)), [1, T((), low=2, high=3, **_I)]),
)


@op("getitem", kind="native", torch_names=("torch.Tensor.__getitem__",), samples=_GETITEM_SAMPLES,
    reference=lambda x, key: x[_ref_key(key)], data_dependent=True)  # bool masks, 0-d index tensors
def getitem(input, key):
    """``input[key]``: ints, slices, None, ``...``, bool masks, index tensors. A top-level list is a
    tuple index, never an advanced one: the client sends ``x[[0, 1]]``'s list as an int64 tensor"""
    # torch's own indexing and derivative: a basic index (ints, slices, None, ...) gives a view sharing
    # ``input``'s memory, as in torch; index tensors give a copy (see the note in ``shape``)
    return input[_key(key, input.device)]


def _grad_for_value(g: torch.Tensor, like: TensorLike | None):
    """The value's gradient from ``grad[key]``: torch drops a value's leading 1s, then broadcasts."""
    if like is None:
        return None
    dims = list(like.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return sum_to(g, TensorLike(torch.Size(dims), like.dtype)).reshape(like.shape)


class SetItem(Function):
    @staticmethod
    def forward(ctx, x, value, template, *tensors):
        ctx.template, ctx.value = template, like_of(value)
        ctx.save_for_backward(*tensors)
        out = x.clone()
        out[_unpack(template, tensors)] = value
        return out

    @staticmethod
    def backward(ctx, g):
        key = _unpack(ctx.template, ctx.saved_tensors)
        gx = setitem(g, key, 0.0) if needs(ctx, 0) else None  # overwritten places get nothing
        gv = _grad_for_value(getitem(g, key), ctx.value) if needs(ctx, 1) else None
        return gx, gv, None, *(None for _ in ctx.saved_tensors)


def _setitem_reference(input, key, value):
    out = input.clone()
    out[_ref_key(key)] = value
    return out


@op("setitem", torch_names=("torch.Tensor.__setitem__",), inplace=True,
    samples=(S(T((4, 3)), 1, 5.0), S(T((4, 3)), [slice(None), 0], T((4,))), S(T((4, 3)), [[2, 0]], T((2, 3))),
             S(T((4, 3)), T((4,), **_B), 0.0), S(T((4, 3)), [Ellipsis, None, slice(1, None)], T((1, 2))),
             S(T((4, 3)), slice(0, 2), T((1, 1, 3))), S(T((4, 3)), [[0, 3], [1, 2]], T(())),
             S(T((3, 4), noncontiguous=True), [slice(None), [1, 3]], T((3, 2))),
             S(T((4, 3)), [1, 2], T((), dtype="float64")), S(T(()), Ellipsis, 2.0),
             S(T((4, 3), requires_grad=False), 0, T((3,))), S(T((2, 3)), T((2, 3), **_B), T(()))),
    reference=_setitem_reference)
def setitem(input, key, value):
    """``input[key] = value`` (a number or a tensor), as a new tensor: the runner writes it into ``input``.
    ``key`` as for ``getitem``: a top-level list is a tuple index"""
    template, tensors = _pack(_key(key, input.device))
    return SetItem.apply(input, value, template, *tensors)


class Gather(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(index)
        return torch.gather(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return g.new_zeros(ctx.shape).scatter_add(ctx.dim, index, g), None, None


@op("gather", torch_names=("torch.gather", "torch.Tensor.gather"),
    samples=(S(T((3, 4)), 1, _ix((3, 2), 4)), S(T((3, 4)), 0, _ix((5, 4), 3)),
             S(T((3, 4)), -1, _ix((2, 2), 4)), S(T(()), 0, _ix((), 1)),
             S(T((4, 3), noncontiguous=True), 0, _ix((2, 3), 4))),
    reference=torch.gather)
def gather(input, dim, index, *, sparse_grad=False):
    """``out[i][j] = input[index[i][j]][j]`` (for dim 0); repeated indices add up in the gradient"""
    return Gather.apply(input, dim, index)


def _src_grad(g: torch.Tensor, dim: int, index: torch.Tensor, like: TensorLike) -> torch.Tensor:
    """``g.gather(dim, index)``, zero-padded to ``src``'s shape when ``src`` is larger than ``index``."""
    g = g.gather(dim, index)
    pad = [n for have, want in zip(reversed(g.shape), reversed(like.shape)) for n in (0, want - have)]
    return sum_to(F.pad(g, pad) if any(pad) else g, like)


class Scatter(Function):
    @staticmethod
    def forward(ctx, x, dim, index, src):
        ctx.dim, ctx.src = dim, like_of(src)
        ctx.save_for_backward(index)
        return torch.scatter(x, dim, index, src)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        gx = g.scatter(ctx.dim, index, 0.0) if needs(ctx, 0) else None  # overwritten places get nothing
        gs = _src_grad(g, ctx.dim, index, ctx.src) if needs(ctx, 3) else None
        return gx, None, None, gs


_SCATTER_INDEX = _ix((2, 3), 3)


@op("scatter", torch_names=("torch.scatter", "torch.Tensor.scatter", "torch.Tensor.scatter_"),
    samples=(S(T((3, 3)), 0, _ix((1, 3), 3), T((1, 3))),  # one write per place: src grads are exact
             S(T((3, 4)), 1, _ix((3, 2), 4), 2.5),
             S(T((3, 4)), -1, _ix((2, 1), 4), value=-1.0),
             S(T((4, 3), noncontiguous=True), 1, _ix((4, 1), 3), src=T((4, 1)))),
    reference=torch.scatter)
def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """``input`` with ``src`` (a tensor) or ``value`` (a number) written at ``index`` along ``dim``"""
    src = value if src is None else src
    if src is None:
        raise TypeError("scatter(): expected src (a tensor) or value (a number)")
    if reduce is not None:
        raise NotImplementedError("scatter(reduce=...) is not supported here (torch gives it no gradient either); "
                                  "use scatter_add or scatter_reduce")
    return Scatter.apply(input, dim, index, src)


class ScatterAdd(Function):
    @staticmethod
    def forward(ctx, x, dim, index, src):
        ctx.dim, ctx.src = dim, like_of(src)
        ctx.save_for_backward(index)
        return torch.scatter_add(x, dim, index, src)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        gs = _src_grad(g, ctx.dim, index, ctx.src) if needs(ctx, 3) else None
        return g, None, None, gs


@op("scatter_add", torch_names=("torch.scatter_add", "torch.Tensor.scatter_add", "torch.Tensor.scatter_add_"),
    samples=(S(T((3, 3)), 0, _SCATTER_INDEX, T((2, 3))), S(T((3, 4)), 1, _ix((3, 6), 4), T((3, 6))),
             S(T((3, 4)), -1, _ix((2, 2), 4), T((2, 2))),
             S(T((3, 3), noncontiguous=True), 0, _SCATTER_INDEX, T((2, 3), requires_grad=False))),
    reference=torch.scatter_add)
def scatter_add(input, dim, index, src):
    """``input`` with ``src`` added at ``index`` along ``dim`` (repeated indices add up)"""
    return ScatterAdd.apply(input, dim, index, src)


class IndexSelect(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        ctx.shape, ctx.dim = x.shape, dim
        ctx.save_for_backward(index)
        return torch.index_select(x, dim, index)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved_tensors
        return g.new_zeros(ctx.shape).index_add(ctx.dim, index, g), None, None


@op("index_select", torch_names=("torch.index_select", "torch.Tensor.index_select"),
    samples=(S(T((4, 3)), 0, _ix((5,), 4)), S(T((4, 3)), -1, _ix((2,), 3)),
             S(T((4, 3)), 1, _ix((), 3)), S(T((3, 4), noncontiguous=True), 1, _ix((3,), 4)),
             S(T((4, 3)), 0, T((0,), **_I))),
    reference=torch.index_select)
def index_select(input, dim, index):
    """the entries of ``input`` at ``index`` (0-d or 1-d) along ``dim``"""
    return IndexSelect.apply(input, dim, index)


class MaskedFill(Function):
    @staticmethod
    def forward(ctx, x, mask, value):
        ctx.x, ctx.value = like_of(x), like_of(value)
        ctx.save_for_backward(mask)
        return torch.masked_fill(x, mask, value)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        gx = sum_to(g.masked_fill(mask, 0), ctx.x) if needs(ctx, 0) else None
        gv = sum_to(torch.where(mask, g, 0).sum(), ctx.value) if needs(ctx, 2) else None
        return gx, None, gv


@op("masked_fill", torch_names=("torch.masked_fill", "torch.Tensor.masked_fill", "torch.Tensor.masked_fill_"),
    samples=(S(T((2, 3)), T((2, 3), **_B), 0.5), S(T((2, 3)), T((3,), **_B), T(())), S(T((3,)), T((2, 3), **_B), -1.0),
             S(T((3, 2), noncontiguous=True), T((3, 2), **_B), T((), dtype="float64")), S(T(()), T((), **_B), 2.0)),
    reference=torch.masked_fill)
def masked_fill(input, mask, value):
    """``input`` with ``value`` (a number or a 0-d tensor) where ``mask`` is True"""
    return MaskedFill.apply(input, mask, value)


class MaskedSelect(Function):
    @staticmethod
    def forward(ctx, x, mask):
        ctx.x = like_of(x)
        ctx.save_for_backward(mask)
        return torch.masked_select(x, mask)

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        shape = torch.broadcast_shapes(ctx.x.shape, mask.shape)
        return sum_to(g.new_zeros(shape).masked_scatter(mask.expand(shape), g), ctx.x), None


@op("masked_select", torch_names=("torch.masked_select", "torch.Tensor.masked_select"), shape_rule="none",
    data_dependent=True, output_bound=lambda input, mask: math.prod(torch.broadcast_shapes(input.shape, mask.shape)),
    samples=(S(T((2, 3)), T((2, 3), **_B)), S(T((2, 3)), T((3,), **_B)), S(T((3,)), T((2, 3), **_B)),
             S(T((3, 2), noncontiguous=True), T((3, 2), **_B))),
    reference=torch.masked_select)
def masked_select(input, mask):
    """the entries where ``mask`` is True, as a 1-d tensor (its length depends on the mask: shape_rule none)"""
    return MaskedSelect.apply(input, mask)

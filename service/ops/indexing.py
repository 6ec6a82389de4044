"""Indexing: ``x[key]`` and ``x[key] = value``, torch's own, with the SDK's wire form of a key.

The ``key`` of ``x[key]`` on the wire: the client sends it as the second positional
argument, a Python tuple becoming a list. So here a top-level LIST is ALWAYS a tuple
index (``x[1:, None]`` arrives as ``[slice(1, None), None]``, ``x[0, 1]`` as ``[0, 1]``);
the client turns a Python list index (``x[[0, 1]]``, advanced indexing) into an int64
tensor before sending. A list nested inside the tuple is an advanced index, as in torch.
"""

from __future__ import annotations

import torch

from ._registry import op
from ._samples import S, T
from .bounds import getitem_bound


def _key(key, device) -> tuple:
    """The tuple torch would index with (see the module docstring); nested lists become index tensors."""
    items = tuple(key) if isinstance(key, (list, tuple)) else (key,)
    return tuple(torch.tensor(k, device=device, dtype=None if k else torch.int64) if isinstance(k, list) else k
                 for k in items)


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
    reference=lambda x, key: x[_ref_key(key)], data_dependent=True, output_bound=getitem_bound)  # bool masks
def getitem(input, key):
    """``input[key]``: ints, slices, None, ``...``, bool masks, index tensors. A top-level list is a
    tuple index, never an advanced one: the client sends ``x[[0, 1]]``'s list as an int64 tensor"""
    # torch's own indexing and derivative: a basic index (ints, slices, None, ...) gives a view sharing
    # ``input``'s memory, as in torch; index tensors give a copy
    return input[_key(key, input.device)]


def _setitem_reference(input, key, value):
    out = input.clone()
    out[_ref_key(key)] = value
    return out


@op("setitem", kind="native", torch_names=("torch.Tensor.__setitem__",), inplace=True,
    samples=(S(T((4, 3)), 1, 5.0), S(T((4, 3)), [slice(None), 0], T((4,))), S(T((4, 3)), [[2, 0]], T((2, 3))),
             S(T((4, 3)), T((4,), **_B), 0.0), S(T((4, 3)), [Ellipsis, None, slice(1, None)], T((1, 2))),
             S(T((4, 3)), slice(0, 2), T((1, 1, 3))), S(T((4, 3)), [[0, 3], [1, 2]], T(())),
             S(T((3, 4), noncontiguous=True), [slice(None), [1, 3]], T((3, 2))),
             S(T((4, 3)), [1, 2], T((), dtype="float64")), S(T(()), Ellipsis, 2.0),
             S(T((4, 3), requires_grad=False), 0, T((3,))), S(T((2, 3)), T((2, 3), **_B), T(()))),
    reference=_setitem_reference)
def setitem(input, key, value):
    """``input[key] = value`` (a number or a tensor), torch's own on a copy of ``input`` (its derivative
    too), which the runner then writes into ``input``: an index out of range found midway leaves
    ``input`` as it was. ``key`` as for ``getitem``: a top-level list is a tuple index"""
    out = input.clone()
    out[_key(key, input.device)] = value
    return out

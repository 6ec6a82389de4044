"""Sorting and selection: topk, sort, argsort, kthvalue, median, cummax / cummin, multinomial.

All native: torch's own kernels and derivatives (the gradient goes to the selected
positions). Samples draw continuous values, so there are no ties for gradcheck to trip on.
"""

from __future__ import annotations

import torch

from ._context import current
from ._native import native_op
from ._registry import op
from ._samples import S, T

_X = T((3, 5))

native_op("topk", torch.topk, torch_names=("torch.topk", "torch.Tensor.topk"),
          samples=(S(_X, 2), S(_X, 2, 0, largest=False), S(T((6,)), 3, sorted=True), S(T((2, 4), noncontiguous=True), 1)))
native_op("sort", torch.sort, torch_names=("torch.sort", "torch.Tensor.sort"),
          samples=(S(_X), S(_X, 0, True), S(T((6,)), descending=True), S(_X, dim=1, stable=True)))
native_op("argsort", torch.argsort, torch_names=("torch.argsort", "torch.Tensor.argsort"), differentiable=False,
          samples=(S(_X), S(_X, 0, True), S(T((6,)), descending=True)))
native_op("kthvalue", torch.kthvalue, torch_names=("torch.kthvalue", "torch.Tensor.kthvalue"),
          samples=(S(_X, 2), S(_X, 1, 0, True), S(T((5,)), 3)))
native_op("median", torch.median, torch_names=("torch.median", "torch.Tensor.median"),
          samples=(S(T((3, 5))), S(_X, 1), S(_X, 0, keepdim=True)))
native_op("cummax", torch.cummax, torch_names=("torch.cummax", "torch.Tensor.cummax"),
          samples=(S(_X, 1), S(_X, 0), S(T((5,)), dim=0)))
native_op("cummin", torch.cummin, torch_names=("torch.cummin", "torch.Tensor.cummin"),
          samples=(S(_X, 1), S(_X, dim=-2)))


@op("multinomial", torch_names=("torch.multinomial", "torch.Tensor.multinomial"), reference=torch.multinomial,
    differentiable=False, exact=False, kind="native",
    samples=(S(T((3, 4), low=0.1, high=1.0, requires_grad=False), 2),
             S(T((5,), low=0.1, high=1.0, requires_grad=False), 8, True),
             S(T((2, 6), low=0.0, high=1.0, requires_grad=False), 3, replacement=False)))
def multinomial(input, num_samples, replacement=False):
    """torch's own multinomial, drawing from the session's generator"""
    return torch.multinomial(input, num_samples, replacement, generator=current().generator)

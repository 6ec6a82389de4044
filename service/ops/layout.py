"""Shape-like ops that read another tensor's shape, and sliding windows: native entries.

``view_as`` / ``reshape_as``, ``Tensor.unfold`` (windows along one dim), ``F.unfold`` /
``F.fold`` (im2col / col2im): torch's own kernels and derivatives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._native import native_op
from ._samples import S, T

_OTHER = T((6,), requires_grad=False)

native_op("view_as", torch.Tensor.view_as, torch_names=("torch.Tensor.view_as",), no_grad_args=(1,),
          samples=(S(T((2, 3)), _OTHER), S(T((6,)), T((3, 2), requires_grad=False))))
native_op("reshape_as", torch.Tensor.reshape_as, torch_names=("torch.Tensor.reshape_as",), no_grad_args=(1,),
          samples=(S(T((2, 3)), _OTHER), S(T((2, 3), noncontiguous=True), T((6, 1), requires_grad=False))))
native_op("unfold", torch.Tensor.unfold, torch_names=("torch.Tensor.unfold",),
          samples=(S(T((2, 7)), 1, 3, 2), S(T((5,)), 0, 2, 1), S(T((3, 4), noncontiguous=True), 0, 2, 1)))
native_op("im2col", F.unfold, torch_names=("torch.nn.functional.unfold",),
          samples=(S(T((1, 2, 4, 4)), 2), S(T((2, 1, 5, 4)), (2, 3), dilation=1, padding=1, stride=2),
                   S(T((2, 3, 3)), 2)))
native_op("col2im", F.fold, torch_names=("torch.nn.functional.fold",),
          samples=(S(T((1, 8, 9)), (4, 4), 2), S(T((2, 4, 4)), (3, 3), 2, stride=1),
                   S(T((1, 6, 4)), (4, 4), (3, 2), padding=(1, 0), stride=(2, 2))))

"""Dropout variants: whole channels (``dropout1d/2d/3d``), alpha dropout and its feature form.

Native entries drawing from the session's generator (``random=True``): torch's own
kernels, whose masks are kept by autograd for backward. Plain ``dropout`` is in
activations.py (it predates native entries; its step is as fast either way).
"""

from __future__ import annotations

import torch.nn.functional as F

from ._native import native_op
from ._samples import S, T

_F = "torch.nn.functional."

native_op("dropout1d", F.dropout1d, torch_names=(_F + "dropout1d",), random=True,
          samples=(S(T((2, 4, 5)), 0.5), S(T((4, 3)), p=0.3), S(T((2, 4, 5)), 0.5, False)))
native_op("dropout2d", F.dropout2d, torch_names=(_F + "dropout2d",), random=True,
          samples=(S(T((2, 4, 3, 3)), 0.5), S(T((1, 3, 2, 2)), p=0.3), S(T((2, 4, 3, 3)), 0.5, training=False)))
native_op("dropout3d", F.dropout3d, torch_names=(_F + "dropout3d",), random=True,
          samples=(S(T((2, 3, 2, 2, 2)), 0.5), S(T((3, 2, 2, 2)), p=0.4)))
native_op("alpha_dropout", F.alpha_dropout, torch_names=(_F + "alpha_dropout",), random=True,
          samples=(S(T((4, 5)), 0.5, True), S(T((3, 4)), p=0.2, training=True), S(T((3, 4)), 0.5, False)))
native_op("feature_alpha_dropout", F.feature_alpha_dropout, torch_names=(_F + "feature_alpha_dropout",),
          random=True, samples=(S(T((2, 4, 3)), 0.5, True), S(T((2, 3, 2, 2)), p=0.3, training=True)))

"""Pooling in 1, 2 and 3 spatial dims beyond conv.py's 2-d entries: native entries.

Max (with and without indices), average, adaptive average and adaptive max: torch's own
kernels and derivatives (each backward is itself differentiable). Samples draw continuous
values, so no window has a tie for gradcheck to trip on.
"""

from __future__ import annotations

import torch.nn.functional as F

from ._native import native_op
from ._samples import S, T

_F = "torch.nn.functional."
_1D, _3D = T((2, 2, 7)), T((1, 2, 4, 4, 3))

_MAX_1D = (S(_1D, 2), S(_1D, 3, 2, 1), S(T((2, 6)), 2, dilation=2, ceil_mode=True))
_MAX_3D = (S(_3D, 2), S(_3D, (2, 2, 1), 1, (1, 0, 0)), S(T((2, 3, 3, 3)), 2, ceil_mode=True))

native_op("max_pool1d", F.max_pool1d, torch_names=(_F + "max_pool1d", "torch.max_pool1d"), samples=_MAX_1D)
native_op("max_pool1d_with_indices", F.max_pool1d_with_indices, torch_names=(_F + "max_pool1d_with_indices",),
          samples=_MAX_1D)
native_op("max_pool3d", F.max_pool3d, torch_names=(_F + "max_pool3d", "torch.max_pool3d"), samples=_MAX_3D)
native_op("max_pool3d_with_indices", F.max_pool3d_with_indices, torch_names=(_F + "max_pool3d_with_indices",),
          samples=_MAX_3D)
native_op("avg_pool1d", F.avg_pool1d, torch_names=(_F + "avg_pool1d", "torch.avg_pool1d"),
          samples=(S(_1D, 2), S(_1D, 3, 2, 1, True, False), S(T((2, 5)), 2, ceil_mode=True)))
native_op("avg_pool3d", F.avg_pool3d, torch_names=(_F + "avg_pool3d",),
          samples=(S(_3D, 2), S(_3D, (2, 2, 1), 1, (1, 0, 0), count_include_pad=False),
                   S(T((2, 3, 3, 3)), 2, divisor_override=3)))
native_op("adaptive_avg_pool1d", F.adaptive_avg_pool1d, torch_names=(_F + "adaptive_avg_pool1d",
                                                                     "torch.adaptive_avg_pool1d"),
          samples=(S(_1D, 3), S(T((2, 5)), 1), S(_1D, 9)))
native_op("adaptive_avg_pool3d", F.adaptive_avg_pool3d, torch_names=(_F + "adaptive_avg_pool3d",),
          samples=(S(_3D, 2), S(_3D, (1, None, 2))))
for _dims, _samples in ((1, (S(_1D, 3), S(T((2, 5)), 2))), (2, (S(T((1, 2, 5, 4)), 2), S(T((2, 4, 5)), (3, None)))),
                        (3, (S(_3D, 2), S(_3D, (1, 3, 2))))):
    native_op(f"adaptive_max_pool{_dims}d", getattr(F, f"adaptive_max_pool{_dims}d"),
              torch_names=(_F + f"adaptive_max_pool{_dims}d",), samples=_samples)
    native_op(f"adaptive_max_pool{_dims}d_with_indices", getattr(F, f"adaptive_max_pool{_dims}d_with_indices"),
              torch_names=(_F + f"adaptive_max_pool{_dims}d_with_indices",), samples=_samples)

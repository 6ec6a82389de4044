"""``Tensor.type(dtype)``: a conversion by dtype or by a CPU type name, as torch's own ``to``.

The other conversions (``to``, ``float()``, ``double()``, ...) are torch's own from the surface
(``surface.json``; ``to`` refuses a device other than the tensor's own: ``arg_checks.py``). This
entry is ours only because ``type("torch.DoubleTensor")`` names a CPU type: on a GPU server
torch's own would move the tensor to the CPU.
"""

from __future__ import annotations

import torch

from ._registry import op
from ._samples import S, T

_TYPE_NAMES = {
    "torch.FloatTensor": torch.float32, "torch.DoubleTensor": torch.float64, "torch.HalfTensor": torch.float16,
    "torch.BFloat16Tensor": torch.bfloat16, "torch.LongTensor": torch.int64, "torch.IntTensor": torch.int32,
    "torch.ShortTensor": torch.int16, "torch.CharTensor": torch.int8, "torch.ByteTensor": torch.uint8,
    "torch.BoolTensor": torch.bool,
}


@op("type", torch_names=("torch.Tensor.type",), kind="native",
    samples=(S(T((2, 3)), torch.float64), S(T((2, 3)), "torch.DoubleTensor"), S(T((2, 3)), dtype=torch.float64),
             S(T((2, 3), requires_grad=False), torch.int32)),
    reference=torch.Tensor.type)
def convert_type(input, dtype=None, non_blocking=False):
    """``input.to(dtype)``; ``dtype`` may be a CPU type name such as ``"torch.DoubleTensor"``"""
    if dtype is None:
        raise TypeError("type() without a dtype returns the type's name, not a tensor: the client answers it")
    if isinstance(dtype, str):
        if dtype not in _TYPE_NAMES:
            raise ValueError(f"type(): unsupported type name {dtype!r}; "
                             f"expected a dtype or one of {', '.join(_TYPE_NAMES)}")
        dtype = _TYPE_NAMES[dtype]
    return input.to(dtype)  # torch's own conversion and derivative



"""The process-global torch settings that change an op's result, as a program carries them (SPEC §3).

torch keeps these per process, not per thread: the default dtype (factories, and integer inputs
promoted to floating point: ``torch.arange(4).sqrt()``), deterministic algorithms (an op without a
deterministic kernel raises; uninitialised memory is filled with NaN), the float32 precision of
matmuls (TF32, bfloat16) and cuDNN's flags. A client's settings are not the server's, so a program
carries the client's (``TorchGlobals`` in ``messages.py``) and the server runs it under them
(``service/engine/torch_globals.py``). Both sides read this one table.

A *state* is a tuple in the order of ``TorchGlobals``' fields, the default dtype a ``torch.dtype``.
The wire carries the fields that differ from torch's defaults, and nothing when none does.

The float32 precisions are read and set through torch's first API
(``torch.set_float32_matmul_precision``, ``torch.backends.cuda.matmul.allow_tf32``,
``torch.backends.cudnn.allow_tf32``), which keeps torch's two APIs consistent; torch refuses to read
them that way once the per-backend ``fp32_precision`` API has been used, and so does the SDK, saying so.
"""

from __future__ import annotations

import torch

from .dtypes import DTYPES, dtype_name
from .messages import TorchGlobals

_C = torch._C

FIELDS: tuple[str, ...] = tuple(TorchGlobals.model_fields)
DEFAULT: tuple = (torch.float32, *(f.default for f in list(TorchGlobals.model_fields.values())[1:]))  # torch's own

# How the user spells each in torch (errors name them so)
SPELLINGS = {
    "default_dtype": "torch.set_default_dtype",
    "deterministic_algorithms": "torch.use_deterministic_algorithms",
    "deterministic_warn_only": "torch.use_deterministic_algorithms(warn_only=...)",
    "fill_uninitialized_memory": "torch.utils.deterministic.fill_uninitialized_memory",
    "float32_matmul_precision": "torch.set_float32_matmul_precision (torch.backends.cuda.matmul.allow_tf32)",
    "cudnn_allow_tf32": "torch.backends.cudnn.allow_tf32",
    "cudnn_deterministic": "torch.backends.cudnn.deterministic",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark",
}


def read() -> tuple:
    """The whole state as torch has it now (the SDK reads the default dtype per op, and the rest, ``read()[1:]``,
    when a queue gets its first op and when it is sent)."""
    try:
        precision, cudnn_tf32 = _C._get_float32_matmul_precision(), _C._get_cudnn_allow_tf32()
    except RuntimeError as exc:  # torch's "mix of the legacy and new APIs"
        raise RuntimeError(
            "remote-autograd sends torch's float32 precision to the server as torch.set_float32_matmul_precision and "
            "torch.backends.cudnn.allow_tf32 set it; torch cannot say it that way once the per-backend fp32_precision "
            f"API was used ({exc}). Set it with torch.set_float32_matmul_precision(...) and "
            "torch.backends.cudnn.allow_tf32 instead") from None
    return (torch.get_default_dtype(), _C._get_deterministic_algorithms(), _C._get_deterministic_algorithms_warn_only(),
            _C._get_deterministic_fill_uninitialized_memory(), precision, cudnn_tf32, _C._get_cudnn_deterministic(),
            _C._get_cudnn_benchmark())


def apply(state: tuple) -> None:
    """Make ``state`` torch's, through the same setters the user's torch calls use."""
    dtype, deterministic, warn_only, fill, precision, cudnn_tf32, cudnn_deterministic, cudnn_benchmark = state
    torch.set_default_dtype(dtype)
    _C._set_deterministic_algorithms(deterministic, warn_only=warn_only)
    _C._set_deterministic_fill_uninitialized_memory(fill)
    _C._set_float32_matmul_precision(precision)
    _C._set_cudnn_allow_tf32(cudnn_tf32)
    _C._set_cudnn_deterministic(cudnn_deterministic)
    _C._set_cudnn_benchmark(cudnn_benchmark)


def to_wire(state: tuple) -> dict | None:
    """A program's ``torch_globals``: the fields not at torch's defaults (None when none is)."""
    if state == DEFAULT:
        return None
    wire = {name: value for name, value, default in zip(FIELDS, state, DEFAULT) if value != default}
    if "default_dtype" in wire:
        wire["default_dtype"] = dtype_name(state[0])
    return wire


def from_wire(globals_: TorchGlobals | None) -> tuple:
    """The state a program asks for (torch's defaults when it names none)."""
    if globals_ is None:
        return DEFAULT
    values = tuple(getattr(globals_, name) for name in FIELDS)
    return (DTYPES[values[0]], *values[1:])


def changed(before: tuple, after: tuple) -> list[str]:
    """How the user spells each setting that differs between two states."""
    return [SPELLINGS[name] for name, a, b in zip(FIELDS, before, after) if a != b]

"""The dtypes the wire knows: name <-> torch dtype, with fixed itemsizes.

A closed table: a dtype name from the wire is looked up here and nowhere else.
"""

from __future__ import annotations

import torch

from .errors import bad_request

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}

DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}

ITEMSIZES: dict[str, int] = {name: dt.itemsize for name, dt in DTYPES.items()}


def dtype_from_name(name: object, field: str = "dtype") -> torch.dtype:
    """The torch dtype for a wire name; a 400 naming the field for anything else."""
    if not isinstance(name, str) or name not in DTYPES:
        raise bad_request(f"{field}: unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise bad_request(f"dtype {dtype} has no wire encoding") from None

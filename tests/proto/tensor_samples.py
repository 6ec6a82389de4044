"""Sample tensors of every dtype, a bitwise comparison, and round trips through both wire forms:
shared by the unit tests of ``proto`` (test_tensor_encoding, test_properties)."""

from __future__ import annotations

import json

import msgpack
import torch

from remote_autograd.proto import DTYPES, decode_tensor, encode_tensor


ALL_DTYPES = list(DTYPES)
INTS = ["int8", "int16", "int32", "int64", "uint8"]
COMPLEX = ["complex64", "complex128"]


def sample_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A tensor of ``name`` with varied values (finite floats; the full range for ints)."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[name]
    if name == "bool":
        return torch.randint(0, 2, shape, generator=g).bool()
    if name in INTS:
        info = torch.iinfo(dt)
        return torch.randint(max(info.min, -(2**62)), min(info.max, 2**62), shape, generator=g, dtype=torch.int64).to(dt)
    if name in COMPLEX:
        return torch.randn(shape, generator=g, dtype=dt)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dt)


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (C-contiguous), for bitwise comparison including NaN payloads."""
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def assert_bitwise_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert torch.equal(raw_bytes(got), raw_bytes(want))


def json_round_trip(t: torch.Tensor) -> torch.Tensor:
    wire = encode_tensor(t, as_json=True)
    text = json.dumps(wire, allow_nan=False)  # the list form never needs NaN/inf literals
    return decode_tensor(json.loads(text))


def msgpack_round_trip(t: torch.Tensor) -> torch.Tensor:
    wire = encode_tensor(t)
    assert isinstance(wire["data"], bytes)
    return decode_tensor(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False))

"""Unit tests of ``proto``'s tensor encoding: round trips of every dtype and layout, the JSON
forms (lists or base64), and decoding as one copy. No server."""

from __future__ import annotations

import base64
import json
import math

import pytest
import torch

from remote_autograd import proto
from remote_autograd.proto import (DTYPES, ITEMSIZES, ProtocolError, decode_body, decode_tensor, encode_body,
                                   encode_tensor)

from ..bits import torch_copies
from .tensor_samples import (ALL_DTYPES, assert_bitwise_equal, json_round_trip, msgpack_round_trip, raw_bytes,
                             sample_tensor)


# -- round trips --------------------------------------------------------------------------

SHAPES = [(), (0,), (2, 0, 3), (5,), (3, 4), (2, 3, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", ALL_DTYPES)
def test_round_trip_every_dtype(name, shape):
    t = sample_tensor(name, shape)
    wire = encode_tensor(t)
    assert wire["dtype"] == name and wire["shape"] == list(shape)
    assert len(wire["data"]) == math.prod(shape) * ITEMSIZES[name]
    assert wire["data"] == bytes(raw_bytes(t).numpy())
    assert_bitwise_equal(decode_tensor(wire), t)
    assert_bitwise_equal(msgpack_round_trip(t), t)
    assert_bitwise_equal(json_round_trip(t), t)


def test_itemsizes_table():
    assert ITEMSIZES == {
        "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
        "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
    }
    assert set(proto.DTYPE_NAMES.values()) == set(DTYPES)


def test_bytes_are_little_endian_row_major():
    t = torch.tensor([[1, 2], [3, 256]], dtype=torch.int16)
    assert encode_tensor(t)["data"] == bytes([1, 0, 2, 0, 3, 0, 0, 1])
    assert encode_tensor(t.t())["data"] == bytes([1, 0, 3, 0, 2, 0, 0, 1])  # the transposed tensor's row-major order
    assert encode_tensor(torch.tensor(True))["data"] == b"\x01"


def _non_contiguous(name: str) -> list[torch.Tensor]:
    base = sample_tensor(name, (4, 6), seed=1)
    big = sample_tensor(name, (10,), seed=2)
    return [
        base.t(),                      # transposed
        base[:, ::2],                  # step slice
        base[1:3],                     # contiguous but offset into a larger storage
        big[2:5],                      # 1-d offset view
        big[::3],                      # 1-d strided
        base[0, 1],                    # 0-d view
        sample_tensor(name, (1, 3), seed=3).expand(4, 3),  # stride 0
    ]


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_round_trip_non_contiguous(name):
    for t in _non_contiguous(name):
        want = t.contiguous().clone()
        assert_bitwise_equal(msgpack_round_trip(t), want)
        assert_bitwise_equal(json_round_trip(t), want)


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_a_private_copy_has_the_plain_encodings_bytes_and_keeps_them(name):
    """``private=True`` (an upload's copy, made by numpy): the bytes of the plain encoding, for every
    dtype and layout, in memory of its own: the tensor changed afterwards leaves them as they were."""
    for t in [sample_tensor(name, (4, 6)), sample_tensor(name, ()), sample_tensor(name, (0, 3)), *_non_contiguous(name)]:
        t = t.clone() if t.stride() == (0, 1) else t  # not the expanded one: it is written below
        wire = encode_tensor(t, as_view=True, private=True)
        plain = encode_tensor(t)
        assert (wire["dtype"], wire["shape"]) == (plain["dtype"], plain["shape"])
        assert bytes(wire["data"]) == plain["data"]
        t.fill_(1)
        assert bytes(wire["data"]) == plain["data"]


def test_a_private_copy_runs_no_torch_kernel_that_copies():
    """numpy copies it: torch's ``clone``/``copy_`` of this size would wake torch's intra-op threads,
    which spin afterwards on the cores a server beside the client needs (``service/openmp_wait.py``)."""
    x = torch.randn(64, 784)
    for t in (x, x.t(), x.to(torch.bfloat16)[:, ::2]):
        with torch_copies() as copies:
            encode_tensor(t, as_view=True, private=True)
        assert not copies


def test_conj_and_neg_views_encode_their_values():
    """A conj/neg view's storage holds the unflipped numbers; the wire must carry the view's values."""
    x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    c = x.conj()
    assert c.is_conj()
    assert torch.equal(msgpack_round_trip(c), torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert torch.equal(json_round_trip(c), torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    n = torch._neg_view(torch.tensor([1.0, 2.0]))
    assert torch.equal(msgpack_round_trip(n), torch.tensor([-1.0, -2.0]))


def test_graph_and_grad_are_not_encoded():
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    out = decode_tensor(encode_tensor(y))
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(out, y.detach())


# -- JSON forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_json_special_floats_go_as_base64_and_round_trip_bitwise(name):
    dt = DTYPES[name]
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -0.0], dtype=dt)
    # a NaN with a payload and the sign bit set
    bits = {torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}[dt]
    odd_nan = torch.tensor([-1], dtype=bits).view(dt)
    t = torch.cat([t, odd_nan])
    wire = encode_tensor(t, as_json=True)
    assert isinstance(wire["data"], str)
    assert base64.b64decode(wire["data"]) == t.numpy().tobytes()
    assert_bitwise_equal(json_round_trip(t), t)
    # a single inf is enough to switch the whole tensor to base64
    assert isinstance(encode_tensor(torch.tensor([float("inf")], dtype=dt), as_json=True)["data"], str)


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_json_finite_floats_go_as_lists_and_round_trip_bitwise(name):
    dt = DTYPES[name]
    finfo = torch.finfo(dt)
    t = torch.tensor([0.0, -0.0, 1.5, -2.25, finfo.max, finfo.min, finfo.tiny, finfo.tiny / 4, finfo.eps], dtype=dt)
    t = torch.cat([t, sample_tensor(name, (20,))])
    wire = encode_tensor(t, as_json=True)
    assert isinstance(wire["data"], list)
    assert all(isinstance(v, float) for v in wire["data"])
    assert_bitwise_equal(json_round_trip(t), t)


def test_json_int64_beyond_2_53_goes_as_base64():
    exact = torch.tensor([2**53, -(2**53), 0, 7], dtype=torch.int64)
    assert isinstance(encode_tensor(exact, as_json=True)["data"], list)
    for big in (2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63)):
        t = torch.tensor([1, big], dtype=torch.int64)
        wire = encode_tensor(t, as_json=True)
        assert isinstance(wire["data"], str), big
        assert_bitwise_equal(json_round_trip(t), t)


@pytest.mark.parametrize("name", ["bfloat16", "complex64", "complex128"])
def test_json_bfloat16_and_complex_always_base64(name):
    t = sample_tensor(name, (3, 2))
    wire = encode_tensor(t, as_json=True)
    assert isinstance(wire["data"], str)
    assert_bitwise_equal(json_round_trip(t), t)
    # and a list is refused for them: bfloat16 never passes through float32
    with pytest.raises(ProtocolError) as info:
        decode_tensor({"dtype": name, "shape": [1], "data": [1.0]})
    assert info.value.status == 400 and name in info.value.message and "base64" in info.value.message


@pytest.mark.parametrize("name", ["int8", "int16", "int32", "uint8", "bool"])
def test_json_small_ints_and_bool_go_as_lists(name):
    t = sample_tensor(name, (2, 5))
    wire = encode_tensor(t, as_json=True)
    assert isinstance(wire["data"], list)
    assert_bitwise_equal(json_round_trip(t), t)


def test_json_extreme_ints_round_trip():
    for name in ["int8", "int16", "int32", "int64", "uint8"]:
        info = torch.iinfo(DTYPES[name])
        t = torch.tensor([info.min, info.max, 0], dtype=DTYPES[name])
        assert_bitwise_equal(json_round_trip(t), t)
        assert_bitwise_equal(msgpack_round_trip(t), t)


def test_json_bool_list_is_booleans():
    wire = encode_tensor(torch.tensor([True, False]), as_json=True)
    assert wire["data"] == [True, False]
    assert json.dumps(wire["data"]) == "[true, false]"


def test_encode_body_json_refuses_nan():
    with pytest.raises(ValueError):
        encode_body({"x": float("nan")}, as_msgpack=False)
    assert decode_body(encode_body({"a": [1, 2.5, None]}, as_msgpack=False), "application/json") == {"a": [1, 2.5, None]}
    assert decode_body(encode_body({"a": b"\x00\x01"}, as_msgpack=True), "application/msgpack") == {"a": b"\x00\x01"}


# -- decoding is a view plus one copy ------------------------------------------------------


@pytest.mark.parametrize("name", ["float32", "int64", "uint8", "complex128", "bfloat16"])
def test_decoded_tensor_does_not_share_memory(name):
    t = sample_tensor(name, (4, 3))
    raw = bytearray(encode_tensor(t)["data"])
    before = bytes(raw)
    out = decode_tensor({"dtype": name, "shape": [4, 3], "data": raw})
    assert out.untyped_storage().data_ptr() != torch.frombuffer(raw, dtype=torch.uint8).data_ptr()
    out.view(torch.uint8).fill_(0xAB)
    assert bytes(raw) == before  # the source buffer is untouched
    raw[:] = b"\0" * len(raw)
    assert out.view(torch.uint8).eq(0xAB).all()  # and the result does not see later changes of the source


def test_decoded_from_memoryview_and_bytes():
    t = torch.arange(6, dtype=torch.float32)
    raw = encode_tensor(t)["data"]
    for data in (raw, bytearray(raw), memoryview(raw)):
        out = decode_tensor({"dtype": "float32", "shape": [2, 3], "data": data})
        assert torch.equal(out, t.reshape(2, 3))
        assert out.is_contiguous()
        out.add_(1)  # writable

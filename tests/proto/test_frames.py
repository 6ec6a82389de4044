"""Framed bodies: big tensors travel as raw, aligned frames after a msgpack header."""

from __future__ import annotations

import pytest
import torch

from remote_autograd.proto import ProtocolError, decode_body, decode_tensor, encode_tensor
from remote_autograd.proto.codec import ALIGN, FRAMES, extract_frames, iter_parts, pack_frames, unpack_frames


def _body(parts) -> bytearray:
    return bytearray(b"".join(bytes(p) for p in parts))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool, torch.uint8])
def test_round_trip_without_copies(dtype):
    t = (torch.randn(257, 3) * 10).to(dtype)
    small = torch.arange(3)
    msg = {"id": "p", "steps": [
        {"kind": "put", "id": "big", "value": encode_tensor(t, as_view=True)},
        {"kind": "put", "id": "small", "value": encode_tensor(small)},
    ]}
    header, frames = extract_frames(msg, min_bytes=256)
    assert len(frames) == 1 and isinstance(header["steps"][1]["value"]["data"], bytes)
    parts, total = pack_frames(header, frames)
    body = _body(iter_parts(parts, chunk=100))
    assert len(body) == total
    out = unpack_frames(body)
    big = decode_tensor(out["steps"][0]["value"], copy=False)
    assert torch.equal(big, t)
    start = big.data_ptr() - torch.frombuffer(body, dtype=torch.uint8).data_ptr()
    assert start % ALIGN == 0 and 0 < start < len(body), "the frame is viewed in place, aligned"
    assert torch.equal(decode_tensor(out["steps"][1]["value"]), small)


@pytest.mark.parametrize("body", [b"", b"XXXX\0\0\0\0", b"RAF1\xff\xff\xff\xff", b"RAF1\x01\0\0\0\xc1"])
def test_malformed_framed_bodies_are_400(body):
    with pytest.raises(ProtocolError) as info:
        unpack_frames(bytearray(body))
    assert info.value.status == 400 and "framed body" in info.value.message


def test_a_frame_past_the_end_is_400():
    parts, _ = pack_frames({"x": {"frame": 0}}, [memoryview(b"abc")])
    body = _body(parts)[:-70]
    with pytest.raises(ProtocolError, match="does not fit"):
        unpack_frames(body)


def test_framing_keeps_no_reference_cycles():
    """Frames are whole tensors: a cycle would keep them alive until a GC pass (a server leak)."""
    import gc
    import weakref

    class Buffer(bytearray):  # a bytes-like that can be watched with a weakref
        pass

    data = Buffer(1 << 16)
    gone = weakref.ref(data)
    gc.disable()
    try:
        header, frames = extract_frames({"steps": [{"value": {"dtype": "uint8", "shape": [1 << 16], "data": data}}]},
                                        min_bytes=1)
        assert len(frames) == 1
        parts, _ = pack_frames(header, frames)
        del data, header, frames, parts
        assert gone() is None, "something still holds the framed data (a reference cycle?)"
    finally:
        gc.enable()


def test_decode_body_reads_a_framed_body_as_unpack_frames_does():
    t = torch.randn(300, 3)
    header, frames = extract_frames({"id": "p", "value": encode_tensor(t, as_view=True)}, min_bytes=256)
    body = _body(pack_frames(header, frames)[0])
    decoded = decode_body(body, FRAMES)  # the SDK reads every answer through decode_body, framed or not
    assert decoded.keys() == unpack_frames(body).keys() and torch.equal(decode_tensor(decoded["value"]), t)
    with pytest.raises(ProtocolError, match="more than 1 values"):  # the header's values are counted as ever
        decode_body(body, FRAMES, max_values=1)


def test_small_parts_come_back_whole_as_views_of_their_own_objects():
    small, empty, writable = b"abc", b"", bytearray(b"de")
    pieces = iter_parts([small, empty, memoryview(writable)], chunk=8)
    # the answer route copies a piece unless it views bytes (``piece.obj``): each is a view of its own object
    assert [bytes(p) for p in pieces] == [b"abc", b"de"] and [p.obj for p in pieces] == [small, writable]
    assert [bytes(p) for p in iter_parts([small, b"0123456789"], chunk=8)] == [b"abc", b"01234567", b"89"]

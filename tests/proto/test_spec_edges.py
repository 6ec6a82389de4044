"""The edges a client written in another language meets, as proto/SPEC.md states them, checked
against a real server: content negotiation (§1), numbers in JSON and msgpack (§1), the tensor id
rule (§3), where an error points and when ``id``/``step`` are present (§3, §8), ``not_found``,
and the padding of framed bodies (§7)."""

from __future__ import annotations

import json
import math
import os
import struct

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import decode_tensor
from remote_autograd.proto.codec import ALIGN, FRAMES, pack_frames, unpack_frames

JSON, MSGPACK = "application/json", "application/msgpack"
BIG = 1 << 15  # float32 elements: 128 KiB of data, over the 64 KiB framing threshold


@pytest.fixture
def sid(http: httpx.Client) -> str:
    sid = http.post("/v1/sessions").json()["session_id"]
    ok = http.post(f"/v1/sessions/{sid}/programs", json={"id": "setup", "steps": [
        {"kind": "put", "id": "small", "value": {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}},
        {"kind": "put", "id": "big", "value": {"dtype": "float32", "shape": [BIG],
                                               "data": [0.5] * BIG}}]})
    assert ok.status_code == 200, ok.text
    yield sid
    http.delete(f"/v1/sessions/{sid}")


def _fetch_program(tid: str) -> dict:
    return {"id": os.urandom(6).hex(), "steps": [{"kind": "fetch", "id": tid, "grad": False}]}


def _framed(message: dict) -> bytes:
    parts, total = pack_frames(message, [])
    body = b"".join(bytes(p) for p in parts)
    assert len(body) == total
    return body


def _body(ctype: str | None, message: dict) -> bytes:
    if ctype == FRAMES:
        return _framed(message)
    if ctype is not None and "msgpack" in ctype:
        return msgpack.packb(message)
    return json.dumps(message).encode()


# (request Content-Type, Accept, tensor fetched, the answer's Content-Type): SPEC.md §1's table, row by row
NEGOTIATION = [
    (MSGPACK, None, "small", MSGPACK),
    (MSGPACK, "*/*", "big", MSGPACK),
    (FRAMES, None, "big", MSGPACK),
    (JSON, None, "small", JSON),
    (None, None, "small", JSON),
    (None, "*/*", "big", JSON),
    (JSON, FRAMES, "big", FRAMES),
    (JSON, f"{FRAMES}, {MSGPACK}", "big", FRAMES),
    (MSGPACK, f"{FRAMES}, {MSGPACK}", "small", MSGPACK),  # under 64 KiB: plain msgpack
    (FRAMES, FRAMES, "small", MSGPACK),
    (JSON, MSGPACK, "big", MSGPACK),
    ("application/msgpack; charset=binary", None, "small", MSGPACK),
    (MSGPACK, JSON, "small", JSON),
    (MSGPACK, "text/html", "small", JSON),
]


@pytest.mark.parametrize("ctype,accept,tid,answer", NEGOTIATION,
                         ids=[f"{c}|{a}|{t}" for c, a, t, _ in NEGOTIATION])
def test_content_negotiation_table(http: httpx.Client, sid: str, ctype, accept, tid, answer):
    headers = {k: v for k, v in (("Content-Type", ctype), ("Accept", accept)) if v is not None}
    r = http.post(f"/v1/sessions/{sid}/programs", content=_body(ctype, _fetch_program(tid)), headers=headers)
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"].split(";")[0] == answer
    if answer == FRAMES:
        assert len(r.content) % ALIGN == 0  # the last frame is padded too (§7)
        message = unpack_frames(r.content)
    elif answer == MSGPACK:
        message = msgpack.unpackb(r.content)
    else:
        message = r.json()
    want = torch.full((BIG,), 0.5) if tid == "big" else torch.tensor([1.0, 2.0])
    assert torch.equal(decode_tensor(message["results"][0]["tensor"]["value"]), want)


@pytest.mark.parametrize("accept,answer", [(None, JSON), (MSGPACK, MSGPACK), (FRAMES, MSGPACK), ("text/html", JSON)])
def test_errors_follow_the_table_and_are_never_framed(http: httpx.Client, accept, answer):
    headers = {"Accept": accept} if accept else {}
    r = http.get("/v1/sessions/nope", headers=headers)
    assert r.status_code == 404 and r.headers["content-type"] == answer
    body = msgpack.unpackb(r.content) if answer == MSGPACK else r.json()
    assert body["error"]["code"] == "unknown_session"


def test_unsupported_content_type_is_400(http: httpx.Client, sid: str):
    r = http.post(f"/v1/sessions/{sid}/programs", content=b"{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and "text/plain" in r.json()["error"]["message"]


def test_delete_answers_204_without_a_body_or_content_type(http: httpx.Client):
    sid = http.post("/v1/sessions").json()["session_id"]
    r = http.delete(f"/v1/sessions/{sid}")
    assert r.status_code == 204 and r.content == b"" and "content-type" not in r.headers


# -- numbers ------------------------------------------------------------------------------------


def _run(http: httpx.Client, sid: str, steps: list, *, as_msgpack: bool = False) -> dict:
    message = {"id": os.urandom(6).hex(), "steps": steps}
    if as_msgpack:
        r = http.post(f"/v1/sessions/{sid}/programs", content=msgpack.packb(message),
                      headers={"Content-Type": MSGPACK, "Accept": JSON})
    else:
        r = http.post(f"/v1/sessions/{sid}/programs", content=json.dumps(message).encode(),
                      headers={"Content-Type": JSON})
    return {"status": r.status_code, **r.json()}


def _scaled_dtype(http: httpx.Client, sid: str, scalar_text: str) -> str:
    """The dtype of ``int_tensor * <scalar as written in JSON>``."""
    tid = "s" + os.urandom(4).hex()
    body = ('{"id": "%s", "steps": [{"kind": "put", "id": "%s", "value": {"dtype": "int64", "shape": [1], '
            '"data": [3]}}, {"kind": "call", "op": "mul", "args": [{"ref": "%s"}, %s], "out": ["%s.m"]}]}'
            % (os.urandom(6).hex(), tid, tid, scalar_text, tid))
    r = http.post(f"/v1/sessions/{sid}/programs", content=body.encode(), headers={"Content-Type": JSON})
    assert r.status_code == 200, r.text
    return r.json()["results"][1]["tensors"][0]["dtype"]


def test_json_int_and_float_scalars_follow_the_decimal_point(http: httpx.Client, sid: str):
    assert _scaled_dtype(http, sid, "2") == "int64"
    assert _scaled_dtype(http, sid, "2.0") == "float32"
    assert _scaled_dtype(http, sid, "2e0") == "float32"
    assert (torch.tensor([3]) * 2).dtype == torch.int64 and (torch.tensor([3]) * 2.0).dtype == torch.float32


def test_msgpack_int_and_float_scalars_follow_the_type_byte(http: httpx.Client, sid: str):
    put = {"kind": "put", "id": "i3", "value": {"dtype": "int64", "shape": [1], "data": struct.pack("<q", 3)}}
    out = _run(http, sid, [put, {"kind": "call", "op": "mul", "args": [{"ref": "i3"}, 2], "out": ["i3a"]},
                           {"kind": "call", "op": "mul", "args": [{"ref": "i3"}, 2.0], "out": ["i3b"]}],
               as_msgpack=True)
    assert [r["tensors"][0]["dtype"] for r in out["results"][1:]] == ["int64", "float32"]
    assert msgpack.packb(2)[0] == 0x02 and msgpack.packb(2.0)[0] == 0xCB  # what each call above carried


def test_json_minus_zero_keeps_its_sign_only_as_a_float(http: httpx.Client, sid: str):
    out = _run(http, sid, [
        {"kind": "put", "id": "z", "value": {"dtype": "float32", "shape": [2], "data": [-0.0, -0]}},
        {"kind": "fetch", "id": "z", "grad": False}])
    data = out["results"][1]["tensor"]["value"]
    signs = [math.copysign(1.0, v) for v in decode_tensor(data).tolist()]
    assert signs == [-1.0, 1.0]


def test_json_int64_beyond_2_53_is_exact_and_answered_as_base64(http: httpx.Client, sid: str):
    big = 2**53 + 1
    out = _run(http, sid, [
        {"kind": "put", "id": "b53", "value": {"dtype": "int64", "shape": [1], "data": [big]}},
        {"kind": "fetch", "id": "b53", "grad": False}])
    data = out["results"][1]["tensor"]["value"]
    assert isinstance(data["data"], str) and decode_tensor(data).tolist() == [big]


# -- tensor ids -------------------------------------------------------------------------------


@pytest.mark.parametrize("tid", ["a/b", "..", ".", ".hidden", "-x", "a b", "x%2F", "é", "a?b", "a#b", "x" * 129, ""])
def test_tensor_ids_outside_the_rule_are_400(http: httpx.Client, sid: str, tid: str):
    out = _run(http, sid, [{"kind": "put", "id": tid, "value": {"dtype": "float32", "shape": [1], "data": [1.0]}}])
    assert out["status"] == 400 and out["error"]["code"] == "bad_request"
    assert out["error"]["message"].startswith("steps.0.put.id: ")
    if 0 < len(tid) <= 128:
        assert "A-Z a-z 0-9 _ . -" in out["error"]["message"] and repr(tid) in out["error"]["message"]


@pytest.mark.parametrize("kind_step", [
    {"kind": "call", "op": "neg", "args": [{"ref": "small"}], "out": ["a/b"]},
    {"kind": "fetch", "id": "../small"},
    {"kind": "free", "ids": ["ok", "a/b"]},
    {"kind": "backward", "tensors": [".."]},
])
def test_every_field_naming_a_tensor_follows_the_rule(http: httpx.Client, sid: str, kind_step: dict):
    out = _run(http, sid, [kind_step])
    assert out["status"] == 400 and "a tensor id is" in out["error"]["message"], out


@pytest.mark.parametrize("tid", ["t1", "x", "W_1.grad", "idx.0", "_", "9", "a-b", "A.b-c_D.0"])
def test_ids_inside_the_rule_can_be_read_back_with_get(http: httpx.Client, sid: str, tid: str):
    out = _run(http, sid, [{"kind": "put", "id": tid, "value": {"dtype": "float32", "shape": [1], "data": [7.0]}}])
    assert out["status"] == 200, out
    r = http.get(f"/v1/sessions/{sid}/tensors/{tid}")
    assert r.status_code == 200 and r.json()["value"]["data"] == [7.0]


# -- where an error points ----------------------------------------------------------------------


def test_refused_before_any_step_no_id_step_null_path_from_the_program(http: httpx.Client, sid: str):
    out = _run(http, sid, [{"kind": "free", "ids": []},
                           {"kind": "put", "id": "q", "value": {"dtype": "float32", "shape": [-1], "data": []}}])
    assert out["status"] == 400 and "id" not in out and out["results"] == []
    assert out["error"]["step"] is None and out["error"]["op"] is None
    assert out["error"]["message"].startswith("steps.1.put.value.shape.0: ")


def test_tensor_over_the_element_limit_names_its_step_before_any_runs(http: httpx.Client, sid: str):
    out = _run(http, sid, [{"kind": "free", "ids": []},
                           {"kind": "put", "id": "q", "value": {"dtype": "float32", "shape": [10**12], "data": []}}])
    assert out["status"] == 413 and "id" not in out and out["results"] == []
    assert out["error"]["step"] == 1 and out["error"]["op"] == "put"
    assert out["error"]["message"].startswith("steps.1.put.value: ")


def test_step_failing_while_running_has_id_step_op_and_path_from_the_step(http: httpx.Client, sid: str):
    message = {"id": "edge-1", "steps": [{"kind": "free", "ids": []}, {"kind": "put", "id": "q", "value": {
        "dtype": "float32", "shape": [2], "data": [1.0, "2"]}}]}
    r = http.post(f"/v1/sessions/{sid}/programs", json=message)
    out = r.json()
    assert r.status_code == 400 and out["id"] == "edge-1" and out["results"] == [None]
    assert out["error"]["step"] == 1 and out["error"]["op"] == "put"
    assert out["error"]["message"].startswith("value.data.1: ")


def test_not_found_and_wrong_method(http: httpx.Client):
    r = http.get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = http.put("/v1/sessions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "bad_request"


# -- framed bodies ------------------------------------------------------------------------------


def test_framed_bodies_pad_the_last_frame_and_a_request_may_not(http: httpx.Client, sid: str):
    data = memoryview(struct.pack("<3f", 1.0, 2.0, 3.0))  # 12 bytes: the last frame gets 52 of padding
    padding = -len(data) % ALIGN
    for cut, extra in ((0, b""), (padding, b""), (0, b"\0" * ALIGN)):  # padded; unpadded; trailing bytes
        message = {"id": os.urandom(6).hex(), "steps": [
            {"kind": "put", "id": "fr", "value": {"dtype": "float32", "shape": [3], "data": {"frame": 0}}},
            {"kind": "fetch", "id": "fr", "grad": False}, {"kind": "free", "ids": ["fr"]}]}
        parts, total = pack_frames(message, [data])
        body = b"".join(bytes(p) for p in parts)
        assert total == len(body) and total % ALIGN == 0  # what the SDK and the server send
        sent = body[:len(body) - cut] + extra
        r = http.post(f"/v1/sessions/{sid}/programs", content=sent, headers={"Content-Type": FRAMES, "Accept": JSON})
        assert r.status_code == 200, r.text
        assert r.json()["results"][1]["tensor"]["value"]["data"] == [1.0, 2.0, 3.0]

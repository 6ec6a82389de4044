"""The details a client written from proto/SPEC.md alone depends on, each as SPEC states it,
checked against a real server: ids ``out_many`` makes can be fetched and freed (§3), list data
holds only values of its dtype and NaN/±inf in float lists (§7), how deep lists nest (§5),
media types without regard to case and ``*/*`` with q-values (§1), the Authorization scheme's
case (§10), a trailing slash (§1), repeated keys (§1), msgpack's uint 64 (§1), and program ids
counted in code points (§3). Where the server was wrong (ids, NaN, nesting, media types) the
test fails on the old server; where SPEC was wrong or silent the test pins what it now says."""

from __future__ import annotations

import json
import os
import struct

import httpx
import msgpack
import pytest

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import decode_tensor
from remote_autograd.proto.codec import FRAMES, unpack_frames

JSON, MSGPACK = "application/json", "application/msgpack"


def _post(http: httpx.Client, sid: str, body: bytes, ctype: str = JSON, accept: str = JSON) -> httpx.Response:
    return http.post(f"/v1/sessions/{sid}/programs", content=body, headers={"Content-Type": ctype, "Accept": accept})


def _program(http: httpx.Client, sid: str, steps: list, **kw) -> httpx.Response:
    return _post(http, sid, json.dumps({"id": os.urandom(6).hex(), "steps": steps}).encode(), **kw)


def _put(tid: str, data, dtype: str = "float32") -> dict:
    return {"kind": "put", "id": tid, "value": {"dtype": dtype, "shape": [len(data)], "data": data}}


# -- §3: ids --------------------------------------------------------------------------------


def test_out_many_ids_past_128_characters_can_be_fetched_and_freed(http: httpx.Client, sid: str):
    prefix = "p" * 128  # the longest new id: its outputs are 130 characters
    r = _program(http, sid, [_put("c", [True, False], "bool"),
                             {"kind": "call", "op": "where", "args": [{"ref": "c"}], "out": [prefix], "out_many": True},
                             {"kind": "fetch", "id": f"{prefix}.0"}, {"kind": "free", "ids": [f"{prefix}.0"]},
                             {"kind": "set_requires_grad", "id": "c", "requires_grad": False}])
    assert r.status_code == 200, r.text
    assert r.json()["results"][2]["tensor"]["value"]["data"] == [0]
    assert http.get(f"/v1/sessions/{sid}").json()["tensors"] == 1  # c; the index tensor is freed
    too_long = _program(http, sid, [{"kind": "fetch", "id": "p" * 150}])
    assert too_long.status_code == 400 and "149" in too_long.json()["error"]["message"]
    new_too_long = _program(http, sid, [_put("p" * 129, [1.0])])
    assert new_too_long.status_code == 400 and "128" in new_too_long.json()["error"]["message"]


@pytest.mark.parametrize("pid,status", [("😀" * 128, 200), ("😀" * 129, 400), ("é" * 128, 200)])
def test_program_ids_count_code_points(http: httpx.Client, sid: str, pid: str, status: int):
    r = _post(http, sid, json.dumps({"id": pid, "steps": []}).encode())  # ensure_ascii: \ud83d\ude00 pairs
    assert r.status_code == status, r.text
    if status == 200:
        assert r.json()["id"] == pid


def test_a_lone_surrogate_is_no_program_id(http: httpx.Client, sid: str):
    r = _post(http, sid, b'{"id": "\\ud800", "steps": []}', accept=MSGPACK)
    assert r.status_code == 400 and msgpack.unpackb(r.content)["error"]["code"] == "bad_request"


# -- §7: list data --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,value", [("int32", 1.5), ("uint8", -1), ("float16", 1e300), ("int8", 1000)])
def test_list_data_holds_only_values_of_its_dtype(http: httpx.Client, sid: str, dtype: str, value):
    r = _program(http, sid, [_put("v", [0, value], dtype)])
    assert r.status_code == 400
    assert r.json()["error"]["message"] == f"value.data.1: {value!r} is not a value of dtype {dtype}"


def test_nan_and_infinity_literals_in_float_list_data(http: httpx.Client, sid: str):
    body = (b'{"id": "nan-1", "steps": [{"kind": "put", "id": "n", "value": {"dtype": "float32", "shape": [3], '
            b'"data": [NaN, Infinity, -Infinity]}}, {"kind": "fetch", "id": "n"}]}')
    r = _post(http, sid, body)
    assert r.status_code == 200, r.text
    value = r.json()["results"][1]["tensor"]["value"]
    assert isinstance(value["data"], str)  # written as base64: JSON has no literal for them
    got = decode_tensor(value)
    assert got.isnan()[0] and got[1] == float("inf") and got[2] == float("-inf")
    packed = msgpack.packb({"id": "nan-2", "steps": [_put("m", [float("nan"), float("inf")], "float64")]})
    assert _post(http, sid, packed, ctype=MSGPACK).status_code == 200


# -- §5: nesting ------------------------------------------------------------------------------------


def _nested(depth: int):
    value = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth,status", [(8, 200), (9, 400)])
def test_lists_nest_eight_deep(http: httpx.Client, sid: str, depth: int, status: int):
    r = _program(http, sid, [_put("x", [1.0]),
                             {"kind": "call", "op": "getitem", "args": [{"ref": "x"}, _nested(depth)], "out": ["y"]}])
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["message"] == "argument nested deeper than 8 levels of lists"


# -- §1: media types, paths, repeated keys, uint 64 ---------------------------------------------------


@pytest.mark.parametrize("ctype,accept,answer", [
    ("Application/MsgPack", None, MSGPACK),
    ("APPLICATION/JSON", None, JSON),
    (JSON, "APPLICATION/MSGPACK", MSGPACK),
    (MSGPACK, "*/*;q=0.8", MSGPACK),
    (MSGPACK, "*/*, */*;q=0.1", MSGPACK),
    (MSGPACK, "application/json, */*", JSON),
    (MSGPACK, "text/html,application/xhtml+xml,*/*;q=0.8", JSON),
    (JSON, "application/msgpack;q=0", MSGPACK),  # q-values are not weighed
    (JSON, FRAMES.upper(), FRAMES),
])
def test_media_types_ignore_case_and_wildcards_say_nothing(http: httpx.Client, sid: str, ctype, accept, answer):
    steps = [_put("big", [0.5] * (1 << 15)), {"kind": "fetch", "id": "big", "grad": False}]
    message = {"id": os.urandom(6).hex(), "steps": steps}
    body = msgpack.packb(message) if "msgpack" in ctype.lower() else json.dumps(message).encode()
    headers = {"Content-Type": ctype, **({"Accept": accept} if accept else {})}
    r = http.post(f"/v1/sessions/{sid}/programs", content=body, headers=headers)
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"] == answer
    decoded = unpack_frames(r.content) if answer == FRAMES else (
        msgpack.unpackb(r.content) if answer == MSGPACK else r.json())
    assert decode_tensor(decoded["results"][1]["tensor"]["value"]).sum() == (1 << 14)


def test_a_trailing_slash_is_a_307_to_the_path_without_it(http: httpx.Client, sid: str):
    for method, path in (("POST", "/v1/sessions/"), ("POST", f"/v1/sessions/{sid}/programs/"),
                         ("GET", f"/v1/sessions/{sid}/")):
        r = http.request(method, path, content=b'{"id": "s", "steps": []}', headers={"Content-Type": JSON},
                         follow_redirects=False)
        assert r.status_code == 307 and r.content == b"", (path, r.status_code)
        assert httpx.URL(r.headers["location"]).path == path.rstrip("/")


def test_a_trailing_slash_still_needs_the_token():
    app = service_app(tokens=("sesame",))
    with httpx.Client(transport=client.InProcessTransport(app), base_url="http://in-process",
                      headers={"Remote-Autograd-Protocol": "1"}) as c:
        assert c.post("/v1/sessions/", follow_redirects=False).status_code == 401
        assert c.post("/v1/sessions/", headers={"Authorization": "Bearer sesame"},
                      follow_redirects=False).status_code == 307
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):  # §10: the scheme's case does not matter
            r = c.post("/v1/sessions", headers={"Authorization": f"{scheme} sesame"})
            assert r.status_code == 201, scheme
        assert c.post("/v1/sessions", headers={"Authorization": "Bearer   sesame  "}).status_code == 201


def test_a_repeated_key_keeps_its_last_value(http: httpx.Client, sid: str):
    r = _post(http, sid, b'{"id": "first", "steps": [], "id": "last"}')
    assert r.status_code == 200 and r.json()["id"] == "last"
    # the same map in msgpack: 83, then "id" twice
    body = b"\x83" + b"".join(msgpack.packb(x) for x in ("id", "first", "steps", [], "id", "last-mp"))
    r = _post(http, sid, body, ctype=MSGPACK)
    assert r.status_code == 200 and r.json()["id"] == "last-mp"


def test_msgpack_uint64_is_the_integer_it_is(http: httpx.Client, sid: str):
    import torch

    huge = 2**64 - 1
    assert msgpack.packb(huge)[0] == 0xCF
    put = {"kind": "put", "id": "i", "value": {"dtype": "int64", "shape": [1], "data": struct.pack("<q", 1)}}
    call = {"kind": "call", "op": "mul", "args": [{"ref": "i"}, huge], "out": ["j"]}
    r = _post(http, sid, msgpack.packb({"id": "u-1", "steps": [put, call, {"kind": "fetch", "id": "j"}]}),
              ctype=MSGPACK)
    assert r.status_code == 200, r.text
    assert r.json()["results"][2]["tensor"]["value"]["data"] == (torch.tensor([1]) * huge).tolist()  # as torch
    shape = {"kind": "put", "id": "s", "value": {"dtype": "float32", "shape": [huge], "data": b""}}
    assert _post(http, sid, msgpack.packb({"id": "u-2", "steps": [shape]}), ctype=MSGPACK).status_code == 413
    data = {"kind": "put", "id": "d", "value": {"dtype": "int64", "shape": [1], "data": [huge]}}
    r = _post(http, sid, msgpack.packb({"id": "u-3", "steps": [data]}), ctype=MSGPACK)
    assert r.status_code == 400 and "is not a value of dtype int64" in r.json()["error"]["message"]

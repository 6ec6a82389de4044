"""The rules a client written from proto/SPEC.md alone had to guess (issue 33, a JavaScript
client), as SPEC now states them, against the shared server: which list values each dtype takes
and what becomes of them (§7), how a view's bytes count (§2), two identical programs at once
(§9), and the framed content type on the routes other than programs (§1)."""

from __future__ import annotations

import json
import os
import threading

import httpx
import msgpack
import pytest
import torch

from remote_autograd.proto import decode_tensor
from remote_autograd.proto.codec import FRAMES

from ..servers import api, call, put, ref, wait_in_flight

MSGPACK = "application/msgpack"


def _run(http: httpx.Client, sid: str, steps: list, pid: str | None = None) -> httpx.Response:
    return http.post(f"/v1/sessions/{sid}/programs", json={"id": pid or os.urandom(6).hex(), "steps": steps})


# -- §7: list values, item by item --------------------------------------------------------------
# json.dumps writes 1 as `1` (an integer) and 1.0 as `1.0` (a float): the values go as written here.

ACCEPTED = [
    ("bool", [0, 1, True, False]),
    ("int32", [True, -5, 2**31 - 1]),
    ("int64", [2**53 + 1, False]),
    ("float32", [0.1, 16777217, 1e-50, -1e-50, 3.4028234663852886e38, True]),  # rounded, to 0.0, the maximum
    ("float16", [1e-8, 4e-8, 65504, 0.1, 70000 - 4496]),
    ("float64", [0.1, 2**70, 5e-324]),
]
REFUSED = [("bool", 1.0), ("bool", 0.0), ("bool", 2), ("int32", 1.0), ("uint8", 256), ("int8", -129),
           ("float32", 3.4028235e38), ("float16", 65510), ("float16", 70000)]


@pytest.mark.parametrize("dtype,values", ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_list_values_a_dtype_takes_arrive_rounded_as_torch_tensor_rounds_them(http: httpx.Client, sid: str,
                                                                              dtype: str, values: list):
    r = _run(http, sid, [put("v", values, dtype), {"kind": "fetch", "id": "v"}, {"kind": "free", "ids": ["v"]}])
    assert r.status_code == 200, r.text
    got = decode_tensor(r.json()["results"][1]["tensor"]["value"])
    want = torch.tensor(values, dtype=getattr(torch, dtype))
    assert got.dtype == want.dtype and torch.equal(got.view(-1).view(torch.uint8) if dtype == "bool" else got, want)
    if dtype == "float32":
        assert got[2] == 0.0 and got[1] == 16777216 and got[0].item() != 0.1  # silently rounded, as SPEC says
    if dtype == "float16":
        assert got[0] == 0.0 and got[1] > 0  # 1e-8 is below half float16's smallest subnormal, 4e-8 is not


@pytest.mark.parametrize("dtype,value", REFUSED)
def test_list_values_a_dtype_refuses(http: httpx.Client, sid: str, dtype: str, value):
    r = _run(http, sid, [put("v", [value], dtype)])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == f"value.data.0: {value!r} is not a value of dtype {dtype}"


# -- §2: bytes are storages -------------------------------------------------------------------------


def test_a_view_adds_no_bytes_and_keeps_its_freed_base_counted(http: httpx.Client, sid: str):
    held = lambda: http.get(f"/v1/sessions/{sid}").json()["bytes"]  # noqa: E731
    assert _run(http, sid, [put("x", [0.0] * 1000)]).status_code == 200
    assert held() == 4000
    view = call("getitem", ref("x"), [{"slice": [0, 10, None]}], out=["v"])
    assert _run(http, sid, [view]).status_code == 200
    assert held() == 4000  # the view adds nothing
    assert _run(http, sid, [{"kind": "free", "ids": ["x"]}]).status_code == 200
    assert held() == 4000  # the base's whole storage, while the view lives
    assert _run(http, sid, [call("clone", ref("v"), out=["w"])]).status_code == 200
    assert held() == 4040
    assert _run(http, sid, [{"kind": "free", "ids": ["v"]}]).status_code == 200
    assert held() == 40


# -- §9: two identical programs at once -----------------------------------------------------------------


def test_the_same_program_sent_twice_at_once_runs_once_and_both_get_its_answer(server_url: str, http: httpx.Client,
                                                                               sid: str):
    assert _run(http, sid, [put("x", [0.0])]).status_code == 200
    steps = [call("_test_sleep", 0.5, out=["slept"]), call("add_", ref("x"), 1.0), {"kind": "fetch", "id": "x"}]
    answers: dict = {}

    def send(key: str, body: dict) -> None:
        with api(server_url) as own:
            answers[key] = own.post(f"/v1/sessions/{sid}/programs", json=body)

    same = {"id": "twice", "steps": steps}
    first = threading.Thread(target=send, args=("first", same))
    first.start()
    with api(server_url) as c:
        wait_in_flight(c)  # the first runs: the others arrive while it does
    others = [threading.Thread(target=send, args=(key, body)) for key, body in
              (("second", same), ("other", {"id": "twice", "steps": steps[:2]}))]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join()
    assert answers["first"].status_code == answers["second"].status_code == 200
    assert answers["first"].json() == answers["second"].json()
    assert answers["other"].status_code == 409  # the same id with another body
    fetched = _run(http, sid, [{"kind": "fetch", "id": "x"}]).json()["results"][0]["tensor"]["value"]["data"]
    assert fetched == [1.0]  # added once


# -- §1: the framed content type off the program route --------------------------------------------------


def test_framed_content_type_elsewhere_only_picks_msgpack(http: httpx.Client, sid: str):
    created = http.post("/v1/sessions", content=b"not a framed body", headers={"Content-Type": FRAMES})
    assert created.status_code == 201 and created.headers["content-type"] == MSGPACK  # the body is not read
    http.delete(f"/v1/sessions/{msgpack.unpackb(created.content)['session_id']}")
    ops = http.get("/v1/ops", headers={"Content-Type": FRAMES})
    assert ops.status_code == 200 and ops.headers["content-type"] == MSGPACK
    assert _run(http, sid, [put("small", [1.0] * 4), put("big", [1.0] * 16384)]).status_code == 200
    for tid, answer in (("small", MSGPACK), ("big", FRAMES)):  # framed from 64 KiB of one tensor's data
        r = http.get(f"/v1/sessions/{sid}/tensors/{tid}", headers={"Accept": FRAMES})
        assert r.status_code == 200 and r.headers["content-type"] == answer, tid
    refused = http.post("/v1/sessions", content=json.dumps({"x": 1}), headers={"Content-Type": "text/plain"})
    assert refused.status_code == 201  # no body is read there: nothing to refuse
    http.delete(f"/v1/sessions/{refused.json()['session_id']}")

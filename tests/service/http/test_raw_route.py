"""The program route's speed path answers as a plain FastAPI route would.

``answer_program_request`` (``service/http/routes/programs.py``) is plain ASGI, called by the
Gatekeeper past the router (``service/http/raw_route.py``). The plain path it stands in for
is written here as an ordinary FastAPI route (``Request``, ``Depends``, ``Response``) on
the same app; both must give the same status, media type and bytes for the same program.
"""

from __future__ import annotations

import asyncio

import httpx
import msgpack
import pytest
import torch
from fastapi import Depends, Request, Response

from remote_autograd.proto import JSON, MSGPACK, PROTOCOL_HEADER, PROTOCOL_VERSION, encode_tensor
from remote_autograd.proto.codec import iter_parts
from remote_autograd.service.http.app import create_app
from remote_autograd.service.http.routes import deps
from remote_autograd.service.settings import Settings


def _with_plain_route():
    app = create_app(Settings.from_env({}))

    @app.post("/plain/sessions/{sid}/programs")
    async def plain_program(sid: str, request: Request, backend=Depends(deps.backend),
                            caller=Depends(deps.caller)) -> Response:
        async with backend.answer_program(sid, caller, await request.body(), request.headers.get("content-type"),
                                          request.headers.get("accept")) as answer:
            return Response(b"".join(bytes(p) for p in iter_parts(answer.parts)), status_code=answer.status,
                            media_type=answer.media_type)

    return app


def _program(as_json: bool, op: str) -> dict:
    x = torch.linspace(-2, 2, 12, dtype=torch.float64).reshape(3, 4)
    return {"id": "p1", "steps": [
        {"kind": "put", "id": "x", "value": encode_tensor(x, as_json=as_json), "requires_grad": True},
        {"kind": "call", "op": op, "args": [{"ref": "x"}], "kwargs": {}, "out": ["y"]},
        {"kind": "call", "op": "sum", "args": [{"ref": "y"}], "kwargs": {}, "out": ["s"]},
        {"kind": "backward", "tensors": ["s"]},
        {"kind": "fetch", "id": "x"},
        {"kind": "fetch", "id": "s"},
    ]}


@pytest.mark.parametrize("op", ["tanh", pytest.param("no_such_op", marks=pytest.mark.slow)])
@pytest.mark.parametrize("ctype", [pytest.param(JSON, marks=pytest.mark.slow), MSGPACK])  # an app each: seconds
def test_the_raw_program_route_answers_as_a_plain_fastapi_route(ctype, op):
    as_json = ctype == JSON
    program = _program(as_json, op)
    body = msgpack.packb(program, use_bin_type=True) if not as_json else httpx.Request(
        "POST", "http://x", json=program).content
    headers = {PROTOCOL_HEADER: PROTOCOL_VERSION, "content-type": ctype}

    async def both() -> list[httpx.Response]:
        app = _with_plain_route()
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
                answers = []
                for prefix in ("/v1", "/plain"):  # a session each: the retry cache keeps them apart
                    made = await client.post("/v1/sessions", headers={**headers, "accept": JSON})
                    sid = made.json()["session_id"]
                    answers.append(await client.post(f"{prefix}/sessions/{sid}/programs", content=body,
                                                     headers=headers))
                wrong = {**headers, PROTOCOL_HEADER: "0"}
                answers += [await client.post(f"{prefix}/sessions/{sid}/programs", content=body, headers=wrong)
                            for prefix in ("/v1", "/plain")]
                return answers

    fast, plain, fast_refused, plain_refused = asyncio.run(both())
    assert fast.status_code == plain.status_code and (fast.status_code == 200) == (op == "tanh")
    assert fast.headers["content-type"] == plain.headers["content-type"]
    assert fast.content == plain.content
    if op == "tanh":  # the answer is the program's, not an empty one that would match trivially
        results = (msgpack.unpackb(fast.content) if not as_json else fast.json())["results"]
        assert len(results) == 6 and all("tensor" in r for r in results[-2:])
    assert fast_refused.status_code == plain_refused.status_code == 400
    assert fast_refused.content == plain_refused.content

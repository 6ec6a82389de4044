"""The Gatekeeper calls a ``RawRoute`` itself, past the router, and answers its protocol errors."""

from __future__ import annotations

import asyncio

import msgpack

from remote_autograd.proto import MSGPACK, ErrorCode, ProtocolError
from remote_autograd.service.http.auth import Tokens
from remote_autograd.service.http.middleware import Gatekeeper
from remote_autograd.service.http.raw_route import RawRoute


class _Counts:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def request_counter(self, route: str, method: str, status: int):
        seen = self.seen

        class Counter:
            def inc(self) -> None:
                seen.append((route, method, status))

        return Counter()


async def _doc(iid: str) -> None:
    """Documents the raw route."""


def _call(gatekeeper: Gatekeeper, method: str, path: str) -> list[dict]:
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"",
             "headers": [(b"content-type", MSGPACK.encode())]}
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(gatekeeper(scope, receive, send))
    return sent


def _gatekeeper(raw, router) -> tuple[Gatekeeper, _Counts]:
    counts = _Counts()
    route = RawRoute("/items/{iid}", _doc, asgi=raw, methods=["POST"])
    return Gatekeeper(router, tokens=Tokens([]), metrics=counts, routes=[route]), counts


def test_a_raw_route_is_called_past_the_router():
    seen = []

    async def raw(scope, receive, send):
        seen.append(scope["path_params"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def router(scope, receive, send):
        seen.append("router")
        await send({"type": "http.response.start", "status": 405, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gatekeeper, counts = _gatekeeper(raw, router)
    assert _call(gatekeeper, "POST", "/items/7")[0]["status"] == 200
    assert _call(gatekeeper, "GET", "/items/7")[0]["status"] == 405  # a partial match is the router's
    assert seen == [{"iid": "7"}, "router"]
    assert counts.seen[0] == ("/items/{iid}", "POST", 200)  # counted under its route, as the router would


def test_a_raw_routes_protocol_error_gets_the_error_body():
    async def raw(scope, receive, send):
        raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "unknown session 'x'")

    async def router(scope, receive, send):
        raise AssertionError("the router is not called")

    gatekeeper, _ = _gatekeeper(raw, router)
    start, body = _call(gatekeeper, "POST", "/items/7")
    assert start["status"] == 404
    headers = dict(start["headers"])
    assert headers[b"content-type"] == MSGPACK.encode() and b"www-authenticate" not in headers
    assert b"x-request-id" in headers
    assert msgpack.unpackb(body["body"]) == {
        "error": {"code": "unknown_session", "message": "unknown session 'x'", "step": None, "op": None},
        "results": []}

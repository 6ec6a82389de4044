"""A router of ``service/http/routes/`` served alone, on a bare FastAPI app, with its dependencies
overridden: routes can be imported and tested without ``create_app``, its middleware or its
backend choice. The backend here is the real in-process one; only who provides it changes.
"""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI

from remote_autograd.proto import PROTOCOL_HEADER, PROTOCOL_VERSION
from remote_autograd.service.backends.local_sessions import LocalSessions
from remote_autograd.service.http.routes import deps, errors, sessions
from remote_autograd.service.settings import Settings

V1 = {PROTOCOL_HEADER: PROTOCOL_VERSION}


def _sessions_alone(backend: object, caller: dict) -> FastAPI:
    app = FastAPI()
    errors.install(app)
    app.include_router(sessions.router)
    app.dependency_overrides[deps.backend] = lambda: backend
    app.dependency_overrides[deps.caller] = lambda: caller["name"]
    return app


def _talk(app: FastAPI, conversation) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://alone") as client:
            await conversation(client)

    asyncio.run(run())


def test_the_sessions_router_serves_alone_with_its_dependencies_overridden():
    backend, caller = LocalSessions(Settings.from_env({})), {"name": "alice"}

    async def conversation(client: httpx.AsyncClient) -> None:
        made = await client.post("/v1/sessions", headers=V1)
        assert made.status_code == 201, made.text
        sid = made.json()["session_id"]
        assert backend.store.get(sid, "alice").id == sid  # the overridden caller owns it

        info = await client.get(f"/v1/sessions/{sid}", headers=V1)
        assert info.status_code == 200 and info.json()["tensors"] == 0

        caller["name"] = "bob"  # another caller: the backend's owner check answers, through the error handler
        refused = await client.get(f"/v1/sessions/{sid}", headers=V1)
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "unknown_session"

        caller["name"] = "alice"
        assert (await client.delete(f"/v1/sessions/{sid}", headers=V1)).status_code == 204
        assert len(backend.store) == 0

    try:
        _talk(_sessions_alone(backend, caller), conversation)
    finally:
        backend.shutdown()


def test_the_caller_dependency_checks_the_protocol_header():
    app = _sessions_alone(object(), {"name": "alice"})
    del app.dependency_overrides[deps.caller]  # the real one, which reads the header

    async def conversation(client: httpx.AsyncClient) -> None:
        answer = await client.post("/v1/sessions", headers={PROTOCOL_HEADER: "0"})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "protocol_mismatch"

    _talk(app, conversation)

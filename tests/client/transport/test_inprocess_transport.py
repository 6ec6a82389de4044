"""``connect(transport=...)``: the SDK over any httpx transport, and ``InProcessTransport``, which calls
the service's ASGI app in this process without sockets, gives the answers a socket server gives."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import threading
from typing import Iterator

import httpx
import pytest
import torch
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.client.transport._transport import Transport
from remote_autograd.proto.codec import FRAME_MIN_BYTES

from ...conftest import start_server


@pytest.fixture(scope="module")
def plain_server_url() -> Iterator[str]:
    """A socket server with the in-process app's settings: its defaults, its sessions in its own process."""
    with start_server(REMOTE_AUTOGRAD_TENANT_PROCESSES="off") as url:
        yield url


def _scenario(sess: client.Session) -> list:
    """Values, grads, a framed transfer both ways, an op error and the server's bookkeeping, as local data."""
    g = torch.Generator().manual_seed(0)
    w = sess.tensor(torch.randn(5, 3, generator=g, dtype=torch.float64), requires_grad=True)
    x = sess.tensor(torch.randn(7, 5, generator=g, dtype=torch.float64))
    loss = torch.tanh(x @ w).pow(2).mean()
    loss.backward()
    big = torch.randn(FRAME_MIN_BYTES // 4 + 1, generator=g)  # over the framing size, both ways
    remote_big = sess.tensor(big)
    sess.manual_seed(3)
    out: list = [loss.item(), w.grad.to_torch(), (remote_big * 2).to_torch(), sess.randn(4).to_torch()]
    try:
        (x @ x).to_torch()
    except client.RemoteError as exc:
        out.append((type(exc).__name__, exc.code, exc.status, str(exc)))
    stats = sess.stats()
    out.append({k: v for k, v in stats.items() if k != "session_id"})
    return out


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_in_process_and_socket_give_the_same_answers(plain_server_url: str):
    with client.connect(plain_server_url) as sess:
        over_socket = _scenario(sess)
    with client.connect(transport=client.InProcessTransport(service_app())) as sess:
        in_process = _scenario(sess)
    assert over_socket[4][0] == "RemoteError"  # the error did happen
    assert len(over_socket) == len(in_process) == 6
    for a, b in zip(over_socket, in_process):
        assert _same(a, b), (a, b)


def _without_test_ops(answer):
    """The op table is this process's: an app made earlier in the test run with the test-only ops
    (``Settings.test_ops``) registered them here for good. They are not what this test compares."""
    status, body, *rest = answer
    if isinstance(body, dict) and "ops" in body:
        body = {**body, "ops": [op for op in body["ops"] if not op["name"].startswith("_test_")]}
    return (status, body, *rest)


def test_raw_answers_match_including_errors(plain_server_url: str):
    """Status and decoded body, request by request: a listing, unknown sessions, a wrong method, health."""
    requests = [("GET", "/v1/ops", None), ("GET", "/v1/sessions/nope", None),
                ("POST", "/v1/sessions/nope/programs", {"id": "p", "steps": []}),
                ("DELETE", "/v1/ops", None), ("GET", "/healthz", None)]
    socket_side, in_process = Transport(plain_server_url), Transport(client.transport._inprocess.IN_PROCESS_URL,
                                                                      transport=client.InProcessTransport())
    try:
        statuses = []
        for method, path, body in requests:
            answer = socket_side.request(method, path, body)
            assert _without_test_ops(answer) == _without_test_ops(in_process.request(method, path, body)), path
            statuses.append(answer[0])
    finally:
        socket_side.close()
        in_process.close()
    assert statuses[0] == statuses[-1] == 200 and all(s >= 400 for s in statuses[1:-1])


@contextlib.contextmanager
def _lifespan_app(events: list, fail: bool = False) -> Iterator[Starlette]:
    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("startup")
        if fail:
            raise OSError("no GPU today")
        yield
        events.append("shutdown")

    async def boom(request):
        raise ValueError("a bug in a route")

    async def ok(request):
        return JSONResponse({"status": "ok", "started": events[:1] == ["startup"]})

    yield Starlette(routes=[Route("/healthz", ok), Route("/boom", boom)], lifespan=lifespan)


def _our_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "remote-autograd-in-process"]


def test_the_apps_lifespan_runs_and_ends_with_the_transport():
    events: list = []
    before = len(_our_threads())
    with _lifespan_app(events) as app:
        transport = client.InProcessTransport(app)
        assert events == ["startup"]
        with httpx.Client(transport=transport, base_url="http://in-process") as http:  # any httpx client fits
            assert http.get("/healthz").json() == {"status": "ok", "started": True}
            assert http.get("/boom").status_code == 500  # the app's error answer, as over a socket
        assert events == ["startup", "shutdown"]
    assert len(_our_threads()) == before  # its loop thread is gone
    with pytest.raises(httpx.ConnectError, match="closed"):
        transport.handle_request(httpx.Request("GET", "http://in-process/healthz"))


def test_a_transport_dropped_unclosed_ends_the_lifespan():
    events: list = []
    before = len(_our_threads())
    with _lifespan_app(events) as app:
        transport = client.InProcessTransport(app)
        del transport
        gc.collect()
    assert events == ["startup", "shutdown"]
    assert len(_our_threads()) == before


def test_a_failing_startup_raises_and_leaves_no_thread():
    before = len(_our_threads())
    with _lifespan_app([], fail=True) as app, pytest.raises(RuntimeError, match="no GPU today"):
        client.InProcessTransport(app)
    assert len(_our_threads()) == before


def test_an_ordinary_httpx_transport_fits():
    """``httpx.MockTransport`` hands back answers already read: the SDK's transport takes those too."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.headers["remote-autograd-protocol"]))
        return httpx.Response(200, json={"status": "ok"})

    transport = Transport("http://mock", transport=httpx.MockTransport(handler))
    assert transport.request("GET", "/healthz") == (200, {"status": "ok"})
    assert seen == [("GET", "/healthz", "1")]


_COMPILED_STEPS_WITH_COMPILE_ON = """
import warnings
import torch
from remote_autograd import client
from remote_autograd.service.engine.template_compile import COMPILER

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
x = torch.randn(16, 8)
step = lambda m, x: m(x).pow(2).mean()
want = step(model, x).item()
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    sess = client.connect(transport=client.InProcessTransport())
assert any("is not used by InProcessTransport" in str(w.message) for w in said), [str(w.message) for w in said]
model.to(sess.device)
compiled = torch.compile(step, backend="remote")
xr = x.to(sess.device)
got = [compiled(model, xr).item() for _ in range(30)]
assert set(got) == {want}, (got[:5], want)
# its repeated runs went as the template's graph (built on fake tensors in the server's thread, no tracer),
# and nothing compiled
assert set(COMPILER.figures()["variants"]) == {"graph"} and COMPILER.figures()["runs"] > 0, COMPILER.figures()
"""


def test_the_in_process_server_never_compiles_in_the_users_process():
    # inductor traces with torch.fx, which patches torch for the whole process: the user's model call and
    # compiled step, run meanwhile on the user's thread, raised (the tracer's errors) while a template compiled
    env = {**os.environ, "REMOTE_AUTOGRAD_COMPILE": "on"}
    done = subprocess.run([sys.executable, "-c", _COMPILED_STEPS_WITH_COMPILE_ON], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

"""``InProcessTransport``: the SDK talking to an ASGI app in this process, without sockets.

An ``httpx.BaseTransport`` (the shape ``connect(transport=...)`` takes), built on
``httpx.ASGITransport``, which only speaks async. A sync caller cannot await, so the
app runs on an event loop in a thread of its own, and each request is handed to that
loop and waited for. One loop for the transport's whole life, not one per request:
the app's lifespan (its session sweeper, its worker threads) starts on it and must
stay on it, as under uvicorn. The lifespan runs at construction and ends at ``close()``.

Everything above the socket is the real thing: the app's middleware, routes, limits
and error answers, and the SDK's encoding, framing and body reading.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import warnings
import weakref
from typing import Any, Awaitable, Callable

import httpx

from ._embedded import service_app

IN_PROCESS_URL = "http://in-process"  # what a session on a transport given without a URL calls its server


class InProcessTransport(httpx.BaseTransport):
    """Sends each request to ``app`` (an ASGI app; by default the service's, configured from
    ``REMOTE_AUTOGRAD_*`` as ``python -m remote_autograd.service`` would be). ``close()`` ends the
    app's lifespan; so does dropping the last reference, or the interpreter's exit."""

    def __init__(self, app: Callable[..., Awaitable[None]] | None = None) -> None:
        if app is None:
            app = service_app(compile=_compile_setting())
        # An exception in the app becomes the 500 answer it sent, as a client over a socket sees it.
        self._asgi = httpx.ASGITransport(app, raise_app_exceptions=False)
        self._loop = _LoopThread()
        lifespan = _Lifespan(app)
        # Not a method of self: a finalizer that held self would keep it alive forever.
        self._shut_down = weakref.finalize(self, _shut_down, self._loop, lifespan)
        try:
            self._loop.wait(lifespan.startup(), timeout=60)
        except BaseException:
            self._shut_down()
            raise

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not self._shut_down.alive:
            raise httpx.ConnectError("the in-process transport is closed", request=request)
        request.read()  # a sync body (an upload stream) as bytes, which the async side can stream too
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            return self._loop.wait(_send(self._asgi, request), timeout)
        except concurrent.futures.TimeoutError as exc:
            raise httpx.ReadTimeout(f"no answer from the in-process app in {timeout} s", request=request) from exc

    def close(self) -> None:
        self._shut_down()  # once: later calls do nothing


def _compile_setting() -> str:
    """Templates never compile in the user's own process. Inductor traces a template with torch.fx, which
    patches torch for the whole process while it traces (``nn.Module.__call__``, and a flag dynamo reads):
    the user's code, running meanwhile on its own thread, met the tracer (a model call raised "module is not
    installed as a submodule"; a compiled step "Detected that you are using FX to symbolically trace").
    ``connect()`` without a transport runs the server in a process of its own, where they compile."""
    asked = os.environ.get("REMOTE_AUTOGRAD_COMPILE", "off")
    if asked != "off":
        warnings.warn(f"REMOTE_AUTOGRAD_COMPILE={asked} is not used by InProcessTransport: compiling a template "
                      "here would trace with torch.fx while your code runs in the same process. connect() without "
                      "a transport starts a server process of its own, which compiles", RuntimeWarning, stacklevel=3)
    return "off"


async def _send(asgi: httpx.ASGITransport, request: httpx.Request) -> httpx.Response:
    response = await asgi.handle_async_request(request)
    body = await response.aread()
    # A sync stream, unread: the caller reads it as it reads a socket's answer.
    return httpx.Response(response.status_code, headers=response.headers, stream=httpx.ByteStream(body),
                          request=request)


def _shut_down(loop: "_LoopThread", lifespan: "_Lifespan") -> None:
    try:
        if not loop.is_current():  # (dropped from the loop's own thread: it cannot wait on itself)
            loop.wait(lifespan.shutdown(), timeout=30)
    finally:
        loop.stop()


class _LoopThread:
    """An event loop running in a daemon thread of its own; coroutines are handed to it and waited for."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote-autograd-in-process", daemon=True)
        self._thread.start()

    def wait(self, coroutine: Awaitable[Any], timeout: float | None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        if not self.is_current():
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()


class _Lifespan:
    """The ASGI lifespan protocol, driven as a server drives it: startup, then (at close) shutdown."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self._app = app
        self._task: asyncio.Task | None = None
        self._to_app: asyncio.Queue = asyncio.Queue()
        self._from_app: asyncio.Queue = asyncio.Queue()

    async def startup(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._task = asyncio.ensure_future(self._app(scope, self._to_app.get, self._from_app.put))
        await self._exchange("startup")

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            await self._exchange("shutdown")

    async def _exchange(self, phase: str) -> None:
        await self._to_app.put({"type": f"lifespan.{phase}"})
        answer = asyncio.ensure_future(self._from_app.get())
        await asyncio.wait({answer, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():  # the app returned or raised without answering: it has no lifespan
            answer.cancel()  # (uvicorn's lifespan="auto" reads it so too; an app whose startup
            self._task.exception()  # fails says lifespan.startup.failed, raised below)
            return
        message = answer.result()
        if message["type"] == f"lifespan.{phase}.failed":
            with contextlib.suppress(BaseException):  # it raises next (starlette does): its error is the message
                await self._task
            raise RuntimeError(f"the app's lifespan {phase} failed: {message.get('message', '')}")

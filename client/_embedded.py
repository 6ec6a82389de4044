"""The embedded default: ``connect()`` with no URL starts the service on loopback, once per process.

This is the only place the client touches the service package, and only when
called. The server runs in a daemon thread of this process and stops at exit.
"""

from __future__ import annotations

import atexit
import socket
import threading
import time

_lock = threading.Lock()
_url: str | None = None


def embedded_url() -> str:
    """The URL of this process's embedded server, starting it on first use."""
    global _url
    with _lock:
        if _url is None:
            _url = _start()
        return _url


def _start() -> str:
    import uvicorn

    from remote_autograd.service.app import create_app
    from remote_autograd.service.settings import Settings

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings.from_env(host="127.0.0.1", port=port)
    config = uvicorn.Config(create_app(settings), http="httptools", loop="asyncio", log_level="warning",
                            access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="remote-autograd-embedded",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the embedded remote-autograd server did not start")
        time.sleep(0.005)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=5)

    atexit.register(stop)
    return f"http://127.0.0.1:{port}"


def service_app(**settings):
    """The service's ASGI app, configured as ``python -m remote_autograd.service`` would be
    (``REMOTE_AUTOGRAD_*``), with ``settings`` (``Settings`` fields) on top."""
    from remote_autograd.service.app import create_app
    from remote_autograd.service.settings import Settings

    return create_app(Settings.from_env(**settings))

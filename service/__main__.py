"""``python -m remote_autograd.service [--host --port --device auto|cpu|cuda --log-level]``: start uvicorn with the fast settings.

Refuses (exit status 2) to listen beyond loopback without tokens unless
``REMOTE_AUTOGRAD_INSECURE=1``. Once it listens it prints one line on stdout, its URL and
its docs page's (``READY``); everything else is a JSON log line on stderr (``service.logs``:
uvicorn's own startup lines are info records, below the default level);
``--log-level info`` (or ``REMOTE_AUTOGRAD_LOG_LEVEL=info``) adds one line per request.

The process holds the tokens, so it makes itself unreadable by other processes of its user,
its tenants' workers included (``process_guards.forbid_reading``: no ``/proc/<pid>/environ``
or ``mem`` for them; a profiler that attaches needs root). On SIGTERM uvicorn stops
accepting connections and waits for open requests at most ``shutdown_grace_seconds``: then
it cuts them (a program still running stops at its next step; an answer a slow client is
still reading is dropped), and the sessions are saved (``state_volume``) whatever the
clients do.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import sys

import uvicorn

from . import process_guards
from .gc_freeze import freeze_startup_objects
from .settings import Settings


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote_autograd.service", description="remote-autograd server")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error", "critical"))
    args = parser.parse_args(argv)
    settings = Settings.from_env(host=args.host, port=args.port, device=args.device, log_level=args.log_level)
    if not settings.tokens and not settings.insecure and not _is_loopback(settings.host):
        print(
            f"refusing to listen on {settings.host} without REMOTE_AUTOGRAD_TOKENS; "
            "set tokens, or REMOTE_AUTOGRAD_INSECURE=1 to accept the risk",
            file=sys.stderr,
        )
        return 2
    process_guards.forbid_reading()  # before any token is read into a worker's reach: see the docstring

    from . import logs
    from .http.app import SINGLE_PROCESS_RISK, create_app
    from .http.http_protocol import guarded_http_protocol

    logs.configure(settings.log_level)
    if settings.backend == "inprocess" and not settings.per_tenant_processes():
        logging.getLogger("remote_autograd.service").warning(SINGLE_PROCESS_RISK)
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        http=guarded_http_protocol(settings),  # httptools, with header and idle limits (service/http/http_protocol.py)
        timeout_keep_alive=settings.idle_timeout_seconds,
        timeout_graceful_shutdown=settings.shutdown_grace_seconds,  # then the save, whatever the clients do
        loop="uvloop",
        log_config=None,  # uvicorn's records go to our JSON handler
        log_level=settings.log_level,
        access_log=False,  # the Gatekeeper writes the access log, with request ids
    )
    server = _AnnouncingServer(config)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is the way to stop it
        server.run()
    return 0 if server.started else 3  # uvicorn's own exit status when it could not start


READY = "remote-autograd is serving on {url} (API docs: {url}/docs); Ctrl-C stops it"


class _AnnouncingServer(uvicorn.Server):
    """uvicorn's ``Server``, printing ``READY`` once its socket listens (after the app's startup)."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            freeze_startup_objects()  # the app, its op table and torch are here for good
            port = self.servers[0].sockets[0].getsockname()[1]  # the real one, when asked for port 0
            host = self.config.host
            host = f"[{host}]" if ":" in host else host
            print(READY.format(url=f"http://{host}:{port}"), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m remote_autograd.service [--host --port --device auto|cpu|cuda --log-level]``: start uvicorn with the fast settings.

Refuses (exit status 2) to listen beyond loopback without tokens unless
``REMOTE_AUTOGRAD_INSECURE=1``. Once it listens it prints one line on stdout (``startup_line``:
its URL, its docs page's, how many tokens and where sessions are saved); everything else is a
JSON log line on stderr (``service.logs``: uvicorn's own startup lines are info records, below
the default level, while the saves and restores of sessions pass it); ``--log-level info`` (or
``REMOTE_AUTOGRAD_LOG_LEVEL=info``) adds one line per request.

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
import logging
import os
import sys

import uvicorn

from . import openmp_wait, process_guards
from .gc_freeze import freeze_startup_objects
from .settings import Settings

_EPILOG = """\
tokens:
  REMOTE_AUTOGRAD_TOKENS=tok1,tok2 gives each user a bearer token (clients send
  `Authorization: Bearer <token>`; the SDK's connect(token=...) or REMOTE_AUTOGRAD_TOKEN).
  Make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'.
  Without tokens the server listens on loopback only (REMOTE_AUTOGRAD_INSECURE=1 to
  listen elsewhere anyway).

environment:
  Every setting is a REMOTE_AUTOGRAD_<NAME> variable (limits, timeouts, worker
  processes, REMOTE_AUTOGRAD_STATE_DIR for sessions that survive a restart, ...);
  the flags above win over them. The repository's .env.example lists and explains
  each; its docs/limits.md gives the limits a client meets.
"""


def _parser() -> argparse.ArgumentParser:
    prog = "remote-autograd-serve" if sys.argv[0].endswith("remote-autograd-serve") else "python -m remote_autograd.service"
    parser = argparse.ArgumentParser(prog=prog, description="Serve remote-autograd: tensors, autograd and torch ops "
                                     "for clients over HTTP.", epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=None, help=f"address to listen on (default {Settings.host}; "
                        "REMOTE_AUTOGRAD_HOST); beyond loopback it needs tokens")
    parser.add_argument("--port", type=int, default=None, help=f"port (default {Settings.port}; "
                        "REMOTE_AUTOGRAD_PORT; 0: any free one)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                        help="where tensors live: auto (cuda when there is one), cpu or cuda "
                        f"(default {Settings.device}; REMOTE_AUTOGRAD_DEVICE)")
    parser.add_argument("--log-level", default=None, choices=("debug", "info", "warning", "error", "critical"),
                        help=f"JSON log lines on stderr from this level up (default {Settings.log_level}; "
                        "REMOTE_AUTOGRAD_LOG_LEVEL); info adds a line per request")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # before torch loads its OpenMP runtime, which reads the policy once: making the settings loads torch
    # (a step's cost defaults are the device's), so the host is read as from_env would read it
    openmp_wait.settle(args.host or os.environ.get("REMOTE_AUTOGRAD_HOST", Settings.host))
    settings = Settings.from_env(host=args.host, port=args.port, device=args.device, log_level=args.log_level)
    if not settings.tokens and not settings.insecure and not openmp_wait.is_loopback(settings.host):
        print(
            f"refusing to listen on {settings.host} without REMOTE_AUTOGRAD_TOKENS; "
            "set tokens, or REMOTE_AUTOGRAD_INSECURE=1 to accept the risk",
            file=sys.stderr,
        )
        return 2
    process_guards.forbid_reading()  # before any worker starts: none may read this process (the docstring)

    # cuBLAS's fixed workspaces, which torch requires for a client's deterministic algorithms on a GPU
    # (Program.torch_globals); tenant worker processes inherit it. Read by torch at each matmul.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
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
    server = _AnnouncingServer(config, settings)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is the way to stop it
        server.run()
    return 0 if server.started else 3  # uvicorn's own exit status when it could not start


def startup_line(settings: Settings, url: str) -> str:
    """The one line on stdout once the server listens: where, who may use it (how many tokens, never
    one of them) and whether sessions outlive a restart."""
    n = len(settings.tokens)
    if n:
        who = f"{n} token{'s' if n > 1 else ''} (REMOTE_AUTOGRAD_TOKENS)"
    elif openmp_wait.is_loopback(settings.host):
        who = "no tokens: this machine only"
    else:
        who = "no tokens: open to anyone who reaches it (REMOTE_AUTOGRAD_INSECURE=1)"
    state = (f"sessions saved to {settings.state_dir} on SIGTERM" if settings.state_dir
             else "sessions end with the process (no REMOTE_AUTOGRAD_STATE_DIR)")
    return f"remote-autograd is serving on {url} (API docs: {url}/docs); {who}; {state}; Ctrl-C stops it"


class _AnnouncingServer(uvicorn.Server):
    """uvicorn's ``Server``, printing ``startup_line`` once its socket listens (after the app's startup)."""

    def __init__(self, config: uvicorn.Config, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            freeze_startup_objects()  # the app, its op table and torch are here for good
            port = self.servers[0].sockets[0].getsockname()[1]  # the real one, when asked for port 0
            host = self.config.host
            host = f"[{host}]" if ":" in host else host
            print(startup_line(self.settings, f"http://{host}:{port}"), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

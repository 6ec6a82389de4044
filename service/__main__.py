"""``python -m service [--host --port --device auto|cpu|cuda]``: start uvicorn with the fast settings."""

from __future__ import annotations

import argparse
import ipaddress
import sys

from .settings import Settings


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description="remote-autograd server")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    settings = Settings.from_env(host=args.host, port=args.port, device=args.device)
    if not settings.tokens and not settings.insecure and not _is_loopback(settings.host):
        print(
            f"refusing to listen on {settings.host} without REMOTE_AUTOGRAD_TOKENS; "
            "set tokens, or REMOTE_AUTOGRAD_INSECURE=1 to accept the risk",
            file=sys.stderr,
        )
        return 2

    import uvicorn

    from .app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        http="httptools",
        loop="uvloop",
        log_level=args.log_level,
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

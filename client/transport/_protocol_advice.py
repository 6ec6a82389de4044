"""Errors on connect rewritten to say what to do: a protocol mismatch names both versions and the
side to upgrade; a server with nothing at ``/v1/sessions`` under the URL asks for its base URL."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from remote_autograd.proto import PROTOCOL_VERSION

from ._errors import RemoteError

if TYPE_CHECKING:
    from ._transport import Transport


def explain(transport: "Transport", error: RemoteError) -> RemoteError:
    """``error`` itself, unless it is a protocol mismatch: then one error naming both
    versions and the side to upgrade (the server's version comes from ``/healthz``,
    which answers any client)."""
    if error.status == 404 and error.code == "not_found":  # a remote-autograd server, a path it does not serve
        return RemoteError(f"{error.server_message}: the server at {transport.base_url} has no session route "
                           f"there. Give connect() (or REMOTE_AUTOGRAD_URL) the server's base URL, scheme, host and "
                           f"port (e.g. 'http://gpu-host:8000'); a proxy's path prefix, if any, and no more",
                           code=error.code, status=error.status)
    if error.code != "protocol_mismatch":
        return error
    ours = PROTOCOL_VERSION
    try:
        theirs = str(transport.call("GET", "/healthz")["protocol"])
    except (RemoteError, KeyError, TypeError):
        theirs = None
    where = f"the server at {transport.base_url}"
    if theirs is None:
        advice = f"{where} did not say which it speaks; upgrade the older side"
    elif _newer(theirs, ours):
        advice = (f"{where} speaks protocol {theirs}: upgrade this client "
                  f"(pip install -U remote-autograd)")
    else:
        advice = (f"{where} speaks protocol {theirs}: upgrade the server "
                  f"(a newer image or `pip install -U remote-autograd` there)")
    message = (f"protocol version mismatch: this client (remote-autograd {_client_version()}) speaks "
               f"protocol {ours}; {advice}. Server said: {error.server_message}")
    return RemoteError(message, code=error.code, status=error.status)


def _client_version() -> str:
    try:
        return version("remote-autograd")
    except PackageNotFoundError:
        return "unknown"


def _newer(a: str, b: str) -> bool:
    """Whether protocol version ``a`` is newer than ``b`` (numeric when both are numbers)."""
    try:
        return int(a) > int(b)
    except ValueError:
        return a > b

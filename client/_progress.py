"""What the user sees of the connection itself: progress of big transfers, a one-line
summary on connect in notebooks, and a clear error when client and server speak
different protocol versions.

Progress bars (tqdm, on stderr) appear for bodies over ``THRESHOLD`` bytes, and only
where a person watches: a terminal or a notebook. ``REMOTE_AUTOGRAD_PROGRESS=0``
turns bars and the summary off, ``=1`` forces bars on (logs, tests).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Iterator

import httpx

from ._errors import RemoteError

if TYPE_CHECKING:
    from ._session import Session
    from ._transport import Transport

THRESHOLD = 64 << 20  # bytes; smaller bodies take well under a second on any link worth using
_CHUNK = 1 << 20
_ENV = "REMOTE_AUTOGRAD_PROGRESS"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), never in a terminal IPython or a script."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _setting() -> str:
    return os.environ.get(_ENV, "").strip().lower()


def bars_enabled() -> bool:
    """Progress bars: forced by ``=1``, off with ``=0``, else only on a terminal or in a notebook."""
    setting = _setting()
    if setting in ("0", "false", "no", "off"):
        return False
    if setting in ("1", "true", "yes", "on"):
        return True
    return in_notebook() or (sys.stderr is not None and sys.stderr.isatty())


def _bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                file=sys.stderr, dynamic_ncols=True)


class _UploadStream(httpx.SyncByteStream):
    """A request body sent in 1 MiB pieces that advance a bar; iterable again for a retry."""

    def __init__(self, content: bytes, desc: str) -> None:
        self._content, self._desc = memoryview(content), desc

    def __iter__(self) -> Iterator[bytes]:
        with _bar(len(self._content), self._desc) as bar:
            for start in range(0, len(self._content), _CHUNK):
                piece = self._content[start:start + _CHUNK]
                yield bytes(piece)
                bar.update(len(piece))


def track_upload(request: httpx.Request, content: bytes) -> httpx.Request:
    """``request`` with a progress bar over its body when that is big and someone watches."""
    if len(content) > THRESHOLD and bars_enabled():
        request.stream = _UploadStream(content, f"upload {request.method} {request.url.path}")
    return request


def read_body(response: httpx.Response) -> bytes:
    """The whole answer body, with a progress bar when it is big and someone watches."""
    size = response.headers.get("content-length", "")
    if not (size.isdigit() and int(size) > THRESHOLD and bars_enabled()):
        return response.read()
    parts = []
    with _bar(int(size), "download") as bar:
        for piece in response.iter_raw():
            parts.append(piece)
            bar.update(len(piece))
    return b"".join(parts)


def summary(info: dict[str, Any], url: str) -> str:
    """One line naming the server, its device and GPU, from the session-creation answer."""
    device = info.get("device", "?")
    gpu, memory = info.get("gpu_name"), info.get("gpu_memory_bytes")
    if gpu:
        device += f", {gpu}" + (f" ({memory / 2**30:.0f} GiB)" if memory else "")
    return (f"remote-autograd: session {info.get('session_id')} on {url}: server "
            f"{info.get('server_version', '?')} (protocol {info.get('protocol', '?')}), {device}")


def announce(session: "Session", info: dict[str, Any]) -> None:
    """Print the summary when connecting from a notebook (scripts and tests stay quiet)."""
    if in_notebook() and _setting() not in ("0", "false", "no", "off"):
        print(summary(info, session._transport.base_url))


def _client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("remote-autograd")
    except PackageNotFoundError:
        return "unknown"


def explain(transport: "Transport", error: RemoteError) -> RemoteError:
    """``error`` itself, unless it is a protocol mismatch: then one error naming both
    versions and the side to upgrade (the server's version comes from ``/healthz``,
    which answers any client)."""
    if error.code != "protocol_mismatch":
        return error
    from . import _transport  # read at call time: the version this client actually sends

    ours = _transport.PROTOCOL_VERSION
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


def _newer(a: str, b: str) -> bool:
    """Whether protocol version ``a`` is newer than ``b`` (numeric when both are numbers)."""
    try:
        return int(a) > int(b)
    except ValueError:
        return a > b


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

from remote_autograd.proto.frames import FillBuffer

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


class UploadStream(httpx.SyncByteStream):
    """A request body sent from its parts in 1 MiB pieces (no joining copy); a bar when big and
    someone watches. Iterable again, so a retried request sends the same bytes."""

    def __init__(self, parts: list, total: int, desc: str) -> None:
        self._parts, self._total, self._desc = parts, total, f"upload {desc}"

    def __iter__(self) -> Iterator[bytes | memoryview]:
        from remote_autograd.proto.frames import iter_parts

        if self._total <= THRESHOLD or not bars_enabled():
            yield from iter_parts(self._parts, _CHUNK)
            return
        with _bar(self._total, self._desc) as bar:
            for piece in iter_parts(self._parts, _CHUNK):
                yield piece
                bar.update(len(piece))


def read_body(response: httpx.Response) -> memoryview | bytes:
    """The whole answer body: into one preallocated buffer when its length is known (no joining
    copy, and framed tensors can view it), with a progress bar when it is big and someone watches."""
    size = response.headers.get("content-length", "")
    total = int(size) if size.isdigit() else 0
    show = total > THRESHOLD and bars_enabled()
    if total < _CHUNK and not show:  # the raw bytes: our server never encodes an answer (gzip...)
        return b"".join(response.iter_raw())
    buf = FillBuffer(total)  # every byte is overwritten, or the answer refused below
    bar = _bar(total, "download") if show else None
    try:
        for piece in response.iter_raw():
            if buf.filled + len(piece) > total:
                raise httpx.RemoteProtocolError(f"answer longer than its Content-Length {total}")
            buf.append(piece)
            if bar is not None:
                bar.update(len(piece))
    finally:
        if bar is not None:
            bar.close()
    if buf.filled != total:
        raise httpx.RemoteProtocolError(f"answer of {buf.filled} bytes, but Content-Length said {total}")
    return buf.view


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


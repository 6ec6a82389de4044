"""Progress bars for big transfers, shown only where a person watches.

Bars (tqdm, on stderr) appear for bodies over ``THRESHOLD`` bytes, and only on a
terminal or in a notebook. ``REMOTE_AUTOGRAD_PROGRESS=0`` turns bars (and the connect
banner, ``_banner``) off, ``=1`` forces bars on (logs, tests).
"""

from __future__ import annotations

import os
import sys
from typing import Iterator

import httpx

from remote_autograd.proto.codec import iter_parts

THRESHOLD = 64 << 20  # bytes; smaller bodies take well under a second on any link worth using
CHUNK = 1 << 20  # bodies move in pieces of this size
_ENV = "REMOTE_AUTOGRAD_PROGRESS"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), never in a terminal IPython or a script."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _setting() -> str:
    return os.environ.get(_ENV, "").strip().lower()


def silenced() -> bool:
    """``REMOTE_AUTOGRAD_PROGRESS`` says off: no bars, no banner."""
    return _setting() in ("0", "false", "no", "off")


def bars_enabled() -> bool:
    """Progress bars: forced by ``=1``, off with ``=0``, else only on a terminal or in a notebook."""
    if silenced():
        return False
    if _setting() in ("1", "true", "yes", "on"):
        return True
    return in_notebook() or (sys.stderr is not None and sys.stderr.isatty())


def shows_bar(total: int) -> bool:
    """Whether a transfer of ``total`` bytes gets a bar here."""
    return total > THRESHOLD and bars_enabled()


def bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
                file=sys.stderr, dynamic_ncols=True)


class UploadStream(httpx.SyncByteStream):
    """A request body sent from its parts in 1 MiB pieces (no joining copy); a bar when big and
    someone watches. Iterable again, so a retried request sends the same bytes."""

    def __init__(self, parts: list, total: int, desc: str) -> None:
        self._parts, self._total, self._desc = parts, total, f"upload {desc}"

    def __iter__(self) -> Iterator[bytes | memoryview]:
        if not shows_bar(self._total):
            yield from iter_parts(self._parts, CHUNK)
            return
        with bar(self._total, self._desc) as progress:
            for piece in iter_parts(self._parts, CHUNK):
                yield piece
                progress.update(len(piece))

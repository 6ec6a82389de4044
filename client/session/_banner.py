"""The one-line summary printed on connect, in notebooks only (scripts and tests stay quiet)."""

from __future__ import annotations

from typing import Any

from ..transport import _progress


def summary(info: dict[str, Any], url: str) -> str:
    """One line naming the server, its device and GPU, from the session-creation answer."""
    device = info.get("device", "?")
    gpu, memory = info.get("gpu_name"), info.get("gpu_memory_bytes")
    if gpu:
        device += f", {gpu}" + (f" ({memory / 2**30:.0f} GiB)" if memory else "")
    return (f"remote-autograd: session {info.get('session_id')} on {url}: server "
            f"{info.get('server_version', '?')} (protocol {info.get('protocol', '?')}), {device}")


def announce(info: dict[str, Any], url: str) -> None:
    """Print the summary when connecting from a notebook, unless ``REMOTE_AUTOGRAD_PROGRESS=0``."""
    if _progress.in_notebook() and not _progress.silenced():
        print(summary(info, url))

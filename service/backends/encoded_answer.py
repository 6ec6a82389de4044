"""``EncodedAnswer``: a program's answer (``sessions.store.ProgramAnswer``) as a backend hands it to the route, encoded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncodedAnswer:
    """A program's answer, encoded: status, media type, body parts and where the time went."""

    status: int
    media_type: str
    parts: list
    total: int
    steps_seconds: float  # in the program's steps
    worker_seconds: float  # queued behind the session and running, as the backend saw it

"""The protocol tests' session: a fresh one on the shared server, deleted afterwards."""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest


@pytest.fixture
def sid(http: httpx.Client) -> Iterator[str]:
    sid = http.post("/v1/sessions").json()["session_id"]
    yield sid
    http.delete(f"/v1/sessions/{sid}")

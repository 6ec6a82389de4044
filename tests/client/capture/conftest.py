"""Fixtures of the torch.compile tests: dynamo's caches emptied around each test (a compiled function
of one test must not be found by the next, whose session is another), and a session whose requests
are kept (``_hot.Tap``) to count what a compiled step sends."""

from __future__ import annotations

from typing import Iterator

import pytest

from bench import _hot
from remote_autograd import client

from ...conftest import _Shared


@pytest.fixture(autouse=True)
def _reset(fresh_dynamo) -> None:
    """Every test here compiles (``tests/conftest.py``'s ``fresh_dynamo``)."""


@pytest.fixture
def tapped(in_process_app) -> Iterator[tuple[client.Session, _hot.Tap]]:
    """A session on the shared in-process app whose programs can be recorded (``_hot.recording``)."""
    tap = _hot.Tap(_Shared(in_process_app))
    with client.connect(transport=tap) as sess:
        yield sess, tap

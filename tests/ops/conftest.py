"""torch's own op database, imported once per test session (it takes seconds): for the surface tests."""

from __future__ import annotations

import warnings

import pytest


@pytest.fixture(scope="session")
def op_db():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return db

"""Every ``torch.nn`` module of torch's ``module_db`` on the remote device against local torch.

Each case is ``module_cases.run``: the module built from its first two samples, moved with
``module.to(device)`` (an in-process server), run in training mode; outputs, buffers after
forward, input and parameter gradients equal local torch's. Each module must fare as docs/ops.md
reports (``db_report``): an unlisted one passes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from torch.testing._internal.common_modules import module_db

from remote_autograd import client

from . import db_report, module_cases

pytestmark = pytest.mark.optable

REPORTED = db_report.parse((Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text(), "module_db")


@pytest.fixture(scope="module")
def remote():
    with client.connect(transport=client.InProcessTransport()) as sess:
        yield sess


@pytest.mark.parametrize("info", module_db, ids=lambda info: info.name)
def test_module_through_the_sdk(info, remote):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = module_cases.run(remote, info)
    status, why = REPORTED.get((info.name, ""), ("pass", ""))
    assert outcome.status == status, f"{outcome.status}: {outcome.detail} (docs/ops.md says {status}: {why})"
    if status == "refused":
        assert outcome.detail == why

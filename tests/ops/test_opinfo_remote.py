"""Every OpInfo of torch's ``op_db`` through the SDK against local torch, on torch's own samples.

Each case is ``opinfo_cases.run``: the OpInfo's first two samples on the remote device (an
in-process server: no socket per case), values and gradients compared with local torch; and, for
every third OpInfo with float64 autograd, a ``gradcheck`` of the op computed on the server.
Each OpInfo must fare as docs/ops.md reports (``db_report``): an unlisted one passes; a listed
refusal or failure stays what the report says until it is fixed and the report refreshed.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from remote_autograd import client

from . import opinfo_cases, db_report

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

pytestmark = pytest.mark.optable

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ops.md"
REPORTED = db_report.parse(DOCS.read_text())
GRADCHECKED = db_report.gradcheck_keys(op_db)


@pytest.fixture(scope="module")
def remote():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with client.connect(transport=client.InProcessTransport()) as sess:
            yield sess


def _held_to_report(outcome, expected) -> None:
    status, why = expected
    assert outcome.status == status, f"{outcome.status}: {outcome.detail} (docs/ops.md says {status}: {why})"
    if status == "refused":
        assert outcome.detail == why


@pytest.mark.parametrize("opinfo", op_db, ids=db_report.key)
def test_opinfo_through_the_sdk(opinfo, remote):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = opinfo_cases.run(remote, opinfo)
    _held_to_report(outcome, REPORTED.get((db_report.key(opinfo), ""), ("pass", "")))


@pytest.mark.parametrize("opinfo", [o for o in op_db if db_report.key(o) in GRADCHECKED], ids=db_report.key)
def test_gradcheck_of_the_op_on_the_server(opinfo, remote):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = opinfo_cases.gradcheck(remote, opinfo)
    _held_to_report(outcome, REPORTED.get((db_report.key(opinfo), "gradcheck"), ("pass", "")))


def test_layer_norm_bias_gradient_is_torchs_bit_for_bit(remote):
    """The hand-written entry summed the bias gradient itself and differed from torch by a few ulp."""
    from ..bits import assert_same_bits

    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=gen) for s in ((64, 33), (33,), (33,)))
    g = torch.randn(64, 33, generator=gen)
    local = [t.clone().requires_grad_() for t in (x, w, b)]
    torch.nn.functional.layer_norm(local[0], (33,), local[1], local[2]).backward(g)
    moved = [t.to(remote.device).requires_grad_() for t in (x, w, b)]
    torch.nn.functional.layer_norm(moved[0], (33,), moved[1], moved[2]).backward(g.to(remote.device))
    for got, want in zip(moved, local):
        assert_same_bits(got.grad.to_torch(), want.grad)

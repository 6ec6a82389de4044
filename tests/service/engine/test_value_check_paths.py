"""A value check (``service/ops/value_checks.py``) runs on every path a call takes, replays too.

A training loop sends the same program every step with new values in tensors of the same layouts:
the session's plan then vouches for the layouts (``program_plan.check_planned``), and with graphs on
a program is captured once and replayed (``graph_steps``). Values change between runs even when
layouts do not, so neither may skip a value check. Each run below puts new offsets and calls
``embedding_bag`` with ``include_last_offset=True``; the last run's last offset falls short of the
input, which the check refuses and torch's forward itself runs without complaint (so a skipped check
shows as a 200, not as a dead test process).
"""

from __future__ import annotations

import torch

from remote_autograd.proto import encode_tensor
from remote_autograd.service.settings import Settings

from .test_graph_steps import Replays
from .test_program_plan import Counted, run_bodies


def _put(tid: str, t: torch.Tensor) -> dict:
    return {"kind": "put", "id": tid, "value": encode_tensor(t)}


def _bags(i: int, offsets: list[int]) -> dict:
    return {"id": f"bags-{i}", "steps": [
        _put(f"x{i}", torch.tensor([1, 2, 3])), _put(f"o{i}", torch.tensor(offsets)),
        {"kind": "call", "op": "nn.functional.embedding_bag", "args": [{"ref": f"x{i}"}, {"ref": "w"}, {"ref": f"o{i}"}],
         "kwargs": {"include_last_offset": True}, "out": [f"y{i}"]},
        {"kind": "call", "op": "sum", "args": [{"ref": f"y{i}"}], "out": [f"s{i}"]},
        {"kind": "free", "ids": [f"x{i}", f"o{i}", f"y{i}"]},
    ]}


def test_a_replayed_program_checks_its_new_values(monkeypatch):
    counted, replays = Counted(monkeypatch), Replays(monkeypatch)
    setup = {"id": "setup", "steps": [_put("w", torch.randn(10, 3))]}
    bodies = [setup, *(_bags(i, [0, 2, 3]) for i in range(4)), _bags(4, [0, 1, 2])]
    answers, _ = run_bodies(bodies, Settings.from_env({}, replay="on", cuda_graphs="emulate", device="cpu"))
    assert [status for status, _ in answers] == [200] * 5 + [422]
    assert b"include_last_offset=True" in answers[-1][1]
    # runs 2 and 3 planned whole (run 0 a first sighting, run 1 records), and the last one's
    # embedding_bag: refused inside check_planned
    assert counted.planned == 2 * 2 + 1, "the plan's path was not taken"
    assert replays.captures == replays.replays == 0  # an op that reads values is never captured

"""A step's cost is known before its kernel runs (``service/engine/step_cost.py``), on every path.

The count (``cost_formulas``) is checked against torch's own FLOP counter and against the work
each family does; the runner's refusals are checked on the real runner, in this process, where a
dispatch mode can see whether a kernel ran: the plain path, a repeated program's plan (its calls
not checked again: the cost comes from the plan) and a CUDA graph's replay (emulated: the cost
its capture counted). The conv2d of issue 31 against a server in another process is in
``test_meta_check.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from remote_autograd.proto import encode_tensor
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine import graph_steps, meta_check
from remote_autograd.service.engine.cost_formulas import ELEMENT_FLOPS, SPECTRAL_FLOPS
from remote_autograd.service.engine.program_watch import ProgramWatch
from remote_autograd.service.engine.runner import run_steps
from remote_autograd.service.ops import OP_TABLE
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.service.settings import Settings

from .test_graph_steps import Replays
from .test_program_plan import Counted


def _cost(name: str, *args, **kwargs) -> float:
    meta_check.forget()
    return meta_check.check_call(OP_TABLE.get(name), list(args), kwargs, inplace=False, grad_enabled=False).flops


def _one(*shape, dtype=torch.float32) -> torch.Tensor:
    """A one-element tensor ``expand``ed to ``shape``: 4 bytes held, every element shown."""
    return torch.ones(1, dtype=dtype).expand(*shape)


def test_the_conv2d_of_issue_31_counts_at_least_torchs_flops_and_far_more_than_a_cpus_budget():
    """It ran 497 s as one step, charged 4 MiB. A one-channel convolution runs at 1/20 of the matmul
    rate (its patches read for one output channel), and is counted so."""
    x, w = _one(1, 1, 2048, 2048), _one(1, 1, 1024, 1024)
    with FlopCounterMode(display=False) as torchs:
        torch.nn.functional.conv2d(x.to("meta"), w.to("meta"))
    assert torchs.get_total_flops() > 2e12
    cost = _cost("nn.functional.conv2d", x, w)
    assert cost == torchs.get_total_flops() * ELEMENT_FLOPS / 2
    assert cost > Settings(device="cpu").max_step_flops * 100
    many = torch.ones(1, 64, 32, 32), torch.ones(64, 64, 3, 3)  # 64 output channels: at the matmul rate
    with FlopCounterMode(display=False) as torchs:
        torch.nn.functional.conv2d(*(t.to("meta") for t in many))
    assert _cost("nn.functional.conv2d", *many) == torchs.get_total_flops()


def test_each_family_is_counted_by_its_work_and_a_view_by_nothing():
    n = 64
    assert _cost("expand", torch.ones(1), [1 << 20, 1 << 20]) == 0  # a view: 2^40 elements shown, none touched
    assert _cost("add", torch.ones(1000), torch.ones(1000)) == ELEMENT_FLOPS * 3000
    assert _cost("sum", _one(1 << 20)) == ELEMENT_FLOPS * ((1 << 20) + 1)  # every element an expansion shows
    assert _cost("mm", torch.ones(n, n), torch.ones(n, n)) == 2 * n ** 3  # torch's formula
    assert _cost("mv", torch.ones(n, n), torch.ones(n)) == ELEMENT_FLOPS * (n * n + 2 * n)  # what it reads
    assert _cost("sort", torch.ones(1024)) == pytest.approx(ELEMENT_FLOPS * 1024 * 10, rel=0.01)
    assert _cost("sort", torch.ones(256, 4), 0) < _cost("sort", torch.ones(1024))  # along its dimension only
    assert _cost("linalg.svd", torch.ones(n, n)) >= SPECTRAL_FLOPS * n ** 3
    assert _cost("linalg.qr", torch.ones(1 << 12, 4)) < 1e7  # tall and thin: m n^2, not m^2 n
    pooled = _cost("nn.functional.max_pool2d", torch.ones(1, 1, 64, 64), 8, 1)
    assert pooled == ELEMENT_FLOPS * 57 * 57 * 64  # each window's 64 elements, per output
    # the 4.4 GiB kthvalue of issue 31 (an expanded 2^28-element float64 tensor): n log n, over the CPU's budget
    assert _cost("kthvalue", _one(1 << 28, dtype=torch.float64), 5) > Settings(device="cpu").max_step_flops


# -- the runner: refused before the kernel, on every path --------------------------------------


class Kernels(TorchDispatchMode):
    """The aten ops that ran on a real device (not on meta) while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(isinstance(a, torch.Tensor) and a.device.type != "meta" for a in args):
            self.ran.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _store(**settings):
    settings = Settings.from_env({}, **settings)
    return SessionStore(settings).create(), settings


def _program(pid: str, steps: list) -> object:
    return validate_program({"id": pid, "steps": steps, "omit_known_meta": True})


def _mm_program(pid: str, n: int = 64) -> object:
    """A put, a matmul (2 n^3 FLOPs), a sum: a program a plan and a graph can take over."""
    return _program(pid, [{"kind": "put", "id": f"a{pid}", "value": encode_tensor(torch.ones(n, n))},
                          {"kind": "call", "op": "mm", "args": [{"ref": f"a{pid}"}, {"ref": f"a{pid}"}],
                           "out": [f"b{pid}"]},
                          {"kind": "call", "op": "sum", "args": [{"ref": f"b{pid}"}], "out": [f"c{pid}"]},
                          {"kind": "free", "ids": [f"a{pid}", f"b{pid}", f"c{pid}"]}])


def _refused(outcome, code: str, *words: str) -> dict:
    assert outcome.status == 413, outcome.body
    error = outcome.body["error"]
    assert error["code"] == code and error["step"] == 1 and error["op"] == "mm", error
    for word in words:
        assert word in error["message"], error["message"]
    return error


def test_a_call_over_max_step_flops_is_refused_before_its_kernel_and_the_steps_before_stay_done():
    session, settings = _store(max_step_flops=10 ** 5)
    with Kernels() as kernels:
        outcome = run_steps(session, _mm_program("p"), settings)
    _refused(outcome, "too_large", "mm: about 5.24e+05 FLOPs", "max_step_flops=100000")
    assert "mm" not in kernels.ran
    assert set(session.tensors) == {"ap"}  # the put before it stays done; nothing of the call


def test_a_call_worth_more_than_the_programs_time_left_does_not_start():
    session, settings = _store(device_flops_per_second=1e5)  # 5.24e5 FLOPs: about 5 s at this rate
    with Kernels() as kernels:
        outcome = run_steps(session, _mm_program("p"), settings, watch=ProgramWatch(3.0))
    _refused(outcome, "time_limit", "device_flops_per_second=100000", "max_program_seconds=3.0", "did not start")
    assert "mm" not in kernels.ran
    assert run_steps(session, _mm_program("q"), settings, watch=ProgramWatch(10.0)).status == 200


def test_a_replayed_plan_keeps_the_cost_its_calls_were_checked_with(monkeypatch):
    session, settings = _store()
    for pid in ("p0", "p1", "p2"):  # a first sighting, then its plan recorded, then served
        assert run_steps(session, _mm_program(pid), settings).status == 200
    counted = Counted(monkeypatch)
    with Kernels() as kernels:
        outcome = run_steps(session, _mm_program("p3"), Settings.from_env({}, max_step_flops=10 ** 5))
    assert counted.planned == 1  # the matmul's check came from the plan, not from meta
    _refused(outcome, "too_large", "max_step_flops=100000")
    assert "mm" not in kernels.ran


def test_a_graph_replay_whose_calls_cost_more_than_the_time_left_runs_the_plain_path(monkeypatch):
    session, settings = _store(cuda_graphs="emulate")
    replays = Replays(monkeypatch)
    for k in range(graph_steps.WARMUP_RUNS + 2):  # warm-ups, a capture, a replay
        assert run_steps(session, _mm_program(f"p{k}"), settings, watch=ProgramWatch(10.0)).status == 200
    assert replays.replays == 1
    slow = Settings.from_env({}, cuda_graphs="emulate", device_flops_per_second=1e5)
    with Kernels() as kernels:
        outcome = run_steps(session, _mm_program("late"), slow, watch=ProgramWatch(3.0))
    assert replays.replays == 1  # not replayed: the plain path refused the call at its step
    _refused(outcome, "time_limit", "max_program_seconds=3.0")
    assert "mm" not in kernels.ran


def test_the_default_budgets_are_the_devices_and_a_setting_overrides_them():
    cpu, cuda = Settings(device="cpu"), Settings(device="cuda")
    assert (cpu.max_step_flops, cpu.device_flops_per_second) == (10 ** 11, 3e10)
    assert (cuda.max_step_flops, cuda.device_flops_per_second) == (10 ** 14, 2e13)
    assert Settings.from_env({"REMOTE_AUTOGRAD_MAX_STEP_FLOPS": "12345"}).limits()["max_step_flops"] == 12345
    assert math.isclose(cpu.max_step_flops / cpu.device_flops_per_second, 3.3, rel_tol=0.1)  # about 3 s

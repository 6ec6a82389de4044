"""``openmp_wait``: a server on loopback (its clients on its machine) waits passively between
OpenMP regions instead of spinning on the cores its clients need; one that listens beyond loopback,
or whose operator chose, is left as torch starts it. Read back from libgomp itself
(``OMP_DISPLAY_ENV=VERBOSE`` prints its settings when torch loads it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from remote_autograd.service import openmp_wait

from ..servers import ROOT, running


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_a_loopback_server_waits_passively(host):
    env: dict[str, str] = {}
    assert openmp_wait.settle(host, env) == "PASSIVE"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "gpu-host.example"])
def test_a_server_beyond_loopback_is_left_as_torch_starts_it(host):
    env: dict[str, str] = {}
    assert openmp_wait.settle(host, env) is None
    assert env == {}


@pytest.mark.parametrize("knob", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}])
def test_the_operators_choice_stands(knob):
    env = dict(knob)
    assert openmp_wait.settle("127.0.0.1", env) is None
    assert env == knob


def test_the_entry_point_settles_before_torch_loads():
    """The runtime reads the policy once, on ``import torch``: the entry must not import torch first."""
    code = "import sys, remote_autograd.service.__main__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _spin_count(log: str) -> str:
    lines = [line for line in log.splitlines() if "GOMP_SPINCOUNT" in line]
    assert lines, f"libgomp printed no settings:\n{log[-2000:]}"
    return lines[0].split("=")[1].strip().strip("'")


def test_a_loopback_server_process_runs_passive():
    with running(OMP_DISPLAY_ENV="VERBOSE") as server:
        assert _spin_count(server.logged()) == "0"  # libgomp's default: 300000

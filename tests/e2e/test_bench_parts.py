"""The benchmark's parts, without its measurements: ``bench._hot`` (recorded programs replay in process,
a replay that fails says so, never a silent time, and the client alone sends nothing but its first
round trip), the client's cost per queued step, the ``wan`` section's delayed link (made and removed,
and its one line where none can be made), and the ``gpu`` section's skip and replay reading.

The tap wraps an in-process transport; the link's test makes network namespaces (as root, else skipped).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

import bench
from bench import _hot, gpu, same_machine, step_parts, wan, wan_link
from remote_autograd import client

from ..bits import torch_copies


@pytest.fixture
def tapped() -> Iterator[tuple[client.Session, _hot.Tap]]:
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess:
        yield sess, tap


def test_recorded_programs_replay_in_process(tapped):
    sess, tap = tapped
    with _hot.recording(tap) as programs:
        w = sess.tensor(torch.randn(3, 2), requires_grad=True)
        x = sess.tensor(torch.randn(4, 3))
        (x @ w).relu().sum().backward()
        w.grad.to_torch()
        _hot.empty_program(sess)()
    assert len(programs()) == 2 and programs()[-1]["steps"] == []
    assert [s["kind"] for s in programs()[0]["steps"]][:2] == ["put", "put"]
    times = _hot.server_alone(programs(), last=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_a_replay_that_fails_raises(tapped):
    sess, tap = tapped
    with _hot.recording(tap) as programs:
        x = sess.tensor(torch.randn(4, 3))
        with pytest.raises(Exception, match="same reduction dim"):  # torch's meta check, before any kernel
            (x @ sess.tensor(torch.randn(4, 3))).to_torch()
    with pytest.raises(RuntimeError, match="replaying program.*same reduction dim"):
        _hot.server_alone(programs(), last=1)


def test_client_alone_answers_from_memory(tapped):
    sess, tap = tapped
    x, y = sess.tensor(torch.randn(16)), sess.tensor(torch.randn(16))
    sess.sync()
    forwarded, sent = tap.forwarded, sess.requests
    times = _hot.client_alone(tap, sess, lambda: (x + y).sum().item(), repeat=5)
    assert len(times) == 5
    assert tap.forwarded == forwarded + 2  # only the round trips whose answers are then repeated (empty, fn)
    assert sess.requests >= sent + 2 + 2 * 5  # the others went through the SDK's transport, answered by the tap
    assert (x * 2).to_torch().allclose(x.to_torch() * 2)  # the server answers again


# -- the client's cost per queued step (the model and gpu sections' figure) -----------------------

def test_client_cost_is_per_step_queued(tapped):
    sess, tap = tapped
    x, y = sess.tensor(torch.randn(16)), sess.tensor(torch.randn(16))
    sess.sync()
    step = lambda: (x + y).sum().item()  # noqa: E731
    with _hot.recording(tap) as programs:
        step()
    sent = [s["kind"] for s in programs()[0]["steps"]]
    assert len(programs()) == 1 and sent[:2] == ["call", "call"]
    parts = step_parts.step_parts(sess, tap, step, repeat=3)
    assert parts.queued == len(sent)  # every step the program carries, its fetch and frees too
    assert len(parts.client_per_queued) == 3 and all(t > 0 for t in parts.client_per_queued)
    assert 0 < parts.request < parts.total and 0 < parts.worker < parts.request


# -- the wan section: its link, and its one line where none can be made ---------------------------

def test_wan_says_in_one_line_why_it_skips(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `ip` to be found
    before = signal.getsignal(signal.SIGTERM)
    wan.run(repeat=2)  # the same machine first (its figures are not the subject here), then no link
    skipped = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    reason = "not root" if os.geteuid() != 0 else "no `ip` command (apt-get install -y iproute2)"
    assert len(skipped) == 1 and skipped[0].endswith(reason), skipped
    assert signal.getsignal(signal.SIGTERM) is before  # its handler for the run is gone again


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout


ECHO_SERVER = ("import socket, sys; s = socket.create_server((sys.argv[1], 9999)); s.settimeout(20); "
               "c, _ = s.accept(); c.settimeout(20); c.sendall(c.recv(4)[::-1])")
ECHO_CLIENT = ("import socket, sys, time\nfor _ in range(100):\n    try:\n"
               "        c = socket.create_connection((sys.argv[1], 9999), timeout=20); break\n"
               "    except ConnectionRefusedError:\n        time.sleep(0.1)\n"
               "c.sendall(b'ping'); print(c.recv(4).decode())")


@pytest.mark.skipif(wan_link.missing_prerequisite() is not None, reason=str(wan_link.missing_prerequisite()))
def test_delayed_link_carries_traffic_and_leaves_nothing_behind():
    with contextlib.ExitStack() as made:
        try:
            link = made.enter_context(wan_link.delayed_link(1))
        except wan_link.LinkUnavailable as exc:
            pytest.skip(str(exc))
        assert {link.server_ns, link.client_ns} <= set(_namespaces().split())
        server = subprocess.Popen(link.inside("server", [sys.executable, "-c", ECHO_SERVER, link.server_host]))
        answer = subprocess.run(link.inside("client", [sys.executable, "-c", ECHO_CLIENT, link.server_host]),
                                capture_output=True, text=True, timeout=60)
        assert server.wait(timeout=30) == 0 and answer.stdout.strip() == "gnip", answer.stderr
    assert not {link.server_ns, link.client_ns} & set(_namespaces().split())


@pytest.mark.skipif(wan_link.missing_prerequisite() is not None, reason=str(wan_link.missing_prerequisite()))
def test_a_killed_run_s_namespace_is_removed_by_the_next():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process id no longer alive, as a killed bench's
    name = f"{wan_link.PREFIX}{gone.pid}-s"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=20)
    try:
        wan_link.remove_stale()
        assert name not in _namespaces().split()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)


# -- the gpu section and its script ---------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the section runs")
def test_gpu_section_says_why_it_skips(capsys):
    gpu.run()
    assert capsys.readouterr().out.splitlines()[-1] == "  skipped: torch.cuda.is_available() is False (no CUDA device here)"


def test_replay_is_read_from_what_the_server_says(server_url):
    answers = gpu.server_answers(server_url)
    assert answers[0]["status"] == "ok" and answers[1]["session_id"]
    assert gpu.replay_reported([{"status": "ok"}, {"limits": {"max_steps_per_program": 1}}]) is None
    assert gpu.replay_reported([{"status": "ok"}, {"cuda_graphs": True}]) is True
    assert gpu.replay_reported([{"features": {"cuda_graph_replay": "off"}}]) is False


def test_gpu_check_script_parses():
    subprocess.run(["bash", "-n", str(Path(bench.__file__).parent / "gpu_check.sh")], check=True, timeout=20)


def test_a_recording_inside_another_leaves_the_outer_one_whole(tapped):
    sess, tap = tapped
    x = sess.tensor(torch.randn(4))
    with _hot.recording(tap) as everything:
        (x * 2).to_torch()
        with _hot.recording(tap) as inner:
            (x * 3).to_torch()
        (x * 4).to_torch()
    assert len(inner()) == 1 and len(everything()) == 3
    assert everything()[1] == inner()[0]


# -- the same_machine section's "before": the copy the SDK used to make --------------------------------

def test_same_machine_times_torchs_clone_as_the_copy_it_stands_for(tapped):
    sess, _ = tapped
    x = torch.randn(64, 784)  # 200 KB: a frame, copied at the move
    with same_machine.torch_clone_copies(), torch_copies() as before:
        x.to(sess.device)
    with torch_copies() as shipped:
        x.to(sess.device)
    assert "aten::clone" in before and not shipped

"""A graceful restart with a state volume: SIGTERM between training steps, and the same loop goes on.

The server is stopped as ``docker compose up`` with a new image stops it (SIGTERM) and a
new one starts on the same port and ``REMOTE_AUTOGRAD_STATE_DIR``; the SDK session in
the middle of its loop notices nothing. Its parameters, optimizer state and generator
(dropout masks) must end exactly where an uninterrupted run ends. Once with a single
process (``REMOTE_AUTOGRAD_TENANT_PROCESSES=off``) and once with a worker process per tenant
(the default; two tokens). A client that reads its answer slowly cannot hold the save back.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from remote_autograd import client

from ..client.capture.test_backend import train_step
from ..servers import _free_port, api, call, error_of, launch, program, put, ref, slow_fetch
from .test_training import _data

CASES = {"one-process": {"REMOTE_AUTOGRAD_TENANT_PROCESSES": "off"}, "process-per-tenant": {"REMOTE_AUTOGRAD_TOKENS": "a,b"}}
CHUNKS, STEPS_PER_PROGRAM, RESTART_AFTER = 4, 3, 1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 3))


def _train(sess: client.Session, between) -> tuple[list[float], dict]:
    """Adam over CHUNKS programs of STEPS_PER_PROGRAM steps each (their losses read once per program)."""
    X, Y = _data()
    sess.manual_seed(7)
    model = sess.module(_model())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    Xr, Yr = sess.tensor(X), sess.tensor(Y)
    losses: list[float] = []
    for chunk in range(CHUNKS):
        queued = []
        for step in range(STEPS_PER_PROGRAM):
            i = ((chunk * STEPS_PER_PROGRAM + step) * 16) % X.shape[0]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(Xr[i:i + 16]), Yr[i:i + 16])
            loss.backward()
            opt.step()
            queued.append(loss)
        losses += torch.stack(queued).tolist()  # the one request of these steps
        between(chunk)
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def _lifecycle(logged: str, words: str) -> list[dict]:
    """The log's lines about sessions saved or restored: info records, shown at the default level."""
    lines = [json.loads(line) for line in logged.splitlines() if line.startswith("{")]
    return [line for line in lines if words in line["message"] and line["level"] == "info"]


@pytest.mark.parametrize("case", CASES)
def test_a_training_loop_goes_on_across_a_sigterm_restart(case: str, tmp_path: Path):
    env = {"REMOTE_AUTOGRAD_STATE_DIR": str(tmp_path), **CASES[case]}
    token = "a" if "REMOTE_AUTOGRAD_TOKENS" in env else None
    port = _free_port()
    server = launch(port, **env)
    try:
        with client.connect(server.url, token=token) as sess:
            want_losses, want_state = _train(sess, lambda chunk: None)
        with client.connect(server.url, token=token) as sess, client.connect(server.url, token="b") as other:
            kept = other.tensor([4.0, 5.0])  # another tenant's session, across the same restart
            other.sync()

            def restart(chunk: int) -> None:
                nonlocal server
                if chunk != RESTART_AFTER:
                    return
                assert server.stop() in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once done
                assert any(tmp_path.iterdir()), "nothing was written on SIGTERM"
                assert _lifecycle(server.logged(), "saved for the next start"), server.logged()
                assert f"; sessions saved to {tmp_path} on SIGTERM;" in server.logged()  # the startup line
                server = launch(port, **env)

            got_losses, got_state = _train(sess, restart)
            assert kept.tolist() == [4.0, 5.0]
            if token is not None:
                with api(server.url, token) as c:  # restored as the other token's: still not ours
                    error_of(c.get(f"/v1/sessions/{other.id}"), 404, "unknown_session")
        assert got_losses == want_losses
        assert _lifecycle(server.logged(), "restored from"), server.logged()
        for k, v in want_state.items():
            assert torch.equal(got_state[k], v), k
    finally:
        server.close()


@pytest.mark.parametrize("case", CASES)
def test_a_backward_across_a_restart_raises_what_the_spec_promises(case: str, tmp_path: Path):
    """A restart between a forward and its backward: the backward is a 422 naming the restart, in the
    SDK at the user's backward line (and no grad predicted), over plain HTTP too. It was a 200 that
    filled no gradient (SDK: ``backward()`` and ``sync()`` passed)."""
    env = {"REMOTE_AUTOGRAD_STATE_DIR": str(tmp_path), **CASES[case]}
    token = "a" if "REMOTE_AUTOGRAD_TOKENS" in env else None
    server = launch(**env)
    try:
        with client.connect(server.url, token=token) as sess, api(server.url, token) as c:
            w = sess.tensor([1.0, 2.0], requires_grad=True)
            loss = (w * 3).sum()
            sess.sync()
            sid = c.post("/v1/sessions").json()["session_id"]
            assert program(c, sid, [put("v", [1.0], requires_grad=True), call("mul", ref("v"), 2.0, out=["y"])]).is_success
            assert server.stop() in (0, -signal.SIGTERM)
            server = launch(server.port, **env)
            loss.backward(); line = sys._getframe().f_lineno  # noqa: E702 (the line the error must name)
            with pytest.raises(client.RemoteError, match="lost when the server restarted") as raised:
                sess.sync()
            assert (raised.value.status, raised.value.op) == (422, "backward")
            assert raised.value.where.endswith(f"test_restart.py:{line}") and w.grad is None
            error_of(program(c, sid, [{"kind": "backward", "tensors": ["y"]}]), 422, "op_error", "server restarted")
    finally:
        server.close()


def test_a_compiled_step_goes_on_across_a_restart_its_templates_sent_again(tmp_path: Path):
    """A restart keeps no template: the first run after it answers unknown_template, and the session
    sends the template and the rest of the program again, unseen (``SessionCore.flush``)."""
    X, Y = _data()

    def train(sess: client.Session, between) -> tuple[list[float], list[torch.Tensor]]:
        torch._dynamo.reset()
        compiled = torch.compile(train_step, backend="remote")
        model = sess.module(_model().eval())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for k in range(4):
            losses.append(compiled(model, opt, sess.tensor(X[:16]), sess.tensor(Y[:16])).item())
            between(k)
        return losses, [p.detach().cpu() for p in model.parameters()]

    port = _free_port()
    server = launch(port, REMOTE_AUTOGRAD_STATE_DIR=str(tmp_path))
    try:
        with client.connect(server.url) as sess:
            want_losses, want_params = train(sess, lambda k: None)
        with client.connect(server.url) as sess:
            def restart(k: int) -> None:
                nonlocal server
                if k == 1:
                    assert server.stop() in (0, -signal.SIGTERM)
                    server = launch(port, REMOTE_AUTOGRAD_STATE_DIR=str(tmp_path))

            got_losses, got_params = train(sess, restart)
        assert got_losses == want_losses
        for got, want in zip(got_params, want_params):
            assert torch.equal(got, want)
    finally:
        server.close()
        torch._dynamo.reset()


def test_a_slow_reader_cannot_hold_the_sigterm_save(tmp_path: Path):
    """A client reads a 32 MiB answer 2 MiB every 5 s (never silent for answer_timeout_seconds, and
    faster than the minimum rate set here); SIGTERM: the open answer is cut after
    shutdown_grace_seconds and every session is saved, the other session restored by the next
    server. Before: uvicorn waited for the reader until the kill, which wrote nothing."""
    env = {"REMOTE_AUTOGRAD_STATE_DIR": str(tmp_path), "REMOTE_AUTOGRAD_SHUTDOWN_GRACE_SECONDS": "1",
           "REMOTE_AUTOGRAD_MIN_ANSWER_BYTES_PER_SECOND": "1"}
    port = _free_port()
    server = launch(port, **env)
    try:
        with client.connect(server.url) as other, client.connect(server.url) as slow:
            kept = other.tensor([4.0, 5.0])
            big = slow.tensor(torch.zeros(8 << 20))
            other.sync(), slow.sync()
            reader, _ = slow_fetch(port, slow.id, big._id, every=5.0)
            time.sleep(1.0)  # its answer is under way, and waits for it
            assert server.stop(timeout=30) in (0, -signal.SIGTERM)  # not killed: it ended on its own
            reader.close()
            assert any(tmp_path.iterdir()), "nothing was written on SIGTERM"
            server = launch(port, **env)
            assert kept.tolist() == [4.0, 5.0]
    finally:
        server.close()

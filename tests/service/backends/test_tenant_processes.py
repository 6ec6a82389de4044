"""A worker process per tenant: a crash in one tenant's worker loses only its sessions; limits hold across workers.

One server with two tokens (``a`` attacks or crashes, ``b`` trains on) runs each token's
sessions in a process of its own (the default with more than one token).
"""

from __future__ import annotations

import threading
from typing import Iterator

import pytest
import torch

from remote_autograd import client

from ...e2e.test_training import _data, _mlp
from ...servers import Server, api, call, error_of, program, put, ref, running

TOKENS = {"REMOTE_AUTOGRAD_TOKENS": "a,b", "REMOTE_AUTOGRAD_TEST_OPS": "1", "REMOTE_AUTOGRAD_METRICS_TOKEN": "op"}
STEPS, ABORT_AT = 8, 3


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running(**TOKENS) as s:
        yield s


def _train_steps(model, opt, X, Y, steps: int, after_step=lambda step: None) -> list[float]:
    """SGD steps over batches of 16, one program each (``loss.item()``)."""
    losses = []
    for step in range(steps):
        i = (step * 16) % X.shape[0]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(X[i:i + 16]), Y[i:i + 16])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        after_step(step)
    return losses


def _local_run(steps: int) -> tuple[list[float], dict]:
    X, Y = _data()
    model = _mlp()
    losses = _train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), X, Y, steps)
    return losses, model.state_dict()


def _pid(url: str, token: str, sid: str) -> str:
    with api(url, token) as c:
        return c.get(f"/v1/sessions/{sid}").json()["worker"]


def test_each_token_has_a_process_of_its_own(server: Server):
    with client.connect(server.url, token="a") as a, client.connect(server.url, token="a") as a2, \
            client.connect(server.url, token="b") as b:
        for s in (a, a2, b):
            s.sync()
        assert _pid(server.url, "a", a.id) == _pid(server.url, "a", a2.id)  # one process per token, not per session
        assert _pid(server.url, "a", a.id) != _pid(server.url, "b", b.id)
        with api(server.url, "b") as c:  # routed by the caller: another token's id is unknown, as on one server
            error_of(c.get(f"/v1/sessions/{a.id}"), 404, "unknown_session")
            error_of(program(c, a.id, [put("x", [1.0])]), 404, "unknown_session")


def test_metrics_gather_every_workers_figures_and_count_each_step_once(server: Server):
    with api(server.url, "a") as a, api(server.url, "b") as b, api(server.url, "op") as operator:
        sid = a.post("/v1/sessions").json()["session_id"]
        theirs = b.post("/v1/sessions").json()["session_id"]
        assert program(a, sid, [put("x", [0.5] * 1000), call("erfc", ref("x"), out=["y"])]).status_code == 200
        assert program(b, theirs, [put("z", [0.5] * 10)]).status_code == 200
        for _ in range(2):  # each scrape asks the workers again: a step is counted once, however often
            everything = operator.get("/metrics").text
            assert 'remote_autograd_op_seconds_count{op="erfc"} 1.0' in everything
            assert "remote_autograd_bytes_held 8040.0" in everything and "remote_autograd_sessions 2.0" in everything
        mine = a.get("/metrics").text  # a tenant sees its own, from its own worker
        assert "remote_autograd_token_bytes_held 8000.0" in mine and "erfc" not in b.get("/metrics").text
        a.delete(f"/v1/sessions/{sid}"), b.delete(f"/v1/sessions/{theirs}")


def test_a_crash_in_one_tenants_worker_loses_only_its_sessions(server: Server):
    want_losses, want_state = _local_run(STEPS)
    X, Y = _data()
    aborted = threading.Event()
    with client.connect(server.url, token="a") as a, client.connect(server.url, token="a") as a_other, \
            client.connect(server.url, token="b") as b:
        x, kept = a.tensor([1.0, 2.0]), a_other.tensor([3.0])
        a.sync(), a_other.sync()
        reached = threading.Event()
        model = b.module(_mlp())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        Xr, Yr = b.tensor(X), b.tensor(Y)
        got: dict = {}

        def train() -> None:  # b trains on through the crash: each step waits until the abort is done
            def after(step: int) -> None:
                if step == ABORT_AT:
                    reached.set()
                    assert aborted.wait(60)
            got["losses"] = _train_steps(model, opt, Xr, Yr, STEPS, after)

        trainer = threading.Thread(target=train)
        trainer.start()
        assert reached.wait(60)
        with pytest.raises(client.SessionLost) as lost:  # the kernel crashes a's worker mid-program
            a.ops._test_abort(x).tolist()
        aborted.set()
        trainer.join(120)
        assert "SIGABRT" in str(lost.value) and "other tenants" in str(lost.value)
        with pytest.raises(client.SessionLost):  # every session of that process went with it
            kept.tolist()
        with client.connect(server.url, token="a") as fresh:  # the token's next session gets a new worker
            assert fresh.tensor([1.0, 2.0]).mul(3).tolist() == [3.0, 6.0]
        assert got["losses"] == want_losses  # b went on exactly
        state = {k: v.cpu() for k, v in model.state_dict().items()}
        for k, v in want_state.items():
            assert torch.equal(state[k], v), k
        a._closed = a_other._closed = True  # lost: nothing to delete


def test_the_server_wide_limits_hold_across_workers():
    limits = {"REMOTE_AUTOGRAD_MAX_TOTAL_BYTES": "10000", "REMOTE_AUTOGRAD_MAX_SESSIONS": "3", **TOKENS,
              # each token's shares as big as the server's: only the server-wide limits bind here
              "REMOTE_AUTOGRAD_MAX_BYTES_PER_TOKEN": "10000", "REMOTE_AUTOGRAD_MAX_SESSIONS_PER_TOKEN": "3"}
    floats = [0.5] * 1000  # 4000 bytes
    with running(**limits) as s, api(s.url, "a") as a, api(s.url, "b") as b:
        first, second = (a.post("/v1/sessions").json()["session_id"] for _ in range(2))
        theirs = b.post("/v1/sessions").json()["session_id"]
        error_of(b.post("/v1/sessions"), 429, "too_many", "max_sessions=3")  # counted across both processes
        assert program(a, first, [put("x", floats)]).status_code == 200
        assert program(b, theirs, [put("y", floats)]).status_code == 200  # a's unused grant came back for b
        r = program(a, second, [put("z", floats)])  # 12000 bytes across the two processes: over 10000
        error_of(r, 413, "too_large", "max_total_bytes=10000")
        assert a.get(f"/v1/sessions/{second}").json()["bytes"] == 0  # refused without a trace
        assert program(b, theirs, [{"kind": "free", "ids": ["y"]}]).status_code == 200
        assert program(a, second, [put("z", floats)]).status_code == 200  # b's freed bytes are a's to take
        a.delete(f"/v1/sessions/{first}")
        made = b.post("/v1/sessions")  # a freed session slot is anyone's
        assert made.status_code == 201, made.text


def test_an_idle_tokens_worker_stops_and_its_next_session_starts_another():
    idle = {"REMOTE_AUTOGRAD_TENANT_IDLE_SECONDS": "0.3", "REMOTE_AUTOGRAD_SWEEP_INTERVAL_SECONDS": "0.1", **TOKENS}
    with running(**idle) as s, api(s.url, "a") as a:
        sid = a.post("/v1/sessions").json()["session_id"]
        before = a.get(f"/v1/sessions/{sid}").json()["worker"]
        assert _live_workers(s.url) == 1
        a.delete(f"/v1/sessions/{sid}")
        _wait_for(lambda: _live_workers(s.url) == 0)
        error_of(a.get(f"/v1/sessions/{sid}"), 404, "unknown_session")
        again = a.post("/v1/sessions").json()["session_id"]
        assert a.get(f"/v1/sessions/{again}").json()["worker"] != before


def _live_workers(url: str) -> int:
    import httpx

    return httpx.get(url + "/readyz").json()["tenant_workers"]


def _wait_for(condition, timeout: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)

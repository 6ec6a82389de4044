"""A worker process per tenant: a crash in one tenant's worker loses only its sessions; limits hold across workers.

One server with two tokens (``a`` attacks or crashes, ``b`` trains on) runs each token's
sessions in a process of its own (the default, with any number of tokens). Issue 31's
part: a worker for a server of one tenant too, a worker that dies with its front, reads
none of its secrets, is ended when one of its steps outlives the time limit or its client,
and keeps a kernel's hidden temporaries to itself (``harsh``: a server of small bounds).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator

import httpx
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


def _pid(url: str, token: str | None, sid: str) -> str:
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
    return httpx.get(url + "/readyz").json()["tenant_workers"]


def _wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


# -- issue 31: a worker even for one tenant, holding no secret, ended when a step runs too long --------------


def _worker_pid(url: str, token: str | None, sid: str) -> int:
    return int(_pid(url, token, sid).rsplit("pid ", 1)[1].rstrip(")"))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended: only its parent's wait is left
    except FileNotFoundError:
        return False


def _read_proc(c, sid: str, what: str):
    return program(c, sid, [call("_test_read_proc", what, out=[what]), {"kind": "fetch", "id": what}])


def test_a_worker_reads_neither_its_fronts_environment_nor_memory_and_holds_no_token(server: Server):
    """Code running in a tenant's worker (a test op standing in for a kernel's heap bug) tries /proc:
    its front's environment (every token) and memory are closed to it, and its own environment
    has no token of any kind (before: both readable, REMOTE_AUTOGRAD_METRICS_TOKEN inherited)."""
    with api(server.url, "a") as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        for what in ("front_environ", "front_mem"):
            error_of(_read_proc(c, sid, what), 422, "op_error", "Permission denied")
        r = _read_proc(c, sid, "own_environ")
        assert r.status_code == 200, r.text
        environ = bytes(r.json()["results"][1]["tensor"]["value"]["data"]).split(b"\0")
        assert environ and not [v for v in environ if v.startswith(b"REMOTE_AUTOGRAD_")], environ
        c.delete(f"/v1/sessions/{sid}")


def test_a_workers_environment_is_an_allow_list():
    from remote_autograd.service.backends.tenant_spawn import worker_environment

    front = {"PATH": "/bin", "LANG": "C", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "4",
             "REMOTE_AUTOGRAD_TOKENS": "t1,t2", "REMOTE_AUTOGRAD_METRICS_TOKEN": "op", "REMOTE_AUTOGRAD_TOKEN": "t",
             "REMOTE_AUTOGRAD_DEVICE": "cpu", "AWS_SECRET_ACCESS_KEY": "s", "GITHUB_TOKEN": "g", "MY_APP_SETTING": "x",
             "TORCH_HUB_TOKEN": "h", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert worker_environment(front) == {"PATH": "/bin", "LANG": "C", "CUDA_VISIBLE_DEVICES": "0",
                                         "OMP_NUM_THREADS": "4", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_one_tenants_crash_leaves_the_server_up_and_a_worker_dies_with_its_front():
    """The default server (no token, one tenant): a kernel's crash ends its worker, not the server
    (before: the server itself died); the next session gets a new worker. Then the front is
    SIGKILLed while a step holds its worker's interpreter: the worker goes with it (before: it
    computed on until the step ended)."""
    with running(REMOTE_AUTOGRAD_TEST_OPS="1") as s:
        with client.connect(s.url) as sess:
            x = sess.tensor([1.0, 2.0])
            sess.sync()
            with pytest.raises(client.SessionLost) as lost:
                sess.ops._test_abort(x).tolist()
            assert "SIGABRT" in str(lost.value)
            sess._closed = True  # lost: nothing to delete
        with api(s.url) as c:
            assert c.get("/healthz").status_code == 200
            sid = c.post("/v1/sessions").json()["session_id"]
            assert program(c, sid, [put("y", [3.0]), {"kind": "fetch", "id": "y"}]).status_code == 200
            worker = _worker_pid(s.url, None, sid)
            threading.Thread(target=lambda: _quietly(program, c, sid, [call("_test_sleep", 25, hold_gil=True)]),
                             daemon=True).start()
            time.sleep(1.0)  # the step has begun (its worker's interpreter is held from here on)
            s.stop(signal.SIGKILL)
            _wait_for(lambda: not _alive(worker), timeout=10)


def _quietly(fn, *args) -> None:
    with contextlib.suppress(httpx.HTTPError):
        fn(*args)


HARSH = {**TOKENS, "REMOTE_AUTOGRAD_MAX_PROGRAM_SECONDS": "1", "REMOTE_AUTOGRAD_STEP_GRACE_SECONDS": "1",
         "REMOTE_AUTOGRAD_WORKER_MEMORY_BYTES": str(256 << 20),
         # the cost check (a step's work, known before it runs) lets everything through: what these
         # tests hold is the backstop behind it, each worker's own bounds
         "REMOTE_AUTOGRAD_MAX_STEP_FLOPS": str(10**18), "REMOTE_AUTOGRAD_DEVICE_FLOPS_PER_SECOND": "1e18"}


@pytest.fixture(scope="module")
def harsh() -> Iterator[Server]:
    """Two tokens, a program time limit of 1 s with 1 s of grace, workers bounded 256 MiB above their
    start, and no cost check to speak of."""
    with running(**HARSH) as s:
        yield s


def test_a_step_past_the_time_limit_ends_its_worker_and_the_error_names_it(harsh: Server):
    """A step of 25 s under a limit of 1 s (+1 s of grace): its worker is ended, the program answers
    410 naming the step and its op, at the user's line in the SDK; the other tenant goes on
    (before: the step ran to its end, holding its thread and session, and answered 200)."""
    with client.connect(harsh.url, token="b") as b, api(harsh.url, "a") as c:
        kept = b.tensor([4.0, 5.0])
        b.sync()
        sid = c.post("/v1/sessions").json()["session_id"]
        worker = _worker_pid(harsh.url, "a", sid)
        r = program(c, sid, [put("x", [1.0]), call("_test_sleep", 25, out=["slept"])])
        err = error_of(r, 410, "session_lost", "step 1 (_test_sleep)", "max_program_seconds=1")
        assert (err["step"], err["op"]) == (1, "_test_sleep")
        assert not _alive(worker)
        error_of(c.get(f"/v1/sessions/{sid}"), 410, "session_lost", "step 1 (_test_sleep)")
        with client.connect(harsh.url, token="a") as sess:  # the SDK: SessionLost at the user's line
            with pytest.raises(client.SessionLost) as lost:
                sess.ops._test_sleep(25).tolist()
            assert lost.value.op == "_test_sleep" and "test_tenant_processes.py" in (lost.value.where or "")
            sess._closed = True
        assert kept.tolist() == [4.0, 5.0]
        assert httpx.get(harsh.url + "/healthz").status_code == 200


def test_a_step_whose_client_left_ends_its_worker(harsh: Server):
    """Its client disconnects while a 25 s step runs: a step later than its grace (1 s), the worker
    is ended and its sessions say why (before: the step ran on, the session held)."""
    with api(harsh.url, "a") as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        worker = _worker_pid(harsh.url, "a", sid)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            c.post(f"/v1/sessions/{sid}/programs", json={"id": "p", "steps": [call("_test_sleep", 25)]}, timeout=0.5)
        _wait_for(lambda: not _alive(worker), timeout=10)
        error_of(c.get(f"/v1/sessions/{sid}"), 410, "session_lost", "after its client disconnected")


def test_a_kernels_hidden_temporary_ends_in_its_own_worker(harsh: Server):
    """``kthvalue`` of an expanded one-element float64 tensor is charged 24 bytes and copies its
    input whole inside the kernel (2^26 elements: 512 MiB) past the worker's memory bound (256 MiB
    above its start): refused in that worker (507), not by the host; the other tenant, the front
    and the session go on (before: the 512 MiB were taken)."""
    with api(harsh.url, "a") as a, api(harsh.url, "b") as b:
        sid, theirs = a.post("/v1/sessions").json()["session_id"], b.post("/v1/sessions").json()["session_id"]
        assert program(b, theirs, [put("z", [2.0])]).status_code == 200
        r = program(a, sid, [put("x", [1.0], dtype="float64"), call("expand", ref("x"), [1 << 26], out=["big"]),
                             call("kthvalue", ref("big"), 1, out=["v", "i"])])
        assert r.status_code in (507, 410), r.text[:300]
        if r.status_code == 507:  # the allocator refused it: the worker and the session live on
            assert r.json()["error"]["step"] == 2 and program(a, sid, [{"kind": "fetch", "id": "x"}]).status_code == 200
        r = program(b, theirs, [{"kind": "fetch", "id": "z"}])
        assert r.status_code == 200 and r.json()["results"][0]["tensor"]["value"]["data"] == [2.0]

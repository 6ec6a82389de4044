"""The Ray backend on a real two-node Ray cluster on this machine, behind two front processes.

One cluster serves the module: two nodes with one fake GPU each (``num_gpus=1``: one
worker actor per node), and two fronts joining it with ``RAY_ADDRESS``. Everything goes
through both fronts with the SDK and raw HTTP. The test that removes a node runs last.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from typing import Iterator

import httpx
import pytest
import torch
from torch import nn

from remote_autograd import client

from ..conftest import start_server
from ..ray_cluster import RAY_ENV, cluster_or_skip, front_env, ready_workers
from ..servers import api as _api
from ..servers import call, error_of, program, put, ref
from .test_training import _data, _mlp, _train

TOKENS = ("alice", "bob")
PER_TOKEN = {"REMOTE_AUTOGRAD_MAX_SESSIONS_PER_TOKEN": "3", "REMOTE_AUTOGRAD_MAX_BYTES_PER_TOKEN": "400000"}
FRONT = {"REMOTE_AUTOGRAD_TOKENS": ",".join(TOKENS), "REMOTE_AUTOGRAD_TEST_OPS": "1", **PER_TOKEN}
GPU_NODE = {"num_cpus": 1, "num_gpus": 1}
# A token's first session on a node starts its worker actor, which imports torch before it answers: the
# server waits up to 120 s for that (ray_sessions._FIRST_ANSWER_SECONDS), and so does every raw call here.
# Abandoning a create at 30 s on a loaded machine left a session the next tests' placement counted.
api = functools.partial(_api, timeout=150)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple]:
    with cluster_or_skip(GPU_NODE, GPU_NODE) as (ray_cluster, nodes):
        yield ray_cluster, nodes


@pytest.fixture(scope="module")
def fronts(cluster) -> Iterator[list[str]]:
    env = front_env(cluster[0].address, **FRONT)
    with start_server(**env) as first, start_server(**env) as second:
        yield [first, second]


def _node_ids(cluster) -> list[str]:
    return [node.node_id for node in cluster[1]]


def _where(url: str, sid: str, token: str = "alice") -> dict:
    with api(url, token) as c:
        r = c.get(f"/v1/sessions/{sid}")
        assert r.status_code == 200, r.text
        return r.json()


def test_readyz_counts_the_workers_and_health_says_ray(fronts):
    for url in fronts:
        assert ready_workers(url, 2)["status"] == "ready"
        assert httpx.get(url + "/healthz").json()["device"] == "ray"
        with api(url, "alice") as c:  # the front's own metrics (programs in flight; sessions live in workers),
            assert "remote_autograd_token_programs_in_flight 0.0" in c.get("/metrics").text  # a tenant's own


def test_sessions_land_on_both_nodes_and_either_front_serves_them(cluster, fronts):
    with client.connect(fronts[0], token="alice") as a, client.connect(fronts[1], token="alice") as b:
        x, y = a.tensor([1.0, 2.0]), b.tensor([3.0, 4.0])
        a.sync(), b.sync()
        where = [_where(fronts[1], a.id), _where(fronts[0], b.id)]  # each asked through the other front
        assert {w["node"] for w in where} == set(_node_ids(cluster))
        assert where[0]["worker"] != where[1]["worker"] and all(w["tensors"] == 1 for w in where)
        assert (x * 2).tolist() == [2.0, 4.0] and (y + 1).tolist() == [4.0, 5.0]
        with api(fronts[1], "alice") as c:  # a program sent through the front that did not place it
            r = program(c, a.id, [call("mul", ref(x._id), 10.0, out=["z"]), {"kind": "fetch", "id": "z"}])
            assert r.status_code == 200, r.text
            assert r.json()["results"][1]["tensor"]["value"]["data"] == [10.0, 20.0]


def test_another_tokens_session_is_unknown_through_any_front(fronts):
    with client.connect(fronts[0], token="alice") as a:
        a.sync()
        for url in fronts:
            with api(url, "bob") as c:
                error_of(c.get(f"/v1/sessions/{a.id}"), 404, "unknown_session")


def test_training_gives_the_parameters_of_the_inprocess_backend(fronts):
    X, Y = _data()
    states = []
    with start_server() as inprocess:
        for url, token in ((fronts[0], "alice"), (fronts[1], "bob"), (inprocess, None)):
            with client.connect(url, token=token) as s:
                model = s.module(_mlp())
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                losses = _train(model, opt, s.tensor(X), s.tensor(Y), steps=8)
                states.append((losses, {k: v.cpu() for k, v in model.state_dict().items()}))  # on the device, as torch's
    (ray_losses, ray_state), (other_losses, other_state), (local_losses, local_state) = states
    assert ray_losses == other_losses == local_losses
    for k, v in local_state.items():
        assert torch.equal(ray_state[k], v) and torch.equal(other_state[k], v), k


def test_sessions_per_token_are_limited_cluster_wide(fronts):
    made: list[tuple[str, str]] = []
    try:
        for i in range(3):  # alternately through each front: they land on both workers
            url = fronts[i % 2]
            with api(url, "alice") as c:
                r = c.post("/v1/sessions")
                assert r.status_code == 201, r.text
                made.append((url, r.json()["session_id"]))
        assert len({_where(url, sid)["node"] for url, sid in made}) == 2
        for url in fronts:
            with api(url, "alice") as c:
                error_of(c.post("/v1/sessions"), 429, "too_many", "max_sessions_per_token=3")
        with api(fronts[0], "bob") as c:  # another token is not locked out
            r = c.post("/v1/sessions")
            assert r.status_code == 201, r.text
            c.delete(f"/v1/sessions/{r.json()['session_id']}")
    finally:
        for url, sid in made:
            with api(url, "alice") as c:
                c.delete(f"/v1/sessions/{sid}")


def _two_sessions_on_two_nodes(fronts, token: str) -> list[str]:
    made = []
    for url in fronts:
        with api(url, token) as c:
            r = c.post("/v1/sessions")
            assert r.status_code == 201, r.text
            made.append(r.json()["session_id"])
    assert _where(fronts[0], made[0], token)["node"] != _where(fronts[0], made[1], token)["node"]
    return made


def test_bytes_per_token_are_limited_cluster_wide(fronts):
    big = put("big", [0.5] * 60000)  # 240 kB; the token may hold 400 kB
    first, second = _two_sessions_on_two_nodes(fronts, "alice")
    with api(fronts[0], "alice") as c:
        try:
            assert program(c, first, [big]).status_code == 200
            # the other worker hears of those bytes within one report (REPORT_SECONDS)
            deadline = time.monotonic() + 10
            while (r := program(c, second, [big])).status_code == 200:
                assert program(c, second, [{"kind": "free", "ids": ["big"]}]).status_code == 200
                assert time.monotonic() < deadline, "the other worker never counted the first one's bytes"
                time.sleep(0.2)
            error_of(r, 413, "too_large", "max_bytes_per_token=400000", "480000")
            assert _where(fronts[0], second)["bytes"] == 0  # refused without a trace
            with api(fronts[1], "bob") as b:  # another token has its own budget
                theirs = b.post("/v1/sessions").json()["session_id"]
                assert program(b, theirs, [big]).status_code == 200
                b.delete(f"/v1/sessions/{theirs}")
            assert program(c, first, [{"kind": "free", "ids": ["big"]}]).status_code == 200
            deadline = time.monotonic() + 10
            while (r := program(c, second, [big])).status_code != 200:  # freed bytes come back
                assert time.monotonic() < deadline, r.text
                time.sleep(0.2)
        finally:
            for sid in (first, second):
                c.delete(f"/v1/sessions/{sid}")


def test_a_dead_worker_process_loses_its_sessions_and_its_replacement_does_not_take_their_ids(cluster, fronts):
    first, second = _two_sessions_on_two_nodes(fronts, "alice")
    victim = _where(fronts[0], first)["worker"]
    _kill_actor(cluster[0].address, victim)  # its process ends; the node stays
    with api(fronts[0], "alice") as c:
        error_of(program(c, first, []), 410, "session_lost", first, victim, "died")
        assert program(c, second, [put("x", [1.0])]).status_code == 200  # the other worker's session goes on
        ready_workers(fronts[0], 2)  # the device is still there
        replacing = c.post("/v1/sessions").json()["session_id"]  # to the emptiest device: a new worker there
        assert _where(fronts[0], replacing)["worker"] == victim
        # an id of the dead worker reaches its replacement (same name), which knows it is not its own
        error_of(c.get(f"/v1/sessions/{first}"), 410, "session_lost", "earlier run")
        for sid in (first, second, replacing):
            c.delete(f"/v1/sessions/{sid}")


def test_a_dead_node_loses_only_its_sessions_and_a_joining_node_is_used(cluster, fronts):
    ray_cluster, nodes = cluster
    head, other = _node_ids(cluster)
    sessions = [client.connect(fronts[i % 2], token="alice") for i in range(2)]
    try:
        values = [s.tensor(torch.arange(4.0) + i) for i, s in enumerate(sessions)]
        for s in sessions:
            s.sync()
        on = {_where(fronts[0], s.id)["node"]: (s, v, i) for i, (s, v) in enumerate(zip(sessions, values))}
        assert set(on) == {head, other}
        ray_cluster.remove_node(nodes[1])
        lost, kept = on[other], on[head]
        with pytest.raises(client.SessionLost) as info:
            (lost[1] * 2).tolist()
        assert info.value.status == 410 and info.value.code == "session_lost" and lost[0].id in str(info.value)
        assert (kept[1] * 2).tolist() == ((torch.arange(4.0) + kept[2]) * 2).tolist()  # the other goes on
        with api(fronts[1], "alice") as c:  # through the other front too
            error_of(c.get(f"/v1/sessions/{lost[0].id}"), 410, "session_lost", lost[0].id)
        for url in fronts:
            ready_workers(url, 1)
            with client.connect(url, token="bob") as fresh:
                fresh.sync()
                theirs, ours = _where(url, fresh.id, "bob"), _where(url, kept[0].id)
                assert theirs["node"] == ours["node"] == head  # one GPU, shared by each token's own worker
                assert theirs["worker"] != ours["worker"]
        lost[0]._closed = True  # nothing left to delete
        joined = ray_cluster.add_node(node_ip_address="127.0.0.1", **GPU_NODE)
        ready_workers(fronts[0], 2)
        with client.connect(fronts[0], token="bob") as later:  # the empty worker is the least loaded
            later.sync()
            assert _where(fronts[0], later.id, "bob")["node"] == joined.node_id
            assert later.tensor([1.0]).add(1).tolist() == [2.0]
    finally:
        for s in sessions:
            if not s._closed:
                s.close()


def _kill_actor(address: str, name: str) -> None:
    """``ray.kill`` of the named actor from a driver process of its own: a driver in this process
    would share Ray's global state with the session's other cluster (``ray_server_url``'s), and
    joining a second cluster from it can hang waiting for a GCS."""
    script = ("import ray, sys; ray.init(address=sys.argv[1], namespace='remote-autograd', log_to_driver=False); "
              "ray.kill(ray.get_actor(sys.argv[2])); ray.shutdown()")
    subprocess.run([sys.executable, "-c", script, address, name], env={**os.environ, **RAY_ENV}, check=True,
                   timeout=120, capture_output=True)

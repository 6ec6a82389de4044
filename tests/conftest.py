"""Shared fixtures: one real uvicorn server per test session, on 127.0.0.1 and an ephemeral port.

Tests that need other settings start their own with ``start_server(**env)``.

A test (or a module, through ``pytestmark``) marked ``@pytest.mark.backends("inprocess", "ray")``
runs once per backend: ``server_url`` is then the in-process server, the same with its
sessions in a tenant worker process (``tenants``), or a front on the Ray backend (over a
one-node Ray cluster started once per test session). Unmarked tests use the in-process
server only.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import httpx
import pytest

from remote_autograd import client

from .servers import running


@contextlib.contextmanager
def start_server(**env: str) -> Iterator[str]:
    """A real ``python -m remote_autograd.service`` on a free loopback port; ``env`` adds REMOTE_AUTOGRAD_* settings."""
    with running(**env) as server:
        yield server.url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None and "server_url" in metafunc.fixturenames:
        metafunc.parametrize("server_url", marker.args, indirect=True, scope="session")


@pytest.fixture(scope="session")
def server_url(request: pytest.FixtureRequest) -> str:
    """The shared server of the test's backend (``inprocess`` unless the test is marked ``backends``)."""
    return request.getfixturevalue(f"{getattr(request, 'param', 'inprocess')}_server_url")


@pytest.fixture(scope="session")
def inprocess_server_url() -> Iterator[str]:
    """The shared server with default settings (plus the test-only ops)."""
    with start_server(REMOTE_AUTOGRAD_TEST_OPS="1") as url:
        yield url


@pytest.fixture(scope="session")
def tenants_server_url() -> Iterator[str]:
    """The shared server's settings with every tenant (here the one open one) in a worker process of its own."""
    with start_server(REMOTE_AUTOGRAD_TEST_OPS="1", REMOTE_AUTOGRAD_TENANT_PROCESSES="on") as url:
        yield url


@pytest.fixture(scope="session")
def ray_server_url() -> Iterator[str]:
    """A front on the Ray backend (test-only ops too), over a one-node cluster with one worker slot."""
    from .ray_cluster import cluster_or_skip, front_env

    with cluster_or_skip({"num_cpus": 1, "resources": {"remote_autograd_worker": 1}}) as (cluster, _):
        with start_server(**front_env(cluster.address, REMOTE_AUTOGRAD_TEST_OPS="1")) as url:
            yield url


@pytest.fixture
def sess(server_url: str) -> Iterator[client.Session]:
    """A pipelined SDK session on the shared server."""
    with client.connect(server_url) as s:
        yield s


@pytest.fixture
def eager_sess(server_url: str) -> Iterator[client.Session]:
    with client.connect(server_url, pipeline=False) as s:
        yield s


@pytest.fixture(params=["pipelined", "eager"])
def any_sess(request, server_url: str) -> Iterator[client.Session]:
    """Both modes: the same test must pass in each."""
    with client.connect(server_url, pipeline=request.param == "pipelined") as s:
        yield s


PROTOCOL_HEADERS = {"Remote-Autograd-Protocol": "1"}


@pytest.fixture
def http(server_url: str) -> Iterator[httpx.Client]:
    """A raw httpx client on the shared server, with the protocol header set."""
    with httpx.Client(base_url=server_url, headers=PROTOCOL_HEADERS, timeout=30) as c:
        yield c

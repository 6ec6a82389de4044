"""Shared fixtures: one real uvicorn server per test session, on 127.0.0.1 and an ephemeral port.

Tests that need other settings start their own with ``start_server(**env)``.

A test (or a module, through ``pytestmark``) marked ``@pytest.mark.backends("inprocess", "ray")``
runs once per backend: ``server_url`` is then the in-process server, the same with its
sessions in a tenant worker process (``tenants``), or a front on the Ray backend (over a
one-node Ray cluster started once per test session). Unmarked tests use the in-process
server only.

The client's and the op table's tests (``tests/client``, ``tests/ops``) get their ``sess``,
``eager_sess``, ``any_sess`` and ``http`` on the service's app in this process, through
``InProcessTransport`` (everything above the socket is the real thing), unless they run once
per backend or ask for ``server_url`` themselves; the server's own behaviour over sockets is
the service's and the end-to-end tests' to check.

The ladder: ``make test-fast`` leaves out what the markers below name (set by folder, file and
backend in ``pytest_collection_modifyitems``, so no test can forget its mark): the end-to-end,
load, real-model and Ray tests, and the modules that start servers of their own settings (the
limits, the tenants' processes, the attacks: each server a process); besides, the tests marked
``optable``, ``inductor`` or ``slow`` where they are written. ``make test`` runs all.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from remote_autograd import client
from remote_autograd.service.settings import Settings

from .answer_schema import check_answer, response_hook
from .servers import running


@contextlib.contextmanager
def start_server(**env: str) -> Iterator[str]:
    """A real ``python -m remote_autograd.service`` on a free loopback port; ``env`` adds REMOTE_AUTOGRAD_* settings."""
    with running(**env) as server:
        yield server.url


_SERVED = ("server_url", "sess", "eager_sess", "any_sess", "http")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None and any(name in metafunc.fixturenames for name in _SERVED):
        if "server_url" not in metafunc.fixturenames:  # sess and the rest reach it only when they need it
            metafunc.fixturenames.append("server_url")
        # the tenants backend is the shared server's own default settings (``tenants_server_url``): in the
        # fast loop its cases would run each test twice on one server, so they are ``make test``'s alone
        backends = [pytest.param(name, marks=pytest.mark.slow) if name == "tenants" else name for name in marker.args]
        metafunc.parametrize("server_url", backends, indirect=True, scope="session")


TESTS = Path(__file__).resolve().parent
# (marker, whether a test module's every test has it, by the module's path): the rungs ``make test-fast``
# leaves out; a test on the ray backend is marked ``ray`` too (``pytest_collection_modifyitems``)
_RUNGS = {
    "e2e": lambda rel: rel.parts[0] == "e2e",
    "load": lambda rel: rel.name == "test_load.py",
    "real_model": lambda rel: rel.name in ("test_real_models.py", "test_training.py", "test_training_idioms.py"),
    "ray": lambda rel: rel.name == "test_ray_cluster.py",
    "servers": lambda rel: _starts_servers(TESTS / rel),
}


@functools.cache
def _starts_servers(path: Path) -> bool:
    """Whether a test module starts servers of its own settings (each a process: a second or two)."""
    text = path.read_text()
    return "running(" in text or "start_server(" in text


@functools.cache
def _module_marks(path: Path) -> frozenset[str]:
    """The marks every test of the module at ``path`` has: its rungs, and its ``pytestmark = pytest.mark.X``."""
    rel = path.resolve().relative_to(TESTS)
    marks = {name for name, has in _RUNGS.items() if has(rel)}
    marks |= set(re.findall(r"^pytestmark = \[?pytest\.mark\.(\w+)\b", path.read_text(), re.M))
    return frozenset(marks)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A test module whose every test ``-m`` leaves out is not even imported (``make test-fast``):
    importing the op table's generated cases imports torch's op databases (``op_db``, ``module_db``),
    others schemathesis or a model zoo, seconds in each xdist worker, only for the cases to be deselected."""
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and _leaves_out(config.getoption("markexpr"), _module_marks(collection_path))):
        return True
    return None


@functools.cache
def _leaves_out(markexpr: str, marks: frozenset[str]) -> bool:
    """Whether ``markexpr`` deselects every test that has ``marks``, whatever other marks it has."""
    if not markexpr or not marks:
        return False
    # pytest's own reading of ``-m``, a private module: should a later pytest move or change it, every
    # module is collected as before (slower, never wrong), rather than the collection failing
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
        others = sorted(set(re.findall(r"[A-Za-z_]\w*", markexpr)) - marks - {"and", "or", "not"})
        for values in itertools.product((False, True), repeat=len(others)):
            has = marks | {name for name, on in zip(others, values) if on}
            if expression.evaluate(lambda name, **kwargs: name in has):
                return False
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
    return True


def _backend_of(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return str(callspec.params.get("server_url", "")) if callspec else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in _module_marks(item.path) & _RUNGS.keys():
            item.add_marker(name)
        if "ray" in _backend_of(item):
            item.add_marker("ray")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``make test``'s workers (pytest-xdist, ``-n``) share the tests out as ``workers.Grouped`` says."""
    if config.getvalue("dist") in ("load", "loadgroup"):
        from .workers import Grouped

        return Grouped(config, log)
    return None


def _in_process(request: pytest.FixtureRequest) -> bool:
    """Whether this test's SDK session goes to the app in this process (see the module's docstring)."""
    rel = request.node.path.resolve().relative_to(TESTS)
    return (rel.parts[0] in ("client", "ops") and request.node.get_closest_marker("backends") is None
            and "server_url" not in request.fixturenames)


class _Shared(httpx.BaseTransport):
    """One in-process app for many sessions: a session closes its transport, this one stays up."""

    def __init__(self, transport: client.InProcessTransport) -> None:
        self.transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.transport.handle_request(request)
        check_answer(request, response)  # what every client/ops test reads holds to proto/schema.json
        return response

    def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def in_process_app() -> Iterator[client.InProcessTransport]:
    """The service's app in this process, with its default settings. Not the test-only ops: they
    would join this process's op table for good, and the client's tests compare this process's
    table with a default server's."""
    transport = client.InProcessTransport()
    yield transport
    transport.close()


def _connect(request: pytest.FixtureRequest, **options) -> client.Session:
    if _in_process(request):
        return client.connect(transport=_Shared(request.getfixturevalue("in_process_app")), **options)
    return client.connect(request.getfixturevalue("server_url"), **options)


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
def tenants_server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The shared server's settings with every tenant (here the one open one) in a worker process of its own.
    Those are the default settings (``REMOTE_AUTOGRAD_TENANT_PROCESSES=on``) since every server runs its
    tenants so: then it is the shared server itself, not a second one just like it (a front and a worker:
    seconds of each xdist worker's time)."""
    if Settings.from_env({}).per_tenant_processes():
        yield request.getfixturevalue("inprocess_server_url")
        return
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
def sess(request: pytest.FixtureRequest) -> Iterator[client.Session]:
    """A pipelined SDK session on the shared server."""
    with _connect(request) as s:
        yield s


@pytest.fixture
def eager_sess(request: pytest.FixtureRequest) -> Iterator[client.Session]:
    with _connect(request, pipeline=False) as s:
        yield s


@pytest.fixture(params=["pipelined", "eager"])
def any_sess(request: pytest.FixtureRequest) -> Iterator[client.Session]:
    """Both modes: the same test must pass in each."""
    with _connect(request, pipeline=request.param == "pipelined") as s:
        yield s


PROTOCOL_HEADERS = {"Remote-Autograd-Protocol": "1"}


@pytest.fixture
def http(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """A raw httpx client on the shared server, with the protocol header set."""
    if _in_process(request):
        where = {"transport": _Shared(request.getfixturevalue("in_process_app")), "base_url": client.IN_PROCESS_URL}
    else:
        where = {"base_url": request.getfixturevalue("server_url"), "event_hooks": {"response": [response_hook]}}
    with httpx.Client(headers=PROTOCOL_HEADERS, timeout=30, **where) as c:
        yield c


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """dynamo's caches emptied around a torch.compile test: a function compiled in one test must not be
    found by the next, whose session (and device) is another."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()

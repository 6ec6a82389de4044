"""Every backend is a ``SessionBackend``: the methods the routes call exist on each, with the
protocol's parameters and kinds (a coroutine where the protocol awaits, an async context manager
for ``answer_program``). The Ray backend's module imports ray, an extra the test suite installs."""

from __future__ import annotations

import importlib
import inspect

import pytest

from remote_autograd.service.backends.protocol import SessionBackend

# by name, imported by the test: importing ray at collection costs each worker seconds
BACKENDS = {"LocalSessions": "local_sessions", "TenantProcesses": "tenant_processes", "RaySessions": "ray_sessions"}

METHODS = [name for name, member in vars(SessionBackend).items()
           if callable(member) and not name.startswith("_")]


def _kind(function) -> str:
    function = inspect.unwrap(function)  # answer_program is wrapped by asynccontextmanager
    if inspect.isasyncgenfunction(function):
        return "async context"
    return "async" if inspect.iscoroutinefunction(function) else "plain"


def test_the_protocol_names_what_the_routes_call():
    assert set(METHODS) >= {"create_session", "describe_session", "delete_session", "check_session",
                            "answer_program", "read_tensor", "health", "readiness", "start", "close"}


@pytest.mark.parametrize("backend_name", list(BACKENDS))
@pytest.mark.parametrize("name", METHODS)
def test_each_backend_implements_the_protocol(backend_name, name):
    module = importlib.import_module(f"remote_autograd.service.backends.{BACKENDS[backend_name]}")
    backend = getattr(module, backend_name)
    wanted = getattr(SessionBackend, name)
    given = getattr(backend, name, None)
    assert given is not None, f"{backend.__name__} lacks {name}"
    assert list(inspect.signature(given).parameters) == list(inspect.signature(wanted).parameters)
    expected = "async context" if name == "answer_program" else _kind(wanted)
    assert _kind(given) == expected, f"{backend.__name__}.{name} is {_kind(given)}, the protocol's is {expected}"

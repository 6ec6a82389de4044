"""Defaults derived from the machine, and the worker process per tenant as the default (issue 31)."""

from __future__ import annotations

import pytest

from remote_autograd.service.settings import HOST_MEMORY_FRACTION, Settings, host_memory_bytes


def _mem_total() -> int:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))


def test_the_default_byte_limit_is_a_part_of_the_hosts_memory_on_a_cpu_server():
    """Before: 32 GiB whatever the machine (on a 24 GiB host, more than it has)."""
    assert 0 < host_memory_bytes() <= _mem_total()
    total = Settings(device="cpu").max_total_bytes
    assert total == int(host_memory_bytes() * HOST_MEMORY_FRACTION) < _mem_total()
    assert Settings(device="cpu", tokens=("a", "b")).max_bytes_per_token == total // 4  # a token's share of it
    assert Settings(device="cpu", max_total_bytes=12345).max_total_bytes == 12345  # a setting wins
    assert Settings.from_env({"REMOTE_AUTOGRAD_MAX_TOTAL_BYTES": "777"}, device="cpu").max_total_bytes == 777


def test_a_worker_process_per_tenant_is_the_default_with_one_token_or_none():
    assert Settings().per_tenant_processes() and Settings(tokens=("a",)).per_tenant_processes()
    assert Settings(tenant_processes="auto").per_tenant_processes()  # the old default's name: a worker too
    assert not Settings(tenant_processes="off").per_tenant_processes()
    with pytest.raises(ValueError, match="use on or off"):
        Settings(tenant_processes="sometimes").per_tenant_processes()

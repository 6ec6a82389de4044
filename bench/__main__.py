"""``python -m bench [SECTION ...]`` (or ``make bench``): start a real server on loopback and print every figure."""

from __future__ import annotations

import argparse
import contextlib
import os

from . import (bulk, compile, gpu, latency, ray_backend, real_model, runner_overhead, same_machine, step_cost,
               tenant_processes, training, user_functions, wan)
from ._util import serve

SECTIONS = {"latency": latency.run, "training": training.run, "model": real_model.run, "compile": compile.run,
            "runner": runner_overhead.run, "bulk": bulk.run, "ray": ray_backend.run,
            "tenants": tenant_processes.run, "wan": wan.run, "same_machine": same_machine.run, "gpu": gpu.run,
            "cost": step_cost.run, "functions": user_functions.run}
WITHOUT_LOOPBACK_SERVER = {"runner", "tenants", "wan", "same_machine", "gpu", "cost"}  # in process, or servers of their own


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=f"any of {list(SECTIONS)} (default: all)")
    names = parser.parse_args().sections or list(SECTIONS)
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        parser.error(f"no section {', '.join(unknown)}: choose from {', '.join(SECTIONS)}")
    with contextlib.ExitStack() as servers:
        url = None
        if set(names) - WITHOUT_LOOPBACK_SERVER:
            url = servers.enter_context(serve(["-m", "remote_autograd.service"]))
        print(f"remote-autograd benchmarks{f' against {url}' if url else ''} (medians and p90 over repeated runs; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start)")
        for name in names:
            SECTIONS[name](url)


if __name__ == "__main__":
    main()

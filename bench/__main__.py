"""``python -m bench`` (or ``make bench``): start a real server on loopback and print every figure."""

from __future__ import annotations

import argparse

from . import bulk, latency, ray_backend, real_model, runner_overhead, tenant_processes, training
from ._util import serve

SECTIONS = {"latency": latency.run, "training": training.run, "model": real_model.run,
            "runner": runner_overhead.run, "bulk": bulk.run, "ray": ray_backend.run,
            "tenants": tenant_processes.run}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=f"any of {list(SECTIONS)} (default: all)")
    args = parser.parse_args()
    with serve(["-m", "remote_autograd.service"]) as url:
        print(f"remote-autograd benchmarks against {url} (medians and p90 over repeated runs)")
        for name in args.sections or list(SECTIONS):
            SECTIONS[name](url)


if __name__ == "__main__":
    main()

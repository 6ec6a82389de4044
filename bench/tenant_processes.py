"""The per-tenant worker process beside the single process: what the hop between front and worker costs.

The same server twice, with ``REMOTE_AUTOGRAD_TENANT_PROCESSES=off`` (sessions in the
front's process) and ``on`` (the caller's sessions in a worker process of their own,
behind ``service/backends/tenant_channel.py``): an eager op and an MLP training step, through the
same SDK, measured in alternating rounds (a busy moment of the machine then hits both),
and 16 MiB up and back.
"""

from __future__ import annotations

import contextlib

import torch

from remote_autograd import client

from ._util import measure, row, serve, summary
from .ray_backend import _bulk, _mlp_step

ROUNDS = 5
MODES = ("one process", "per tenant")


def run(url: str) -> None:
    print("\n[tenants] a worker process per tenant (REMOTE_AUTOGRAD_TENANT_PROCESSES=on) beside one process")
    a, b = torch.randn(16), torch.randn(16)
    with serve(["-m", "remote_autograd.service"], {"REMOTE_AUTOGRAD_TENANT_PROCESSES": "off"}) as single, \
            serve(["-m", "remote_autograd.service"], {"REMOTE_AUTOGRAD_TENANT_PROCESSES": "on"}) as tenants, \
            contextlib.ExitStack() as sessions:
        eager, step = {}, {}
        for label, where in zip(MODES, (single, tenants)):
            sess = sessions.enter_context(client.connect(where, pipeline=False))
            x, y = sess.tensor(a), sess.tensor(b)
            sess.sync()
            eager[label] = lambda x=x, y=y: x + y
            step[label] = _mlp_step(where, sessions)
            _bulk(sess, label)
        for name, fns, repeat in (("eager x + y", eager, 200), ("MLP 64x784 step (SGD, loss.item())", step, 30)):
            times = {label: [] for label in MODES}
            for _ in range(ROUNDS):
                for label in MODES:
                    times[label] += measure(fns[label], repeat=repeat, warmup=repeat // 10)
            base = row(f"one process: {name}", times["one process"])
            row(f"per tenant: {name}", times["per tenant"], base)
            print(f"  {'':<48} the hop: +{summary(times['per tenant'])[0] - base:.0f} us a request")

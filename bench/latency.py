"""Per-op latency: a 16-element add, eager and pipelined through the SDK, beside the floor and local torch."""

from __future__ import annotations

import itertools

import torch

import client
from client._transport import Transport

from ._util import measure, row, serve


def run(url: str) -> None:
    print("\n[latency] 16-element float32 add")
    a, b = torch.randn(16), torch.randn(16)
    local = row("local torch.add", measure(lambda: torch.add(a, b), repeat=2000, warmup=200))

    with serve(["-m", "bench.floor_app"]) as floor_url:
        t = Transport(floor_url)
        body = {"id": "p", "steps": [{"kind": "call", "op": "add", "args": [{"ref": "a"}, {"ref": "b"}],
                                      "out": ["c"]}]}
        floor = row("floor: bare FastAPI msgpack endpoint (same transport)",
                    measure(lambda: t.request("POST", "/echo", body)), local)
        t.close()

    with client.connect(url, pipeline=False) as sess:
        x, y = sess.tensor(a), sess.tensor(b)
        sess.sync()
        ids = itertools.count()
        path = sess._path + "/programs"
        empty = row("  an empty program (same transport)", measure(
            lambda: sess._transport.request("POST", path, {"id": f"empty-{next(ids)}", "steps": []}, big=False)), local)
        eager = row("SDK eager: x + y (one request each)", measure(lambda: x + y), local)
        print(f"  {'':<48} eager / floor = {eager / floor:.2f}x   (target <= 1.3x; torch RPC over TCP: 297 us)")
        print(f"  {'':<48} over the floor: {empty - floor:.0f} us the program route and worker hop, "
              f"{eager - empty:.0f} us the op and the SDK")

    with client.connect(url) as sess:
        x, y = sess.tensor(a), sess.tensor(b)
        sess.sync()
        chain = 100

        def pipelined():
            z = x
            for _ in range(chain):
                z = z + y
            sess.sync()

        row(f"SDK pipelined: x + y amortised over a chain of {chain}", measure(pipelined, repeat=60, warmup=5,
                                                                              per=chain), local)

        def enqueue_only():
            z = x
            for _ in range(chain):
                z = z + y
            sess._queue.clear()
            sess._origins.clear()

        row("  of which client-side step building", measure(enqueue_only, repeat=60, warmup=5, per=chain), local)

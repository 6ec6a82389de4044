"""Per-op latency: a 16-element add, eager and pipelined through the SDK, beside the floor and local torch."""

from __future__ import annotations

import time

import torch

from remote_autograd import client
from remote_autograd.client.transport import _embedded as embedded
from remote_autograd.client.transport._transport import Transport

from . import _hot
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

    tap = _hot.Tap()
    with client.connect(url, pipeline=False, transport=tap) as sess, _hot.recording(tap) as programs:
        x, y = sess.tensor(a), sess.tensor(b)
        sess.sync()
        empty = row("  an empty program (same transport)", measure(_hot.empty_program(sess)), local)
        eager = row("SDK eager: x + y (one request each)", measure(lambda: x + y), local)
        print(f"  {'':<48} eager / floor = {eager / floor:.2f}x   (target <= 1.3x; torch RPC over TCP: 297 us)")
        print(f"  {'':<48} over the floor: {empty - floor:.0f} us the program route and worker hop, "
              f"{eager - empty:.0f} us the op and the SDK")
        eager_programs = [p for p in programs() if p["steps"]]  # the two puts, then the adds (not the empty ones)
        sdk_us = _hot.median_us(_hot.client_alone(tap, sess, lambda: x + y, 300))
        server_us = _hot.median_us(_hot.server_alone(eager_programs, 300))
        print(f"  {'':<48} the op alone, warm caches: SDK {sdk_us:.1f} us + server in process {server_us:.1f} us "
              f"(over the empty program in the round trip: {eager - empty:.0f} us)")

    started = time.perf_counter()
    embedded_url = embedded.embedded_url()  # what connect() with no URL talks to
    started = time.perf_counter() - started
    with client.connect(embedded_url, pipeline=False) as sess:
        x, y = sess.tensor(a), sess.tensor(b)
        sess.sync()
        embedded_eager = row("SDK eager, embedded server (connect(), no URL)", measure(lambda: x + y), local)
        print(f"  {'':<48} embedded / separate server = {embedded_eager / eager:.2f}x   (target <= 1.5x; "
              f"its first start took {started:.1f} s)")

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

"""Server overhead per op inside a program: runner time minus the time of the torch work itself."""

from __future__ import annotations

import subprocess
import sys

import torch

from remote_autograd.proto import encode_body, encode_tensor
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.ops import OP_TABLE
from remote_autograd.service.engine.runner import run_steps
from remote_autograd.service.settings import Settings
from remote_autograd.service.sessions.store import SessionStore

from ._util import measure, row


def run(url: str | None = None) -> None:
    print("\n[runner] server overhead per op (in-process: a program of 200 adds on 16-element tensors)")
    settings = Settings()
    store = SessionStore(settings)
    session = store.create()
    setup = {"id": "setup", "steps": [
        {"kind": "put", "id": "a", "value": encode_tensor(torch.randn(16)), "requires_grad": True},
        {"kind": "put", "id": "b", "value": encode_tensor(torch.randn(16))},
    ]}
    run_steps(session, validate_program(setup), settings)
    n = 200
    steps = [{"kind": "call", "op": "add", "args": [{"ref": "a"}, {"ref": "b"}], "out": [f"c{i}"]} for i in range(n)]
    steps.append({"kind": "free", "ids": [f"c{i}" for i in range(n)]})
    program = validate_program({"id": "p", "steps": steps})
    runner = measure(lambda: run_steps(session, program, settings), repeat=50, warmup=5, per=n)
    add = OP_TABLE.get("add").fn
    a, b = session.tensors["a"].value, session.tensors["b"].value
    direct = measure(lambda: [add(a, b) for _ in range(n)], repeat=50, warmup=5, per=n)
    raw = measure(lambda: [torch.add(a, b) for _ in range(n)], repeat=50, warmup=5, per=n)
    r = row("runner, per call step (incl. the op)", runner)
    d = row("the op's Function called directly", direct)
    row("torch.add itself (no autograd Function)", raw)
    print(f"  {'runner overhead per op':<48} {r - d:9.1f} us   (target <= 20 us)")
    # As the SDK sends it (omit_known_meta): no metadata built for outputs the client named, and
    # an answer of nulls to encode
    lean = validate_program({"id": "p", "steps": steps, "omit_known_meta": True})
    for label, prog in (("runner + msgpack answer, per call step", program), ("  the same, omit_known_meta", lean)):
        answer = lambda prog=prog: encode_body(run_steps(session, prog, settings).body, True)  # noqa: E731
        row(label, measure(answer, repeat=50, warmup=5, per=n))
    # the same program each time is a repeated one: its calls are checked from the session's plan
    # (service/engine/program_plan.py); REMOTE_AUTOGRAD_REPLAY=off checks each call's layouts again
    plain = Settings(replay="off")
    for label, s in (("runner, omit_known_meta, replayed plan", settings),
                     ("  the same, REMOTE_AUTOGRAD_REPLAY=off", plain)):
        row(label, measure(lambda s=s: run_steps(session, lean, s), repeat=50, warmup=5, per=n))
    body = {"id": "q", "steps": steps}
    row("validating the program, per step", measure(lambda: validate_program(body), repeat=50, warmup=5,
                                                    per=len(steps)))
    full_collection_rows()


# A server process's start, then a full collection timed before and after service/gc_freeze.py's
# freeze: what the collector walks there stalls whichever program is running.
_FULL_COLLECTION = """
import gc, time
from remote_autograd.service.http.app import create_app
from remote_autograd.service.gc_freeze import freeze_startup_objects

def full():
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1e6

create_app()
print(len(gc.get_objects()), min(full() for _ in range(3)), freeze_startup_objects(), min(full() for _ in range(3)))
"""


def full_collection_rows() -> None:
    out = subprocess.run([sys.executable, "-c", _FULL_COLLECTION], capture_output=True, text=True, timeout=300,
                         check=True).stdout.split()
    objects, plain, frozen, after = int(out[0]), float(out[1]), int(out[2]), float(out[3])
    print(f"  {'a full collection in a server process':<48} {plain:9.0f} us   ({objects} objects walked)")
    print(f"  {'  the same, startup objects frozen':<48} {after:9.0f} us   ({frozen} frozen: service/gc_freeze.py)")

"""``freeze_startup_objects``: a full collection walks only what came after it, and still frees that;
what torch loads on a first program was loaded before it.

Run in a child process: freezing pins every object alive, which the test process must not do
to itself.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a server process's start in a child

_CHILD = """
import gc, time, weakref
from remote_autograd.service.http.app import create_app
from remote_autograd.service.gc_freeze import freeze_startup_objects

create_app()  # a server process's start: torch, the op table, FastAPI
frozen = freeze_startup_objects()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the start: only the collector frees it
gone = weakref.ref(a)
del a, b
gc.collect()
walked = len(gc.get_objects())

# a session (as one restored before the freeze would be) goes without the collector once deleted
import torch
from remote_autograd.proto import encode_tensor
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine.runner import run_steps
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.service.settings import Settings

settings = Settings()
store = SessionStore(settings)
session = store.create()
gc.collect()
before = len(gc.get_objects())
# the process's first program: its ops' runs on meta load nothing more of torch (it was loaded before the freeze)
first = run_steps(session, validate_program({"id": "p", "steps": [
    {"kind": "put", "id": "w", "value": encode_tensor(torch.ones(4)), "requires_grad": True},
    {"kind": "call", "op": "sin", "args": [{"ref": "w"}], "out": ["s"]},
    {"kind": "call", "op": "sum", "args": [{"ref": "s"}], "out": ["l"]},
    {"kind": "backward", "tensors": ["l"]}]}), settings)
assert first.status == 200, first.body
gc.collect()
grown = len(gc.get_objects()) - before
held, sid = weakref.ref(session.tensors["w"].value), session.id
del session
gc.disable()
store.delete(sid)
print(frozen, walked, gone() is None, held() is None, grown)
"""


def test_startup_objects_are_frozen_later_cycles_still_collected_and_a_deleted_session_freed():
    """And what torch loads on first use is loaded before the freeze: a process's first program adds no
    modules' worth of objects for the collector to walk (it added 117,000 when torch loaded dynamo then)."""
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=True)
    frozen, walked, collected, session_freed, grown = out.stdout.split()
    assert int(frozen) > 50_000  # the start's objects
    assert int(walked) < 1_000  # what a full collection still walks
    assert collected == "True"
    assert session_freed == "True"
    assert int(grown) < 5_000, "a first program imported more of torch after the freeze"

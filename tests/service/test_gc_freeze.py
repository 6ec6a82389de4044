"""``freeze_startup_objects``: a full collection walks only what came after it, and still frees that.

Run in a child process: freezing pins every object alive, which the test process must not do
to itself.
"""

from __future__ import annotations

import subprocess
import sys

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
print(frozen, len(gc.get_objects()), gone() is None)
"""


def test_startup_objects_are_frozen_and_later_cycles_still_collected():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=True)
    frozen, walked, collected = out.stdout.split()
    assert int(frozen) > 50_000  # the start's objects
    assert int(walked) < 1_000  # what a full collection still walks
    assert collected == "True"

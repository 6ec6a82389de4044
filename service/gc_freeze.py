"""``freeze_startup_objects``: what a server process made while starting is kept out of the collector's walks.

A speed path. The plain path it stands in for is Python's cyclic garbage collector left as
it is: a full collection walks every container object the process holds, and a server
process holds a few hundred thousand from its start alone (torch, the op table, FastAPI,
pydantic's validators), none of which will ever be garbage. A full collection comes
whenever enough objects have lived through two younger ones (a training loop's sessions,
plans and memos grow the old generation), and it stops the whole process for as long as
the walk takes: the program running at that moment, whichever tenant's, answers that much
later. ``gc.freeze`` moves every object alive now into a generation no collection walks, so
a full collection walks only what was made after the start. Objects made later are
collected as before. A frozen object is still freed when its last reference goes; only a
cycle of frozen objects would stay, and startup objects are there for the process's life.
(Sessions restored from the state volume before the freeze are frozen with them: a session
and its tensors go by reference counting when it is deleted, without the collector.)

torch loads much of itself on first use: the first run on meta of one of its Python references
or decompositions (the meta check's first call of almost any op, ``sin`` too; a factory's
``arange``) imports ``torch._dynamo`` and the symbolic-shapes machinery, about 117,000 objects.
Left to the first program, they were made after the freeze (a full collection walked them
again: 73 ms after a first GPT step) and that program waited a second for them. So they are imported before the freeze, as part of the start
(``_load_what_torch_loads_on_first_use``); a process's start takes that second instead.

Only in processes the server owns (``python -m remote_autograd.service``, a tenant's worker
process, a Ray worker actor): never in a process that merely embeds the app
(``InProcessTransport`` in a user's notebook), whose objects are not ours to pin.
``tests/service/test_gc_freeze.py`` checks that a process still collects what it makes
afterwards; ``make bench``'s ``[runner]`` section prints a full collection's time before and
after.
"""

from __future__ import annotations

import gc
import importlib
import logging

log = logging.getLogger(__name__)

# What torch imports on the first run of a Python reference or decomposition (``torch._compile``'s
# wrapper around them imports dynamo; shape checks import the symbolic shapes), by name.
_LOADED_ON_FIRST_USE = ("torch._dynamo", "torch.fx.experimental.symbolic_shapes")


def freeze_startup_objects() -> int:
    """Collect what the start left as garbage, then freeze what is alive; how many objects are frozen."""
    _load_what_torch_loads_on_first_use()
    gc.collect()  # garbage of the start is freed, not pinned
    gc.freeze()
    return gc.get_freeze_count()


def _load_what_torch_loads_on_first_use() -> None:
    for name in _LOADED_ON_FIRST_USE:
        try:
            importlib.import_module(name)
        except ImportError:  # another torch (a GPU host's own) may not have it: the start goes on
            log.warning("torch has no module %s: a first program may import what it needs instead", name)

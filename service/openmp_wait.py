"""A server whose clients share its cores does not spin: OpenMP's passive wait policy on loopback.

torch's intra-op threads (OpenMP: libgomp) keep spinning for a while after each parallel region, in
case another follows. On a machine of its own that saves a wake-up. Beside its client on the same
cores (the embedded default, ``make serve`` beside a notebook) the spinning threads took the cores
that the client and the server's own event loop needed next, and an MLP step that uploads its batch
took several times as long as the same step with the batch already on the device (``python -m bench
same_machine`` shows both, spinning and not).

A server that listens on loopback only has every client on its own machine, so it waits passively
(``OMP_WAIT_POLICY=PASSIVE``: an idle OpenMP thread sleeps at once, and the next parallel region
wakes it). A server that listens beyond loopback (a GPU host, the image's
``0.0.0.0``) starts as torch starts it: there the spinning is what the operator wants, and on a GPU
the server's steps barely use torch's CPU threads anyway. An operator's own ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT`` (libgomp's finer knob, which wins over the policy) is left as it is. The other
cure, fewer server threads (a core left to the client), measured no better than waiting passively on
two cores and would take a core from every large kernel of a CPU server: not done.

The runtime reads the variable once, when it loads with ``import torch``: ``settle`` runs before
that (``service/__main__.py``), and the embedded server is started with the variable in its
environment (``client/transport/_embedded.py``). Worker processes inherit it.
"""

from __future__ import annotations

import ipaddress
import os
from typing import MutableMapping

POLICY = "OMP_WAIT_POLICY"
_OPERATOR_KNOBS = (POLICY, "GOMP_SPINCOUNT")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def settle(host: str, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (this process's) for a server on ``host`` when it
    listens on loopback and the operator chose nothing; the policy it set, or None."""
    env = os.environ if environ is None else environ
    if not is_loopback(host) or any(knob in env for knob in _OPERATOR_KNOBS):
        return None
    env[POLICY] = "PASSIVE"
    return env[POLICY]

"""The remote-autograd SDK: ``connect`` to a server, then write ordinary torch code.

    with client.connect() as sess:
        w = sess.tensor(torch.randn(4, 2), requires_grad=True)
        loss = (x @ w).relu().sum(); loss.backward(); w.grad.to_torch()

The package's rooms are layered, lowest first: each subpackage (and each module at the top)
imports only from rooms below its own, at the top of the file (an ``if TYPE_CHECKING:`` import too);
inside a room, modules import each other without circles. ``tests/client/test_layers.py`` reads this
list and checks every import:

    wire:       transport/
    device:     device/
    session:    session/
    handle:     tensor/
    core:       _core
    outputs:    dispatch/
    handlers:   handlers/
    capture:    capture/
    by name:    _ops
    public:     _session
    package:    __init__

``_core`` is the SDK's core, one module because its parts are mutual: ``RemoteTensor``, the
session's queue of steps (``SessionCore``) and ``call_op``, the one builder of an op's step.
Below it, the pure pieces it imports: ``transport/`` speaks HTTP to a server; ``device/`` is
torch's ``remote`` device and its rules; ``session/`` the session's rules (op routes, the user's
line, torch's settings a program carries); ``tensor/`` what a handle keeps locally (views,
torch.compile's traced wrapper). Above it, what imports it: ``dispatch/`` the outputs' metadata
(inference) and a user's ``autograd.Function``; ``handlers/`` what a handle answers itself and the
device's factory kernels; ``capture/`` ``torch.compile(..., backend="remote")`` (loaded by its entry
point, never here: dynamo is slow to import); ``_session`` the public ``Session`` (uploads,
factories, ops by name) and ``_ops`` its ``sess.ops`` namespace.

Where the core calls something above it (the handlers, inference), it defines a table and the
module above fills it as it is imported (``_core``'s docstring lists them); this file only imports
the rooms whose import registers them, and wires nothing.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_core.py``: ``RemoteTensor``, ``SessionCore`` (the queue, ``flush``), ``call_op`` (an op's step), the
  tables the rooms above fill (``LOCAL_HANDLERS``, ``INFERENCE``)
- ``_session.py``: ``Session``, the public one: ``SessionCore`` plus uploads (``sess.tensor``), the contract's
  factories (``sess.zeros``, ...), seeds and weights
- ``_ops.py``: ``sess.ops.<name>``: any op of the table by name

The walk of one op, back from the server:

And back. The runner stores each output as a ``CustomTensor`` (``service/sessions/store.py``) under
the id the client chose, and answers its metadata (``{id, dtype, shape, requires_grad}``), except in the SDK's
programs: they set ``omit_known_meta`` (the SDK inferred it all), and only what the client cannot know comes
back (the outputs of an ``out_many`` call, which grads of an ``allow_unused`` grad are None, a backward's
``no_grad``); a ``fetch`` step answers the tensor's data (``service/engine/answers.py``,
``proto/codec.py``). A failing step stops the program: its answer carries the error and the results before
it (``service/engine/runner.py``, ``_as_protocol_error``). The route encodes the answer (msgpack, JSON or
framed) and sends it; ``SessionCore.flush`` hands each result to its step's origin, the SDK corrects the
metadata it had predicted, and ``item()`` decodes the fetched value (``proto/codec.py``, ``decode_tensor``)
into a Python number. A failed step raises ``RemoteError`` at the user's line that queued it.
"""

from __future__ import annotations

import os

import httpx
import torch

from . import dispatch, handlers  # their imports register into the core's tables (handlers, inference)
from ._core import RemoteTensor
from ._session import Session
from .transport._embedded import embedded_url
from .transport._errors import RemoteError, SessionLost
from .transport._inprocess import IN_PROCESS_URL, InProcessTransport
from .transport._transport import Transport

__all__ = ["InProcessTransport", "RemoteError", "RemoteTensor", "Session", "SessionLost", "connect", "grad"]


def connect(url: str | None = None, *, token: str | None = None, pipeline: bool = True, run_ahead: bool = True,
            timeout: float = 600.0, busy_wait: float = 60.0, transport: httpx.BaseTransport | None = None) -> Session:
    """A new session on ``url`` (or ``REMOTE_AUTOGRAD_URL``, or the embedded server when neither is set).

    ``token`` (or ``REMOTE_AUTOGRAD_TOKEN``) is sent as a bearer token. ``pipeline=False``
    sends every step at once and waits (strict eager mode, for debugging). ``run_ahead=False`` (or
    ``Session.run_ahead`` set later): a compiled step's request is answered only once its backward and
    optimizer ran, so their error raises at the ``.item()`` that sent them rather than at the next
    request, as ``CUDA_LAUNCH_BLOCKING=1`` does for CUDA's (``docs/compile.md``, running ahead). A request the server
    answers ``429`` (busy: too many programs or sessions at once) is resent with growing, jittered
    waits for up to ``busy_wait`` seconds before it raises.
    ``transport`` is the ``httpx.BaseTransport`` requests go through (closed with the
    session, as ``httpx.Client`` closes its own), e.g. ``InProcessTransport()`` for the
    service in this process without sockets; by default a tuned socket transport.
    """
    url = url or os.environ.get("REMOTE_AUTOGRAD_URL")
    if not url and transport is None:
        url = embedded_url()
    # A transport of your own with no URL: only the Host header and messages show it.
    return Session(Transport(url or IN_PROCESS_URL, token, timeout=timeout, busy_wait=busy_wait, transport=transport),
                   pipeline=pipeline, run_ahead=run_ahead)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None):
    """``torch.autograd.grad`` under our name; works on RemoteTensors (and on local tensors)."""
    return torch.autograd.grad(outputs, inputs, grad_outputs=grad_outputs, retain_graph=retain_graph,
                               create_graph=create_graph, allow_unused=allow_unused)

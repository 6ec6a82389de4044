"""The remote-autograd SDK: ``connect`` to a server, then write ordinary torch code.

    with client.connect() as sess:
        w = sess.tensor(torch.randn(4, 2), requires_grad=True)
        loss = (x @ w).relu().sum(); loss.backward(); w.grad.to_torch()

The package's rooms are layered, lowest first: each subpackage (and each module at the top)
imports only from rooms below its own, at the top of the file (an ``if TYPE_CHECKING:`` import,
for annotations only, may point anywhere); inside a room, modules import each other without
circles. ``tests/client/test_layers.py`` reads this list and checks every import:

    wire:       transport/
    device:     device/
    queue:      session/
    handle:     tensor/
    steps:      dispatch/
    handlers:   handlers/
    capture:    capture/
    by name:    _ops
    public:     _session
    wiring:     __init__

``transport/`` speaks HTTP to a server; ``device/`` is torch's ``remote`` device and its rules;
``session/`` the server session's queue of steps and op routes; ``tensor/`` the ``RemoteTensor``
handle and its shared-memory bookkeeping; ``dispatch/`` the one builder of steps (``call_op``);
``handlers/`` what a handle answers itself and the device's factory kernels; ``capture/``
``torch.compile(..., backend="remote")`` (loaded by its entry point, never here: dynamo is slow to
import); ``_session`` the
public ``Session`` (uploads, factories, ops by name) and ``_ops`` its ``sess.ops`` namespace.

``RemoteTensor.__torch_function__`` needs the handlers and dispatch, which sit above it
(they make and read RemoteTensors). So the tensor holds slots, and this file, the one
place that wires, fills them as the package is imported: Python runs a package's
``__init__`` before any of its modules can be used, so no one meets a half-wired tensor,
whichever module they import. It also registers the device kernels with torch's dispatcher.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_session.py``: ``Session``, the public one: ``SessionCore`` plus uploads (``sess.tensor``), the contract's
  factories (``sess.zeros``, ...), seeds and weights
- ``_ops.py``: ``sess.ops.<name>``: any op of the table by name

The walk of one op, back from the server:

And back. The runner stores each output as a ``CustomTensor`` (``service/sessions/custom_tensor.py``) under
the id the client chose, and answers its metadata (``{id, dtype, shape, requires_grad}``), except in the SDK's
programs: they set ``omit_known_meta`` (the SDK inferred it all), and only what the client cannot know comes
back (the outputs of an ``out_many`` call, which grads of an ``allow_unused`` grad are None, a backward's
``no_grad``); a ``fetch`` step answers the tensor's data (``service/engine/answers.py``,
``proto/tensors.py``). A failing step stops the program: its answer carries the error and the results before
it (``service/engine/runner.py``, ``_as_protocol_error``). The route encodes the answer (msgpack, JSON or
framed) and sends it; ``SessionCore.flush`` hands each result to its step's origin, the SDK corrects the
metadata it had predicted, and ``item()`` decodes the fetched value (``proto/tensors.py``, ``decode_tensor``)
into a Python number. A failed step raises ``RemoteError`` at the user's line that queued it.
"""

from __future__ import annotations

import os

import httpx
import torch

from ._session import Session
from .device import _autocast
from .dispatch import _dispatch, _user_functions
from .handlers import LOCAL_HANDLERS, _kernels
from .session import _callsite
from .tensor import _foreach, _tensor
from .tensor._tensor import RemoteTensor
from .transport._embedded import embedded_url
from .transport._errors import RemoteError, SessionLost
from .transport._inprocess import IN_PROCESS_URL, InProcessTransport
from .transport._transport import Transport

_tensor.wire(local_handlers=LOCAL_HANDLERS, call_op=_dispatch.call_op)
_kernels.register_kernels()
_autocast.pass_other_ops_through()  # a compiled region under torch.autocast("remote")
_callsite.ATTACH.append(_user_functions.attach)  # a user's Function on remote tensors: its backward on the server
_callsite.BEFORE_FORWARD.append(_user_functions.before_forward)  # undone as apply returns
_foreach.take_foreach_paths(RemoteTensor)  # torch's optimizers choose for sess.device what they choose for cuda

__all__ = ["InProcessTransport", "RemoteError", "RemoteTensor", "Session", "SessionLost", "connect", "grad"]


def connect(url: str | None = None, *, token: str | None = None, pipeline: bool = True,
            timeout: float = 600.0, busy_wait: float = 60.0, transport: httpx.BaseTransport | None = None) -> Session:
    """A new session on ``url`` (or ``REMOTE_AUTOGRAD_URL``, or the embedded server when neither is set).

    ``token`` (or ``REMOTE_AUTOGRAD_TOKEN``) is sent as a bearer token. ``pipeline=False``
    sends every step at once and waits (strict eager mode, for debugging). A request the server
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
                   pipeline=pipeline)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None):
    """``torch.autograd.grad`` under our name; works on RemoteTensors (and on local tensors)."""
    return torch.autograd.grad(outputs, inputs, grad_outputs=grad_outputs, retain_graph=retain_graph,
                               create_graph=create_graph, allow_unused=allow_unused)

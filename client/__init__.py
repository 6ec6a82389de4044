"""The remote-autograd SDK: ``connect`` to a server, then write ordinary torch code.

    with client.connect() as sess:
        w = sess.tensor(torch.randn(4, 2), requires_grad=True)
        loss = (x @ w).relu().sum(); loss.backward(); w.grad.to_torch()

The package's modules are layered, lowest first; each imports only from layers below its
own, at the top of the file (an ``if TYPE_CHECKING:`` import, for annotations only, may
point anywhere). ``tests/client/test_layers.py`` reads this list and checks every import:

    leaves:     _errors _routes _infer _views _http _progress _device _embedded
                _callsite _factory_outputs _handler_table _ops _backoff _device_rule
    on leaves:  _answer_body _banner _protocol_advice _unsupported _inprocess _autocast _caller_memo
    transport:  _transport
    queue:      _session_core
    tensor:     _tensor
    outputs:    _outputs
    memo:       _meta_memo
    dispatch:   _dispatch
    handlers:   _local _autograd _moves _packed _composites _copies _weights
    kernels:    _kernels
    session:    _session
    wiring:     __init__

``RemoteTensor.__torch_function__`` needs the handlers and dispatch, which sit above it
(they make and read RemoteTensors). So the tensor holds slots, and this file, the one
place that wires, fills them as the package is imported: Python runs a package's
``__init__`` before any of its modules can be used, so no one meets a half-wired tensor,
whichever module they import. It also merges the handler modules' tables (refusing a
callable claimed twice) and registers the device kernels with torch's dispatcher.
"""

from __future__ import annotations

import os

import httpx
import torch

from . import _autograd, _composites, _copies, _dispatch, _kernels, _local, _moves, _packed, _tensor
from .transport._embedded import embedded_url
from .transport._errors import RemoteError, SessionLost
from ._handler_table import merge
from .transport._inprocess import IN_PROCESS_URL, InProcessTransport
from ._session import Session
from ._tensor import RemoteTensor
from .transport._transport import Transport

_tensor.wire(local_handlers=merge(_local.HANDLERS, _autograd.HANDLERS, _moves.HANDLERS, _packed.HANDLERS,
                                  _composites.HANDLERS, _copies.HANDLERS),
             apply_route=_dispatch.apply_route)
_kernels.register_kernels()

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

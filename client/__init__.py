"""The remote-autograd SDK: ``connect`` to a server, then write ordinary torch code.

    with client.connect() as sess:
        w = sess.tensor(torch.randn(4, 2), requires_grad=True)
        loss = (x @ w).relu().sum(); loss.backward(); w.grad.to_torch()
"""

from __future__ import annotations

import os

import httpx
import torch

from ._errors import RemoteError, SessionLost
from ._inprocess import IN_PROCESS_URL, InProcessTransport
from ._session import Session
from ._tensor import RemoteTensor
from ._transport import Transport
from . import _composites, _kernels, _moves  # noqa: F401,E402  (register nn.init, the device kernels, .to/.cpu/.data handlers)

__all__ = ["InProcessTransport", "RemoteError", "RemoteTensor", "Session", "SessionLost", "connect", "grad"]


def connect(url: str | None = None, *, token: str | None = None, pipeline: bool = True,
            timeout: float = 600.0, transport: httpx.BaseTransport | None = None) -> Session:
    """A new session on ``url`` (or ``REMOTE_AUTOGRAD_URL``, or the embedded server when neither is set).

    ``token`` (or ``REMOTE_AUTOGRAD_TOKEN``) is sent as a bearer token. ``pipeline=False``
    sends every step at once and waits (strict eager mode, for debugging).
    ``transport`` is the ``httpx.BaseTransport`` requests go through (closed with the
    session, as ``httpx.Client`` closes its own), e.g. ``InProcessTransport()`` for the
    service in this process without sockets; by default a tuned socket transport.
    """
    url = url or os.environ.get("REMOTE_AUTOGRAD_URL")
    if not url and transport is None:
        from ._embedded import embedded_url

        url = embedded_url()
    # A transport of your own with no URL: only the Host header and messages show it.
    return Session(Transport(url or IN_PROCESS_URL, token, timeout=timeout, transport=transport), pipeline=pipeline)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None):
    """``torch.autograd.grad`` under our name; works on RemoteTensors (and on local tensors)."""
    return torch.autograd.grad(outputs, inputs, grad_outputs=grad_outputs, retain_graph=retain_graph,
                               create_graph=create_graph, allow_unused=allow_unused)

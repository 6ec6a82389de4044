"""``Session.module``: a copy of an ``nn.Module`` whose parameters and buffers live on the server.

The module's own ``forward`` runs unchanged on RemoteTensors. Parameters stay
``nn.Parameter``s (torch recognises a tensor subclass with ``_is_param``), so
optimizers, ``zero_grad`` and ``clip_grad_norm_`` see what they expect.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from ._session import Session


def remote_module(session: "Session", module: nn.Module) -> nn.Module:
    """Copy ``module`` and upload its parameters and buffers, all in one program."""
    from ._tensor import RemoteTensor

    remote = copy.deepcopy(module)
    uploaded: dict[int, RemoteTensor] = {}  # shared parameters stay shared

    def upload(t: torch.Tensor, *, param: bool) -> RemoteTensor:
        key = id(t)
        if key not in uploaded:
            grad = t.grad if param else None
            r = RemoteTensor._upload(session, t.detach(), requires_grad=param and t.requires_grad, grad=grad)
            if param:
                r._is_param = True
            uploaded[key] = r
        return uploaded[key]

    for mod in remote.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = upload(p, param=True)
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = upload(b, param=False)
    remote.register_state_dict_post_hook(_state_dict_to_local(session))
    session.sync()
    return remote


def _state_dict_to_local(session: "Session"):
    """A post-hook making ``state_dict()`` return local tensors, fetched in one program."""

    def hook(module, state_dict, prefix, local_metadata):
        from ._tensor import RemoteTensor

        keys = [k for k, v in state_dict.items() if isinstance(v, RemoteTensor)]
        values = session.fetch_many([state_dict[k] for k in keys])
        for k, v in zip(keys, values):
            state_dict[k] = v

    return hook

"""``Session``: the public session, with uploads, factories and ops by name.

It builds on ``SessionCore`` (``_session_core``: the server session and its queue of
steps), adding what makes tensors, which the core below the tensor type cannot do.
"""

from __future__ import annotations

from typing import Any

import torch

from remote_autograd.proto import decode_tensor

from .session._callsite import where
from .dispatch._dispatch import call_named
from ._ops import OpsNamespace
from .session._session_core import SessionCore, _Origin
from .tensor._tensor import RemoteTensor
from .transport._transport import Transport
from .handlers._weights import load_weights


class Session(SessionCore):
    """A session on a remote-autograd server. Use as a context manager, or call ``close()``."""

    def __init__(self, transport: Transport, *, pipeline: bool = True) -> None:
        super().__init__(transport, pipeline=pipeline)
        self.ops = OpsNamespace(self)

    # -- tensors --------------------------------------------------------------------------------

    def tensor(self, data: Any, *, dtype: torch.dtype | None = None, requires_grad: bool = False) -> "RemoteTensor":
        """Upload ``data`` (tensor, numpy array, list or number) as a new leaf."""
        if isinstance(data, torch.Tensor):
            t = data.detach()
            if dtype is not None:
                t = t.to(dtype)
        else:
            t = torch.as_tensor(data, dtype=dtype, device="cpu")  # local, even inside `with torch.device(...)`
        return RemoteTensor._upload(self, t, requires_grad=requires_grad, grad=None)

    def module(self, module: "torch.nn.Module") -> "torch.nn.Module":
        """``module.to(sess.device)``: moved in place (the same Parameter objects), one upload program."""
        return module.to(self.device)

    def optimizer(self, optimizer: "torch.optim.Optimizer") -> "torch.optim.Optimizer":
        """Kept for old code: ``optimizer.load_state_dict`` now moves state to ``param.device`` as torch does."""
        return optimizer

    def models(self) -> list[str]:
        """The safetensors files of the server's model directory that ``load_weights`` can name."""
        return [m["name"] for m in self._transport.call("GET", "/v1/models")["models"]]

    def load_weights(self, module: "torch.nn.Module", name: str, *, strict: bool = True):
        """Fill ``module`` (on ``sess.device``) from the server's file ``name`` (see ``models()``), as
        ``module.load_state_dict(safetensors.torch.load_file(name), strict=strict)``; returns its result."""
        return load_weights(self, module, name, strict=strict)

    def manual_seed(self, seed: int) -> None:
        """Seed this session's own generator (dropout and random factories draw from it)."""
        self._call_op("manual_seed", [int(seed)], {}, n_out=0)

    def rng_state(self) -> torch.Tensor:
        """The session generator's state as a uint8 CPU tensor (``torch.remote.get_rng_state``): one round trip."""
        tid = self.new_id()
        step = {"kind": "call", "op": "get_rng_state", "args": [], "out": [tid]}
        self.enqueue(step, _Origin("get_rng_state", where()))
        message = self.fetch(tid)
        self._free_later(tid)
        return decode_tensor(message["value"])

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Give the session's generator ``state``, what ``rng_state()`` returned (``torch.remote.set_rng_state``)."""
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise TypeError(f"set_rng_state: expected a torch.ByteTensor, but got {type(state).__name__}"
                            + (f" of dtype {state.dtype}" if isinstance(state, torch.Tensor) else ""))
        self._call_op("set_rng_state", [self.tensor(state.detach().cpu())], {}, n_out=0)

    # -- ops by name (factories, custom ops) ---------------------------------------------

    def _call_op(self, name: str, args: list, kwargs: dict, n_out: int | None = None):
        return call_named(self, name, args, kwargs, n_out=n_out)

    def _factory(name: str, doc: str):  # noqa: N805  (builds methods below)
        def factory(self, *args, **kwargs):
            return self._call_op(name, list(args), kwargs)

        factory.__name__, factory.__doc__ = name, doc
        return factory

    zeros = _factory("zeros", "torch.zeros on the server.")
    ones = _factory("ones", "torch.ones on the server.")
    full = _factory("full", "torch.full on the server.")
    empty = _factory("empty", "torch.empty on the server, zeroed (never another session's memory).")
    arange = _factory("arange", "torch.arange on the server.")
    linspace = _factory("linspace", "torch.linspace on the server.")
    eye = _factory("eye", "torch.eye on the server.")
    rand = _factory("rand", "torch.rand on the server, from the session's generator.")
    randn = _factory("randn", "torch.randn on the server, from the session's generator.")
    randint = _factory("randint", "torch.randint on the server, from the session's generator.")
    del _factory

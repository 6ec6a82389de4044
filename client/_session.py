"""``Session``: the public session, with uploads, factories and ops by name.

It builds on ``SessionCore`` (``_core``: the server session and its queue of
steps), adding what makes tensors: uploads, the factories, seeds and weights. Its
factories are the op contract's (``proto/op_contract.FACTORIES``), one method each.
"""

from __future__ import annotations

from typing import Any

import torch

from remote_autograd.proto import decode_tensor
from remote_autograd.proto.op_contract import FACTORIES, RANDOM_FACTORIES
from remote_autograd.proto.messages import CallStep

from ._core import RemoteTensor, SessionCore, call_op
from ._ops import OpsNamespace
from .handlers._weights import load_weights
from .session._steps import Origin, make_step, where
from .transport._transport import Transport


class Session(SessionCore):
    """A session on a remote-autograd server. Use as a context manager, or call ``close()``."""

    def __init__(self, transport: Transport, *, pipeline: bool = True, run_ahead: bool = True) -> None:
        super().__init__(transport, pipeline=pipeline, run_ahead=run_ahead)
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

    def models(self) -> list[str]:
        """The safetensors files of the server's model directory that ``load_weights`` can name."""
        return [m["name"] for m in self._transport.call("GET", "/v1/models")["models"]]

    def load_weights(self, module: "torch.nn.Module", name: str, *, strict: bool = True):
        """Fill ``module`` (on ``sess.device``) from the server's file ``name`` (see ``models()``), as
        ``module.load_state_dict(safetensors.torch.load_file(name), strict=strict)``; returns its result."""
        return load_weights(self, module, name, strict=strict)

    def manual_seed(self, seed: int) -> None:
        """Seed this session's own generator (dropout and random factories draw from it)."""
        call_op(self, "manual_seed", [int(seed)], {}, n_out=0)

    def rng_state(self) -> torch.Tensor:
        """The session generator's state as a uint8 CPU tensor (``torch.remote.get_rng_state``): one round trip."""
        tid = self.new_id()
        self.enqueue(make_step(CallStep, op="get_rng_state", args=[], out=[tid]), Origin("get_rng_state", where()))
        message = self.fetch(tid)
        self._free_later(tid)
        return decode_tensor(message["value"])

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Give the session's generator ``state``, what ``rng_state()`` returned (``torch.remote.set_rng_state``)."""
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise TypeError(f"set_rng_state: expected a torch.ByteTensor, but got {type(state).__name__}"
                            + (f" of dtype {state.dtype}" if isinstance(state, torch.Tensor) else ""))
        call_op(self, "set_rng_state", [self.tensor(state.detach().cpu())], {}, n_out=0)


def _factory(name: str):
    def factory(self: Session, *args, **kwargs) -> RemoteTensor:
        return call_op(self, name, args, kwargs)

    notes = {"empty": ", zeroed (never another session's memory)"}
    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"``torch.{name}`` on the server{notes.get(name, '')}" + (
        ", from the session's generator." if name in RANDOM_FACTORIES else ".")
    return factory


for _name in FACTORIES:  # sess.zeros(2, 3), sess.randn(4): the contract's factories, by name
    setattr(Session, _name, _factory(_name))
del _name

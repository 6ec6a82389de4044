"""torch's own answer to the same job, for the ``wan`` section: ``torch.distributed.rpc`` with
``dist_autograd`` and ``DistributedOptimizer``, the model held by a peer process.

``python -m bench.torch_peer --master HOST:PORT --ifname IF`` is rank 0, the peer that holds the
models (its store is the rendezvous); the measuring client is rank 1 (``join``). A training step
is the way torch's tutorials write one: the forward and the loss run on the peer through one
``rpc_sync``, ``dist_autograd.backward`` sends the gradient back to it, and the distributed
optimizer steps the parameters where they live.

TensorPipe is held to its TCP transport and its basic channel: its shared-memory transport and
its CMA channel would move bytes between two processes on one host without touching the link.
"""

from __future__ import annotations

import argparse
import os
import warnings
from typing import Callable

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.optim import DistributedOptimizer
from torch.nn import functional as F

PEER, CLIENT = "peer", "client"
RPC_TIMEOUT_S = 120


def join(rank: int, master: str, ifname: str) -> None:
    """Join the two-process RPC group as ``rank`` (0 the peer, 1 the client), TCP only, over ``ifname``."""
    # TensorPipe advertises the address of this interface (else the one of the host's name, which a fresh
    # network namespace does not have)
    os.environ["TP_SOCKET_IFNAME"] = os.environ["GLOO_SOCKET_IFNAME"] = ifname
    _quiet_torch_deprecations()
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{master}", rpc_timeout=RPC_TIMEOUT_S,
                                              _transports=["uv"], _channels=["basic"])
    rpc.init_rpc(PEER if rank == 0 else CLIENT, rank=rank, world_size=2, rpc_backend_options=options)


_TORCH_NOTICES = ("You are using a Backend", "`TorchScript` support for functional optimizers")


def _quiet_torch_deprecations() -> None:
    """torch's notices about its own RPC internals are not the bench's to print. One of them is shown under
    ``simplefilter("always")``, past any filter, so the printing itself leaves them out."""
    shown = warnings.showwarning

    def showwarning(message, *args, **kwargs):
        if not str(message).startswith(_TORCH_NOTICES):
            shown(message, *args, **kwargs)

    warnings.showwarning = showwarning


# Each model's optimizer, as both sides of the ``wan`` section build it: the model section's AdamW in
# one group for the GPT (torch's distributed optimizer has no groups), the training section's SGD.
OPTIMIZERS: dict[str, tuple[type, dict]] = {
    "gpt": (torch.optim.AdamW, {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1}),
    "mlp": (torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
}


def build_model(name: str) -> torch.nn.Module:
    """The model ``name`` ("mlp" or "gpt"), from its fixed seed."""
    from .real_model import build_gpt
    from .training import _mlp

    return build_gpt() if name == "gpt" else _mlp()


def model_loss(name: str, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of model ``name`` on a batch: the GPT's own, the MLP's cross-entropy."""
    if name == "gpt":
        return model(x, y)[1]
    return F.cross_entropy(model(x), y)


class Trainer:
    """Lives on the peer: one model, its loss for a batch, and RRefs of its parameters."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model = build_model(name)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return model_loss(self.name, self.model, x, y)

    def parameter_rrefs(self) -> list[rpc.RRef]:
        return [rpc.RRef(p) for p in self.model.parameters()]


def training_step(name: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[], float]:
    """One step on the peer's model ``name`` ("mlp" or "gpt"): forward and loss there, the distributed
    backward, the distributed optimizer's step, and the loss as a number."""
    trainer = rpc.remote(PEER, Trainer, args=(name,))
    kind, options = OPTIMIZERS[name]
    optimizer = DistributedOptimizer(kind, trainer.rpc_sync().parameter_rrefs(), **options)

    def step() -> float:
        with dist_autograd.context() as context:
            loss = trainer.rpc_sync().loss(x, y)
            dist_autograd.backward(context, [loss])
            optimizer.step(context)
        return loss.item()

    return step


def _numel(t: torch.Tensor) -> int:
    return t.numel()  # the tensor has arrived whole before a function of it runs


def upload(t: torch.Tensor) -> Callable[[], int]:
    """Send ``t`` to the peer (which keeps nothing) and wait for its answer."""
    return lambda: rpc.rpc_sync(PEER, _numel, args=(t,))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.torch_peer")
    parser.add_argument("--master", required=True, help="HOST:PORT of this peer's rendezvous store")
    parser.add_argument("--ifname", required=True, help="the interface TensorPipe listens on")
    args = parser.parse_args()
    join(0, args.master, args.ifname)
    rpc.shutdown()  # serves until the client shuts down too


if __name__ == "__main__":
    main()

"""torch.optim with remote parameters: loading saved optimizer state back onto the server.

torch moves loaded state with ``value.to(device=param.device)``; for a local tensor
and a RemoteTensor parameter that would silently make a meta tensor. ``prepare``
registers a load-state pre-hook that uploads such values instead, and a global
step pre-hook refuses to step an optimizer whose state went meta anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

if TYPE_CHECKING:
    from ._session import Session


def prepare(session: "Session", optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make ``optimizer.load_state_dict`` upload local state for remote parameters; returns it."""
    if not getattr(optimizer, "_remote_autograd_prepared", False):
        optimizer.register_load_state_dict_pre_hook(_upload_state(session))
        optimizer._remote_autograd_prepared = True
    return optimizer


def _upload_state(session: "Session"):
    def hook(optimizer, state_dict):
        from ._tensor import RemoteTensor

        params = [p for group in optimizer.param_groups for p in group["params"]]
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        by_id = dict(zip(ids, params))
        state = {}
        for pid, values in state_dict["state"].items():
            param = by_id.get(pid)
            remote = isinstance(param, RemoteTensor)
            state[pid] = {
                k: session.tensor(v.to(param.dtype) if v.is_floating_point() else v)
                if remote and isinstance(v, torch.Tensor) and not isinstance(v, RemoteTensor) and k != "step"
                else v
                for k, v in values.items()
            }
        return {**state_dict, "state": state}

    return hook


def _refuse_meta_state(optimizer, args, kwargs) -> None:
    for values in optimizer.state.values():
        for key, v in values.items():
            if isinstance(v, torch.Tensor) and type(v) is torch.Tensor and v.is_meta:
                raise RuntimeError(
                    f"optimizer state {key!r} is a meta tensor: local state was loaded for remote parameters. "
                    "Call sess.optimizer(opt) before opt.load_state_dict(...) so the state is uploaded."
                )


register_optimizer_step_pre_hook(_refuse_meta_state)

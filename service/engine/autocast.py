"""A call step under ``torch.autocast``: the op's inputs cast exactly as torch's autocast casts them.

Torch's autocast works at the dispatcher: for the ops on its lists it casts the
floating inputs (float32, float16, bfloat16; never float64) to the low dtype
(matmuls, linear, convolutions) or to float32 (reductions, losses, softmax...),
then runs the op; other ops run unchanged. A native entry (torch's own op, or a
torch composite such as ``multi_head_attention_forward``) therefore runs inside
``torch.autocast`` itself: torch casts op by op within it, exactly as locally.
Running our table's own
``autograd.Function`` entries inside an autocast region would not do that: their
forward would be cast op by op inside, and their backward would meet saved inputs
of another dtype. So an entry runs with autocast off, after its inputs are cast
at the entry's boundary, with differentiable casts as torch's autocast records them.

Which of the three an entry is ("low", "fp32", "none") is learned from torch
itself, once per entry, device type and dtype: the entry's torch reference runs
on its first sample under autocast, and the dtype of its result says which cast
torch applied. The probe never touches the process's random state.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from remote_autograd.proto import ErrorCode, ProtocolError

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)  # autocast leaves float64 and integers alone
_POLICIES: dict[tuple[str, str, torch.dtype], str] = {}


def autocast_dtype(name: str) -> torch.dtype:
    dtype = DTYPES.get(name)
    if dtype is None:
        raise ProtocolError(ErrorCode.OP_ERROR, f"autocast: dtype {name!r} is not supported; expected one of "
                            f"{sorted(DTYPES)}")
    return dtype


def run_autocast(entry, device: torch.device, dtype: torch.dtype, call: Callable[[list, dict], Any],
                 args: list, kwargs: dict) -> Any:
    """``call(args, kwargs)`` as torch's autocast would run ``entry``'s torch op on ``device``."""
    if entry.kind == "native":
        with torch.autocast(device_type=device.type, dtype=dtype):
            return call(args, kwargs)
    policy = _policy(entry, device, dtype)
    target = dtype if policy == "low" else torch.float32 if policy == "fp32" else None
    if target is not None:
        args, kwargs = _cast(args, target), {k: _cast(v, target) for k, v in kwargs.items()}
    with torch.autocast(device_type=device.type, enabled=False):
        return call(args, kwargs)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.dtype in _CASTABLE and value.dtype != dtype else value
    if isinstance(value, list):
        return [_cast(v, dtype) for v in value]
    if isinstance(value, tuple):
        return tuple(_cast(v, dtype) for v in value)
    return value


def _policy(entry, device: torch.device, dtype: torch.dtype) -> str:
    key = (entry.name, device.type, dtype)
    found = _POLICIES.get(key)
    if found is None:
        found = _POLICIES[key] = _probe(entry, device, dtype)
    return found


def _probe(entry, device: torch.device, dtype: torch.dtype) -> str:
    """"low" when torch's op gives ``dtype`` from float32 inputs under autocast, "fp32" when it gives
    float32 from ``dtype`` inputs, else "none" (also for entries without a torch reference or samples)."""
    if entry.reference is None or not entry.samples:
        return "none"
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        for given, want, policy in ((torch.float32, dtype, "low"), (dtype, torch.float32, "fp32")):
            try:
                args, kwargs = entry.samples[0].materialise(given, seed=0)
                args, kwargs = tree_map_only(torch.Tensor, lambda t: t.detach().to(device), (args, kwargs))
                with torch.autocast(device_type=device.type, dtype=dtype):
                    out = entry.reference(*args, **kwargs)
            except Exception:  # the op refuses this dtype: its probe says nothing
                continue
            floats = [o.dtype for o in tree_leaves(out) if isinstance(o, torch.Tensor) and o.dtype.is_floating_point]
            if floats and floats[0] == want:
                return policy
    return "none"

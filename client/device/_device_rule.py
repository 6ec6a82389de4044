"""torch's device rule beside remote tensors, as beside CUDA tensors: which local tensors an op may take.

A tensor of another device in an op raises torch's own "Expected all tensors to be on the same
device, but found at least two devices, remote:0 and cpu!"; a 0-d CPU tensor is allowed (torch
lets one join any device's op, as a scalar). torch itself takes CPU tensors beside another
device's in a few places, which are uploaded on purpose: index tensors (``x[idx]``), the value
of an assignment through a basic index (``x[0] = v`` is ``x[0].copy_(v)``), ``copy_``'s source,
the lengths and batch sizes of packed sequences, which torch keeps on the CPU, and CTC's lengths
(by position: each op's ``cpu_args`` in the server's table, ``GET /v1/ops``).
"""

from __future__ import annotations

from typing import Any

import torch


def mixed_devices(remote: torch.device, other: torch.device) -> RuntimeError:
    """torch's own error for tensors of two devices in one op (the remote one named first, as torch names
    the accelerator's first beside the CPU's: "cuda:0 and cpu")."""
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {remote} and "
                        f"{other}!")


def check_local(device: torch.device, t: torch.Tensor) -> None:
    """Refuse a local tensor beside ``device``'s tensors unless torch would take it: a 0-d CPU one."""
    if t.dim() > 0 or t.device.type != "cpu":
        raise mixed_devices(device, t.device)


def basic_index(idx: Any) -> bool:
    """Ints, slices, None and ``...`` only: ``x[idx] = v`` is then ``x[idx].copy_(v)``, which takes ``v`` from
    any device (an advanced index is ``index_put_``, which wants ``v`` on ``x``'s device unless it is 0-d)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    return all(i is None or i is Ellipsis or type(i) in (int, slice) for i in items)

"""torch's device rule beside remote tensors, as beside CUDA tensors: which local tensors an op may take.

A tensor of another device in an op raises torch's own "Expected all tensors to be on the same
device, but found at least two devices, remote:0 and cpu!"; a 0-d CPU tensor is allowed (torch
lets one join any device's op, as a scalar). torch itself takes CPU tensors beside another
device's in a few places, which are uploaded on purpose: index tensors (``x[idx]``), the value
of an assignment through a basic index (``x[0] = v`` is ``x[0].copy_(v)``), ``copy_``'s source,
the lengths and batch sizes of packed sequences, which torch keeps on the CPU, and CTC's lengths
(by position: each op's ``cpu_args`` in the server's table, ``GET /v1/ops``). Here too: an index
as torch reads it (``normalise_index``), and a ``device=`` keyword naming another device
(``check_same_device``).
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


def normalise_index(idx: Any) -> Any:
    """An index as torch reads it: a list of plain ints is an index tensor, any other list a tuple.

    On the server a list index always means a tuple, so the client sends advanced list
    indices (also inside tuples) as int64 tensors.
    """
    if isinstance(idx, list):
        idx = torch.tensor(idx) if all(type(i) is int for i in idx) else tuple(idx)
    if isinstance(idx, tuple):
        return tuple(normalise_index(i) if isinstance(i, list) else i for i in idx)
    return idx


def value_dependent_index(idx: Any) -> bool:
    """Bool masks and 0-d index tensors make getitem's output shape depend on values: ask the server."""
    items = idx if isinstance(idx, (tuple, list)) else (idx,)
    for i in items:
        if isinstance(i, torch.Tensor) and (i.dtype in (torch.bool, torch.uint8) or i.dim() == 0):
            return True
        if isinstance(i, list) and value_dependent_index(i):
            return True
    return False


def check_same_device(device: torch.device, name: str, asked: Any) -> None:
    """``zeros_like(x, device=...)`` and friends run on the session's ``device``: any other is refused, never
    ignored."""
    if torch.device(asked) != device and torch.device(asked) != torch.device(device.type):
        raise RuntimeError(f"{name}(..., device={asked}) of a remote tensor: it would be made on {device}; "
                           f"make it on {asked} from local values instead (e.g. torch.zeros(x.shape, device=...))")

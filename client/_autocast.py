"""``torch.autocast`` around remote ops: whether it applies to the server, and with which dtype.

A RemoteTensor's values live on the server's device, so an autocast enabled for
``"cuda"`` or for the SDK's own device type (PrivateUse1, named ``remote`` once the
device is registered) means the server's device: the step carries the dtype and the
server runs the op under ``torch.autocast`` on its own device type, with torch's own
per-op rules. ``autocast("cpu")`` leaves remote ops alone, as it leaves CUDA tensors
alone in torch. Result dtypes then follow the server's rules, so the client asks the
server for them (the step waits) instead of inferring them.
"""

from __future__ import annotations

import torch

_PRIVATEUSE1_NAME = torch._C._get_privateuse1_backend_name


def server_dtype() -> torch.dtype | None:
    """The autocast dtype that applies to remote ops here, or None when autocast does not apply."""
    if torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda")
    own = _PRIVATEUSE1_NAME()
    if torch.is_autocast_enabled(own):
        return torch.get_autocast_dtype(own)
    return None

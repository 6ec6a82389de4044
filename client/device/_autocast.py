"""``torch.autocast`` around remote ops: whether it applies to the server, and with which dtype.

As in torch, an autocast region applies to the tensors of its own device type: remote ops
are cast inside ``torch.autocast(device_type="remote", ...)`` (``device_type=device.type``
for ``device = sess.device``), whose dtypes the device module lists
(``get_amp_supported_dtype``: bfloat16 and float16). ``autocast("cpu")`` and
``autocast("cuda")`` leave remote ops alone, as they leave other devices' tensors alone in
torch. The step carries the dtype and the server runs the op under ``torch.autocast`` on
its own device type, with torch's own per-op rules. Result dtypes then follow the server's
rules, so the client asks the server for them (the step waits) instead of inferring them.
"""

from __future__ import annotations

import torch

from ._device import DEVICE_TYPE

_ANY_ENABLED = torch._C._is_any_autocast_enabled  # any device's autocast (ours among them)


def server_dtype() -> torch.dtype | None:
    """The autocast dtype that applies to remote ops here, or None when autocast does not apply."""
    if not _ANY_ENABLED():  # one look at torch's thread state for the common case: no autocast at all
        return None
    if torch.is_autocast_enabled(DEVICE_TYPE):
        return torch.get_autocast_dtype(DEVICE_TYPE)
    return None


_PASS_THROUGH: torch.library.Library | None = None  # kept alive once registered: dropping it unregisters it


def pass_other_ops_through() -> None:
    """Let every op without an autocast rule pass ``AutocastPrivateUse1``, as torch registers for CUDA itself.

    torch registers autocast's per-op rules for the PrivateUse1 key and leaves the other ops to the backend.
    Eager remote ops never reach that key (``__torch_function__`` answers them), but dynamo tracing a compiled
    region under ``torch.autocast("remote")`` runs fake tensors of the device through it, and stopped at the
    first op without a rule ("could not find kernel for aten.reshape.default at dispatch key
    AutocastPrivateUse1"). Called once, as this module is imported."""
    global _PASS_THROUGH
    if _PASS_THROUGH is None:
        _PASS_THROUGH = torch.library.Library("_", "IMPL", "AutocastPrivateUse1")
        _PASS_THROUGH.fallback(torch.library.fallthrough_kernel)


pass_other_ops_through()  # a compiled region under torch.autocast("remote")

"""The ``remote`` torch device: PrivateUse1 renamed, and which session each index means.

Importing the SDK registers PyTorch's PrivateUse1 backend under the name ``remote``
(``torch.utils.backend_registration``, pure Python), so ``torch.device("remote", k)``
exists and a RemoteTensor reports it as its ``device``. Each open session takes the
lowest free index ``k``; closing it frees the index. The registration is global to the
process, as every torch backend is; it fails loudly if another library already renamed
PrivateUse1.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

if TYPE_CHECKING:
    from ._session import Session

DEVICE_TYPE = "remote"


class _RemoteDeviceModule:
    """``torch.remote``: what torch asks of a device module (a device count, availability, rng calls).

    A remote tensor's device is a session; there is no "current" remote device and no
    client-side generator (random factories draw from the session's generator).
    """

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return max(_SESSIONS, default=-1) + 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        # torch.manual_seed(s) seeds every device's generator (CUDA's too); so it seeds each
        # open session's generator, as sess.manual_seed(s) does (a queued step, no round trip).
        if os.getpid() != _PID:  # a forked child (DataLoader workers seed themselves): the
            return  # sessions and their connections belong to the parent
        for ref in list(_SESSIONS.values()):
            session = ref()
            if session is not None and not session._closed:
                session.manual_seed(seed)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return []


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() == DEVICE_TYPE:
        return  # imported twice (reloads in tests): already ours
    _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_RemoteDeviceModule())


_register()

_SESSIONS: dict[int, "weakref.ReferenceType[Session]"] = {}
_PID = os.getpid()
_LOCK = threading.Lock()


def claim_index(session: "Session") -> torch.device:
    """The lowest free device index, now naming ``session``."""
    with _LOCK:
        k = 0
        while k in _SESSIONS and _SESSIONS[k]() is not None:
            k += 1
        _SESSIONS[k] = weakref.ref(session)
    return torch.device(DEVICE_TYPE, k)


def release_index(device: torch.device) -> None:
    with _LOCK:
        _SESSIONS.pop(device.index, None)


def session_for(device: torch.device | str | int | None, what: str) -> "Session":
    """The open session a ``remote`` device names; a clear error for any other index."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    index = 0 if device.index is None else device.index
    ref = _SESSIONS.get(index)
    session = ref() if ref is not None else None
    if session is None or session._closed:
        raise RuntimeError(
            f"{what}: device {device} is not an open remote-autograd session (each open session is "
            f"torch.device('remote', k); use sess.device)"
        )
    return session

"""The ``remote`` torch device: PrivateUse1 renamed, and which session each index means.

Importing the SDK registers PyTorch's PrivateUse1 backend under the name ``remote``
(``torch.utils.backend_registration``, pure Python), so ``torch.device("remote", k)``
exists and a RemoteTensor reports it as its ``device``. Each open session takes the
lowest free index ``k``; closing it frees the index. The registration is global to the
process, as every torch backend is; it fails loudly if another library already renamed
PrivateUse1.

A session here is the core's ``SessionCore`` (``client/_core.py``, above this module): it is held
and typed as ``Any`` so the device imports nothing of the core.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Any, Iterator

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

DEVICE_TYPE = "remote"


class _RemoteDeviceModule:
    """``torch.remote``: what torch asks of a device module (device count, rng state, autocast dtypes).

    A remote tensor's device is a session; there is no "current" remote device and no
    client-side generator: the rng calls read and write the session's generator on the server
    (``torch.random.fork_rng(device_type="remote")`` saves and restores it).

    ``is_available()`` answers False: torch asks the *current accelerator* (which a registered
    PrivateUse1 backend always is) whether it is available before it pins a ``DataLoader``'s
    batches, synchronises a benchmark timer or picks checkpointing's device, and the remote
    device has no local memory, streams or kernels for any of these. So local code in a process
    that imported the SDK does what it does on a CPU-only machine.
    """

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return max((k for k, ref in list(_SESSIONS.items()) if _open(ref)), default=-1) + 1

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
    def get_rng_state(device: torch.device | str | int = DEVICE_TYPE) -> torch.Tensor:
        """The session's generator state, as a uint8 CPU tensor (one round trip)."""
        return session_for(_as_device(device), "torch.remote.get_rng_state").rng_state()

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: torch.device | str | int = DEVICE_TYPE) -> None:
        """Give the session's generator ``new_state`` (what ``get_rng_state`` returned); queued."""
        session_for(_as_device(device), "torch.remote.set_rng_state").set_rng_state(new_state)

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [_RemoteDeviceModule.get_rng_state(k) for k in range(_RemoteDeviceModule.device_count())]

    @staticmethod
    def set_rng_state_all(new_states) -> None:
        for k, state in enumerate(new_states):
            _RemoteDeviceModule.set_rng_state(state, k)

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seed the current device's session (index 0), as ``torch.cuda.manual_seed`` seeds the current GPU."""
        session_for(_as_device(DEVICE_TYPE), "torch.remote.manual_seed").manual_seed(int(seed))

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
        """The dtypes ``torch.autocast(device_type="remote", dtype=...)`` takes: the server casts as CUDA's does."""
        return [torch.bfloat16, torch.float16]


def _as_device(device: torch.device | str | int) -> torch.device:
    """``device`` as torch's rng functions take it: an index, a name or a device, of the remote type."""
    if isinstance(device, int):
        return torch.device(DEVICE_TYPE, device)
    device = torch.device(device)
    if device.type != DEVICE_TYPE:
        raise RuntimeError(f"expected a {DEVICE_TYPE} device, got {device}")
    return device


def _open(ref: "weakref.ReferenceType[Any]") -> bool:
    session = ref()
    return session is not None and not session._closed


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() == DEVICE_TYPE:
        return  # imported twice (reloads in tests): already ours
    _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_RemoteDeviceModule())


_register()

_SESSIONS: dict[int, "weakref.ReferenceType[Any]"] = {}
_PID = os.getpid()
_LOCK = threading.Lock()


def claim_index(session: Any) -> torch.device:
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


_RECORDERS: dict[int, object] = {}  # device index -> what torch.compile's backend records a graph into


@contextlib.contextmanager
def recording_into(device: torch.device, recorder: object) -> Iterator[None]:
    """While the remote backend records a graph (``capture``), a factory naming ``device`` is recorded too."""
    _RECORDERS[device.index] = recorder
    try:
        yield
    finally:
        _RECORDERS.pop(device.index, None)


def session_for(device: torch.device | str | int | None, what: str) -> Any:
    """The open session a ``remote`` device names; a clear error for any other index."""
    device = torch.device(device) if not isinstance(device, torch.device) else device
    index = 0 if device.index is None else device.index
    if _RECORDERS and index in _RECORDERS:
        return _RECORDERS[index]  # type: ignore[return-value]
    ref = _SESSIONS.get(index)
    session = ref() if ref is not None else None
    if session is None or session._closed:
        raise RuntimeError(
            f"{what}: device {device} is not an open remote-autograd session (each open session is "
            f"torch.device('remote', k); use sess.device)"
        )
    return session

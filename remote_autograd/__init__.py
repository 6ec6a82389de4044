"""remote-autograd: PyTorch gradients computed on a remote GPU host.

One import name of our own holds three packages, mapped from the repository's
top-level folders by ``pyproject.toml`` (``package-dir``):

- ``remote_autograd.client``: the SDK (``connect``, ``Session``, ``RemoteTensor``);
- ``remote_autograd.service``: the server (``python -m remote_autograd.service``);
- ``remote_autograd.proto``: the wire format both share.

For notebooks the SDK's names are also here::

    import remote_autograd as ra
    with ra.connect() as sess:
        ...

They load on first use, so a server that imports ``remote_autograd.service``
never imports the SDK (nor httpx) through this file.

Beside them, ``_fill_buffer.py``: ``FillBuffer``, a body's memory filled as it arrives (the server and the
SDK read bodies into it; a speed path for a ``bytearray`` grown piece by piece).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SDK_NAMES = ("connect", "Session", "RemoteTensor", "RemoteError", "SessionLost", "grad", "InProcessTransport")
__all__ = [*_SDK_NAMES, "__version__"]


def __getattr__(name: str):
    if name in _SDK_NAMES:
        return getattr(importlib.import_module("remote_autograd.client"), name)
    raise AttributeError(f"module 'remote_autograd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)

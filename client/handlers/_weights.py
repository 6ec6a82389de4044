"""``sess.load_weights(model, name)``: a model on the remote device filled from a safetensors
file that is already on the server (its ``REMOTE_AUTOGRAD_MODEL_DIR``), so that a big model's
weights never cross the network.

The result is that of ``model.load_state_dict(safetensors.torch.load_file(path), strict)``
run locally, because it *is* torch's own ``load_state_dict``: the file's header
(``GET /v1/models/{name}``, one round trip) gives every tensor's key, dtype and shape; a
``load`` step makes one RemoteTensor per key on the server; torch's ``load_state_dict``
then checks keys and shapes with its own wording and copies each into the model's
parameter or buffer (``copy_`` steps); the loaded tensors are freed. The steps are sent
before the call returns, so any error is raised at the user's line.

While the copies run, the session holds the file's tensors besides the model's own (its
byte limits count them, as any tensor).
"""

from __future__ import annotations

import itertools
import weakref
from urllib.parse import quote

import torch

from remote_autograd.proto.dtypes import DTYPES
from remote_autograd.proto.messages import LoadStep

from .._core import RemoteTensor, SessionCore
from ..session._steps import Origin, make_step, where


def load_weights(session: SessionCore, module: torch.nn.Module, name: str, *, strict: bool = True):
    """What ``module.load_state_dict(load_file(name), strict=strict)`` returns: missing and unexpected keys."""
    for what, t in itertools.chain(module.named_parameters(), module.named_buffers()):
        if t.device != session.device:
            raise RuntimeError(
                f"load_weights fills a model on {session.device}, but {what} is on {t.device}: move the model "
                f"first (model.to(sess.device)) or build it under `with torch.device(sess.device):`")
    info = session._transport.call("GET", "/v1/models/" + _path_of(name))
    odd = [f"{t['key']} ({t['dtype']})" for t in info["tensors"] if t["dtype"] not in DTYPES]
    if odd:
        raise RuntimeError(f"{name} holds tensors of dtypes remote-autograd cannot hold: {', '.join(odd)}")
    loaded = {t["key"]: RemoteTensor._new(session, session.new_id(), tuple(t["shape"]), DTYPES[t["dtype"]])
              for t in info["tensors"]}
    step = make_step(LoadStep, file=name, tensors={key: r._id for key, r in loaded.items()})
    session.enqueue(step, Origin("load", where(), [weakref.ref(r) for r in loaded.values()]))
    try:
        return module.load_state_dict(loaded, strict=strict)  # torch's checks and copies
    finally:
        loaded.clear()  # the last references: their frees go with the steps below
        session.sync()


def _path_of(name: str) -> str:
    """``name`` as URL path segments. Dot segments are percent-encoded, so that the URL keeps them
    (a client would drop ``..`` from a path) and the server refuses such a name by its rule."""
    return "/".join("%2E" * len(part) if part in (".", "..") else quote(part, safe="") for part in name.split("/"))

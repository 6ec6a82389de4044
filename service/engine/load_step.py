"""The ``load`` step: new tensors read from a safetensors file of the model directory.

``{kind: "load", file, tensors: {key: id}}`` makes one leaf per key (``requires_grad``
false), as a ``put`` of the file's values would, without the bytes crossing the network.
The SDK's ``sess.load_weights`` then copies them into a model with torch's own
``load_state_dict`` and frees them. Atomic like every step: the name, the keys, the ids and
the limits are checked first, the file's bytes are counted before they are read, and the
tensors are stored all or none.
"""

from __future__ import annotations

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import LoadStep

from ..sessions.store import CustomTensor
from . import model_dir
from .values import ProgramRun, check_new_ids, meta_message, store_made


def load_step(run: ProgramRun, step: LoadStep) -> dict | None:
    session, settings = run.session, run.settings
    keys, ids = list(step.tensors), list(step.tensors.values())
    check_new_ids(session, ids)
    path = model_dir.resolve(settings.model_dir, step.file)
    sizes = model_dir.sizes(path, step.file, keys)
    for key, (numel, _) in zip(keys, sizes):
        if numel > settings.max_tensor_elements:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"{key!r} of {step.file!r} has {numel} elements: "
                                                     f"limit max_tensor_elements={settings.max_tensor_elements}")
    nbytes = sum(b for _, b in sizes)
    session.storages.charge(nbytes, settings.max_session_bytes)  # counted before a byte of it is read
    try:
        values = model_dir.read(path, step.file, keys, session.device)
    finally:
        session.storages.release(nbytes)  # store_made counts them again, as any step's outputs
    store_made(session, settings, [(tid, CustomTensor(v)) for tid, v in zip(ids, values)])
    return None if run.omit_known_meta else {"tensors": [meta_message(tid, v) for tid, v in zip(ids, values)]}

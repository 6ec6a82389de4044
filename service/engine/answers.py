"""What a program answers with: fetched tensors, and what the retry cache may keep of an answer."""

from __future__ import annotations

from typing import Any

import torch

from remote_autograd.proto import MSGPACK, ErrorCode, ProtocolError, decode_tensor, encode_body, encode_tensor
from remote_autograd.proto.codec import FRAME_MIN_BYTES, FRAMES, accepts_frames, extract_frames, pack_frames

from ..sessions.store import CustomTensor, ProgramAnswer


def reencode(outcome: ProgramAnswer, as_json: bool) -> ProgramAnswer:
    """A stored answer re-encoded for a retry that asks for the other format (JSON vs msgpack)."""
    results = []
    for r in outcome.body.get("results", []):
        if r and r.get("tensor"):
            msg = dict(r["tensor"])
            for key in ("value", "grad"):
                if msg.get(key) is not None:
                    msg[key] = encode_tensor(decode_tensor(msg[key]), as_json=as_json)
            r = {**r, "tensor": msg}
        results.append(r)
    return ProgramAnswer(outcome.status, {**outcome.body, "results": results}, outcome.seconds)


def tensor_message(tid: str, ct: CustomTensor, *, value: bool, grad: bool, as_json: bool, views: bool = True) -> dict:
    """A fetched tensor, encoded for the answer's format. With ``views``, binary data big enough
    to travel as a frame is a view of the tensor's bytes (no copy); it is encoded (msgpack) or
    streamed (frames) right after the program, before this session runs another. Smaller data
    is copied to bytes at once: msgpack copies it into the body anyway, and the retry cache
    (``keepable``) then has no view to copy out."""
    message = {"id": tid, "value": None, "grad": None, "requires_grad": ct.value.requires_grad}
    for key, t in (("value", ct.value if value else None), ("grad", ct.grad if grad else None)):
        if t is None:
            continue
        if t._is_zerotensor():  # torch's lazy zeros (sgn's gradient of a real input) have no memory to read
            t = torch.zeros(t.shape, dtype=t.dtype, device=t.device)
        message[key] = encode_tensor(t, as_json=as_json, as_view=views and not as_json and t.nbytes >= FRAME_MIN_BYTES)
    return message


_KEEP_FETCHED_BYTES = 1 << 20
# A JSON answer's values are a list of Python numbers: a float object and the list's pointer to it
_LIST_VALUE_BYTES = 32


def keepable(outcome: ProgramAnswer, program_id: str) -> ProgramAnswer:
    """What the retry cache may hold: fetched values are copied out of the live tensors,
    and an answer with more than 1 MiB of them is replaced by a 409 (fetch again).

    Binary data is a view (copied here) or, for small tensors, bytes already; JSON data is a
    list of numbers (counted as the memory it takes here) or base64 text; all of it counts.
    """
    results = outcome.body.get("results", [])
    data, text = _fetched(outcome.body)
    kept = sum(len(d) * _LIST_VALUE_BYTES if isinstance(d, list) else len(d) for d in text)
    if not data and not kept:
        return outcome
    if kept + sum(d.nbytes if isinstance(d, memoryview) else len(d) for d in data) > _KEEP_FETCHED_BYTES:
        err = ProtocolError(ErrorCode.CONFLICT, f"program {program_id!r} already ran; its answer held too much "
                            "fetched data to keep for a retry: fetch the tensors again")
        return ProgramAnswer(err.status, err.answer(program_id=program_id), outcome.seconds)
    if not any(isinstance(d, memoryview) for d in data):
        return outcome
    body = dict(outcome.body)
    body["results"] = [copy_views(r) if r and r.get("tensor") else r for r in results]
    return ProgramAnswer(outcome.status, body, outcome.seconds)


def encode_answer(body: dict, as_msgpack: bool, accept: str | None) -> tuple[str, list[bytes | memoryview], int]:
    """(media type, body parts, total length) of an answer: framed when it carries big tensors and
    the client accepts frames (they then go out of the tensors' own memory, never packed into one buffer)."""
    # only when the answer holds a fetched tensor big enough to travel as a frame (looked up directly:
    # ``extract_frames`` copies the whole answer while it searches)
    if as_msgpack and accepts_frames(accept) and any(
            memoryview(d).nbytes >= FRAME_MIN_BYTES for d in _fetched(body)[0]):
        header, frames = extract_frames(body, FRAME_MIN_BYTES)
        if frames:
            parts, total = pack_frames(header, frames)
            return FRAMES, parts, total
    data = encode_body(body, as_msgpack)
    return (MSGPACK if as_msgpack else "application/json"), [data], len(data)


def _fetched(body: dict) -> tuple[list, list]:
    """The ``data`` of every value and grad an answer carries (its fetched tensors': a program's results;
    or its own: ``GET /tensors`` answers one tensor message): the binary ones, and the JSON ones (lists
    of numbers, base64 text)."""
    messages = [r["tensor"] for r in body.get("results", ()) if r and r.get("tensor")]
    if "value" in body:
        messages.append(body)
    data = [m[k].get("data") for m in messages for k in ("value", "grad") if isinstance(m.get(k), dict)]
    return ([d for d in data if isinstance(d, (bytes, bytearray, memoryview))],
            [d for d in data if isinstance(d, (list, str))])


def copy_views(value: Any) -> Any:
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return {k: copy_views(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_views(v) for v in value]
    return value


# -- steps --------------------------------------------------------------------------------

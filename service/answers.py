"""What a program answers with: fetched tensors, and what the retry cache may keep of an answer."""

from __future__ import annotations

from typing import Any

from proto import ErrorCode, ProtocolError, decode_tensor, encode_tensor

from .custom_tensor import CustomTensor
from .store import Outcome


def reencode(outcome: Outcome, as_json: bool) -> Outcome:
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
    return Outcome(outcome.status, {**outcome.body, "results": results}, outcome.seconds)


def tensor_message(tid: str, ct: CustomTensor, *, value: bool, grad: bool, as_json: bool) -> dict:
    """A fetched tensor. Binary data is a view of the tensor's bytes (no copy); it is encoded
    (msgpack) or streamed (frames) right after the program, before this session runs another."""
    view = not as_json
    return {
        "id": tid,
        "value": encode_tensor(ct._custom_data, as_json=as_json, as_view=view) if value else None,
        "grad": (encode_tensor(ct._custom_grad, as_json=as_json, as_view=view)
                 if grad and ct._custom_grad is not None else None),
        "requires_grad": ct.requires_grad,
    }


_KEEP_FETCHED_BYTES = 1 << 20


def keepable(outcome: Outcome, program_id: str) -> Outcome:
    """What the retry cache may hold: fetched values are copied out of the live tensors,
    and an answer with more than 1 MiB of them is replaced by a 409 (fetch again)."""
    results = outcome.body.get("results", [])
    fetched = [r["tensor"] for r in results if r and r.get("tensor")]
    views = [m[k] for m in fetched for k in ("value", "grad")
             if m.get(k) is not None and isinstance(m[k].get("data"), memoryview)]
    if not views:
        return outcome
    if sum(v["data"].nbytes for v in views) > _KEEP_FETCHED_BYTES:
        err = ProtocolError(ErrorCode.CONFLICT, f"program {program_id!r} already ran; its answer held too much "
                            "fetched data to keep for a retry: fetch the tensors again")
        return Outcome(err.status, {"id": program_id, "error": err.to_wire(), "results": []}, outcome.seconds)
    body = dict(outcome.body)
    body["results"] = [_copy_views(r) if r and r.get("tensor") else r for r in results]
    return Outcome(outcome.status, body, outcome.seconds)


def _copy_views(value: Any) -> Any:
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return {k: _copy_views(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_views(v) for v in value]
    return value


# -- steps --------------------------------------------------------------------------------

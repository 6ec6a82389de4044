"""Every answer the suite's servers send, held to the published schema (``proto/schema.json``).

A client in another language validates what it reads against the schema file, not against our
pydantic models: a field the server sends that the file forbids makes such a client refuse every
answer of that kind. So the shared test transports (``conftest._Shared``, the ``http`` fixture,
``servers.api``) pass each answer through ``check_answer``, which validates its body against the
file's definition for its route and status (an error status: ``ErrorResponse``) and fails the
test that made the request, naming the route and the first violation.

Answers over ``MAX_CHECKED`` bytes are left out: they are the same messages with more tensor bytes,
and a test that streams one (reading it part by part) must not find it read already.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from typing import Any

import httpx
import jsonschema_rs
import msgpack

from remote_autograd.proto.codec import is_frames, unpack_frames
from remote_autograd.proto.schema import SCHEMA_PATH

MAX_CHECKED = 1 << 20

# (method, path, the message of a success answer): SPEC.md §2's routes
_ROUTES = [
    ("POST", r"/v1/sessions", "SessionCreated"),
    ("GET", r"/v1/sessions/[^/]+", "SessionInfo"),
    ("POST", r"/v1/sessions/[^/]+/programs", "ProgramResult"),
    ("GET", r"/v1/sessions/[^/]+/tensors/[^/]+", "TensorMessage"),
    ("GET", r"/v1/ops", "OpList"),
    ("GET", r"/v1/models", "ModelList"),
    ("GET", r"/v1/models/.+", "ModelInfo"),
    ("GET", r"/healthz", "Health"),
    ("GET", r"/readyz", "Readiness"),
]


def model_of(method: str, path: str, status: int) -> str | None:
    """The schema's name for this answer; None for answers outside the protocol (docs, metrics, 204s)."""
    if status >= 400:
        return "Readiness" if path == "/readyz" and status == 503 else "ErrorResponse"
    return next((model for m, pattern, model in _ROUTES if m == method and re.fullmatch(pattern, path)), None)


@cache
def _validator(model: str):
    """A compiled validator (jsonschema-rs: python's jsonschema takes 0.4 s on one OpList, this 1 ms)."""
    published = json.loads(SCHEMA_PATH.read_text())  # the file, as another language's client reads it
    return jsonschema_rs.validator_for({**published, "$ref": f"#/$defs/{model}"})


def _as_json(value: Any) -> Any:
    """A decoded msgpack message as its JSON twin: bin data (bytes, a frame's memoryview) is a string."""
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ""
    return value


def _decoded(content_type: str, body: bytes) -> Any:
    if is_frames(content_type):
        return _as_json(unpack_frames(bytearray(body)))
    if "msgpack" in content_type:
        return _as_json(msgpack.unpackb(body, raw=False, strict_map_key=False))
    return json.loads(body)


def check_answer(request: httpx.Request, response: httpx.Response) -> None:
    """Raise ``AssertionError`` if ``response``'s body breaks the published schema of its route."""
    length = response.headers.get("content-length", "")
    content_type = response.headers.get("content-type", "")
    if not length.isdigit() or not 0 < int(length) <= MAX_CHECKED:
        return
    if "json" not in content_type and "msgpack" not in content_type and not is_frames(content_type):
        return
    model = model_of(request.method, request.url.path, response.status_code)
    if model is None:
        return
    raw = response.read()
    seen = (model, hashlib.blake2b(raw, digest_size=16).digest())
    if seen in _PASSED:  # every session reads the same op table: it is checked once
        return
    body = _decoded(content_type, raw)
    error = next(_validator(model).iter_errors(body), None)
    if error is not None:
        where = "/".join(str(p) for p in error.instance_path) or "(the message)"
        raise AssertionError(f"{request.method} {request.url.path} answered {response.status_code} with a {model} "
                             f"that proto/schema.json refuses, at {where}: {error.message}")
    if len(_PASSED) < 10_000:
        _PASSED.add(seen)


_PASSED: set[tuple[str, bytes]] = set()  # (model, digest) of answers found valid


def response_hook(response: httpx.Response) -> None:
    """``check_answer`` as an ``httpx.Client`` event hook (``event_hooks={"response": [response_hook]}``)."""
    check_answer(response.request, response)

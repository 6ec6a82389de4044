"""The machine-readable descriptions match the code: proto/schema.json is current,
every message example in SPEC-examples.md is valid in both encodings, and /openapi.json
documents the raw-body routes with real schemas.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs  # the suite's validator (tests/answer_schema.py): python's jsonschema takes seconds to import
import msgpack
import pytest
import torch

from remote_autograd.proto import decode_tensor
from remote_autograd.proto.schema import SCHEMA_PATH, document, render

from ..answer_schema import check_answer, model_of

SPEC = Path(__file__).resolve().parents[2] / "proto" / "SPEC.md"
EXAMPLES = SPEC.with_name("SPEC-examples.md")  # every message in JSON and msgpack (SPEC.md §13)
# Shown inside another message's example instead of on their own.
EMBEDDED = {"Step": "Program", "Limits": "SessionCreated", "OpInfo": "OpList", "ModelFile": "ModelList",
            "ModelTensor": "ModelInfo", "TemplateInput": "TemplateStep", "TemplateScalar": "TemplateStep",
            "FunctionVariant": "FunctionStep"}


def test_schema_file_is_current():
    assert SCHEMA_PATH.read_text() == render(), "proto/schema.json is stale: run python -m remote_autograd.proto.schema --write"


def test_schema_file_is_valid_json_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema_rs.meta.validate(schema)


def _blocks(kind: str) -> dict[str, str]:
    """``<!-- KIND: Name -->`` followed by a fenced block in SPEC-examples.md: name -> block text."""
    found = re.findall(rf"<!-- {kind}: (\w+) -->\s*```\w*\n(.*?)```", EXAMPLES.read_text(), re.S)
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), f"duplicate {kind} examples"
    return dict(found)


def _validator(name: str) -> jsonschema_rs.Draft202012Validator:
    schema = {**document(), "$ref": f"#/$defs/{name}"}
    return jsonschema_rs.Draft202012Validator(schema)


def _tensors_to_torch(obj: Any) -> Any:
    """Replace every TensorData (list, base64 or bin form) with its tensor, so both encodings compare."""
    if isinstance(obj, dict):
        if set(obj) == {"dtype", "shape", "data"}:
            return ("tensor", obj["dtype"], decode_tensor(obj).tolist())
        return {k: _tensors_to_torch(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_tensors_to_torch(v) for v in obj]
    return obj


def _bytes_to_base64(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode()
    if isinstance(obj, dict):
        return {k: _bytes_to_base64(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_bytes_to_base64(v) for v in obj]
    return obj


def test_spec_has_a_json_and_a_msgpack_example_of_every_message():
    names = set(json.loads(SCHEMA_PATH.read_text())["$defs"]) - set(EMBEDDED)
    assert set(_blocks("message")) == names
    assert set(_blocks("msgpack")) == names
    assert set(EMBEDDED.values()) <= names


@pytest.mark.parametrize("name", sorted(_blocks("message")))
def test_spec_message_examples_are_valid_in_json_and_msgpack(name: str):
    as_json = json.loads(_blocks("message")[name])
    _validator(name).validate(as_json)
    hex_text = _blocks("msgpack")[name]
    as_msgpack = msgpack.unpackb(bytes.fromhex(re.sub(r"\s+", "", hex_text)), raw=False)
    _validator(name).validate(_bytes_to_base64(as_msgpack))  # bin travels as base64 in a JSON validator
    assert _tensors_to_torch(as_msgpack) == _tensors_to_torch(as_json)


def test_spec_annotated_tensor_bytes_decode_as_described():
    """§7's byte-by-byte msgpack TensorData: the first column of each line, concatenated."""
    block = re.search(r"<!-- annotated: TensorData -->\s*```text\n(.*?)```", SPEC.read_text(), re.S).group(1)
    raw = bytes.fromhex("".join(line.split("  ")[0] for line in block.splitlines() if line.strip()))
    message = msgpack.unpackb(raw, raw=False)
    assert torch.equal(decode_tensor(message), torch.tensor([1.0, 2.0]))


def test_openapi_documents_programs_with_the_protocol_schemas(server_url: str):
    api = httpx.get(server_url + "/openapi.json", timeout=30).json()
    schemas = api["components"]["schemas"]
    assert {"Program", "ProgramResult", "ErrorResponse", "SessionCreated", "TensorMessage"} <= set(schemas)
    post = api["paths"]["/v1/sessions/{sid}/programs"]["post"]
    for ctype in ("application/json", "application/msgpack"):
        assert post["requestBody"]["content"][ctype]["schema"] == {"$ref": "#/components/schemas/Program"}
        assert post["responses"]["200"]["content"][ctype]["schema"] == {"$ref": "#/components/schemas/ProgramResult"}
        assert post["responses"]["4XX"]["content"][ctype]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    created = api["paths"]["/v1/sessions"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert created == {"$ref": "#/components/schemas/SessionCreated"}
    # no operation documents a body as a bare object (or as nothing at all)
    for path, ops in api["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                for media in response.get("content", {}).values():
                    assert media["schema"] not in ({}, {"type": "object"}), (method, path, status, media)
    # every reference resolves
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', json.dumps(api)))
    assert refs <= set(schemas), refs - set(schemas)


# -- the suite's answers, held to the published file (tests/answer_schema.py) ------------------------


def test_every_documented_answer_has_its_schema_in_the_suites_check(server_url: str):
    """``answer_schema`` knows the message of every route and status /openapi.json documents, so no
    answer of the protocol escapes the check the whole suite runs."""
    api = httpx.get(server_url + "/openapi.json", timeout=30).json()
    documented = 0
    for path, ops in api["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method, op in ops.items():
            for status, response in op["responses"].items():
                ref = next(iter(response.get("content", {}).values()), {}).get("schema", {}).get("$ref")
                if ref is None or not status.isdigit():
                    continue
                documented += 1
                assert model_of(method.upper(), concrete, int(status)) == ref.rsplit("/", 1)[1], (method, path, status)
    assert documented >= 9


@pytest.mark.parametrize("ctype", ["application/json", "application/msgpack"])
def test_the_suites_check_refuses_an_answer_the_schema_forbids(ctype: str):
    created = {"session_id": "s", "protocol": "1", "device": "cpu", "server_version": "0", "gpu_name": None,
               "gpu_memory_bytes": None, "limits": {"max_body_bytes": 1, "max_steps_per_program": 1,
                                                    "max_tensor_elements": 1, "max_tensors_per_session": 1,
                                                    "max_session_bytes": 1, "session_ttl_seconds": 1.0}}
    request = httpx.Request("POST", "http://in-process/v1/sessions")
    for body, valid in ((created, True), ({**created, "surprise": 1}, False),
                        ({**created, "limits": {**created["limits"], "max_new_thing": 1}}, False)):
        content = json.dumps(body).encode() if "json" in ctype else msgpack.packb(body)
        response = httpx.Response(201, headers={"content-type": ctype}, content=content, request=request)
        if valid:
            check_answer(request, response)
        else:
            with pytest.raises(AssertionError, match="SessionCreated that proto/schema.json refuses"):
                check_answer(request, response)

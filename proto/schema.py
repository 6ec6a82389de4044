"""JSON Schema of every protocol message, generated from the pydantic models.

``proto/schema.json`` is this module's output, committed so that tools in other
languages can validate or generate code without Python; ``tests/proto/test_schema.py``
fails when it is stale. The same definitions fill the OpenAPI components
(``service/http/openapi.py``), so the SPEC, the schema file and ``/docs`` describe
one set of shapes.

    python -m remote_autograd.proto.schema --write   # regenerate proto/schema.json
    python -m remote_autograd.proto.schema --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from . import messages as m

SCHEMA_PATH = Path(__file__).resolve().parent / "schema.json"

# Every message, in the order of SPEC.md. Step is the tagged union of the step models.
MESSAGES: dict[str, Any] = {
    "Program": m.Program,
    "Step": m.Step,
    "PutStep": m.PutStep,
    "CallStep": m.CallStep,
    "BackwardStep": m.BackwardStep,
    "TensorHook": m.TensorHook,
    "GradStep": m.GradStep,
    "SetGradStep": m.SetGradStep,
    "ClearGradsStep": m.ClearGradsStep,
    "SetRequiresGradStep": m.SetRequiresGradStep,
    "RetainGradStep": m.RetainGradStep,
    "FreeStep": m.FreeStep,
    "FetchStep": m.FetchStep,
    "LoadStep": m.LoadStep,
    "TemplateStep": m.TemplateStep,
    "TemplateInput": m.TemplateInput,
    "TemplateScalar": m.TemplateScalar,
    "RunTemplateStep": m.RunTemplateStep,
    "FunctionStep": m.FunctionStep,
    "CheckpointStep": m.CheckpointStep,
    "CheckpointEndStep": m.CheckpointEndStep,
    "TensorData": m.TensorData,
    "TensorMeta": m.TensorMeta,
    "TensorMessage": m.TensorMessage,
    "StepResult": m.StepResult,
    "ProgramResult": m.ProgramResult,
    "ErrorBody": m.ErrorBody,
    "ErrorResponse": m.ErrorResponse,
    "Limits": m.Limits,
    "SessionCreated": m.SessionCreated,
    "SessionInfo": m.SessionInfo,
    "OpInfo": m.OpInfo,
    "OpList": m.OpList,
    "ModelList": m.ModelList,
    "ModelInfo": m.ModelInfo,
    "Health": m.Health,
    "Readiness": m.Readiness,
}


def definitions(ref_template: str = "#/$defs/{model}") -> dict[str, dict]:
    """Name -> JSON Schema for every message; references between them use ``ref_template``."""
    keyed = [(name, "validation", TypeAdapter(tp)) for name, tp in MESSAGES.items()]
    top, bundle = TypeAdapter.json_schemas(keyed, ref_template=ref_template)
    defs = dict(bundle.get("$defs", {}))
    for (name, _mode), schema in top.items():
        # A model's entry is a bare $ref to its own definition; the union (Step) is inline.
        if schema.get("$ref") != ref_template.format(model=name):
            defs[name] = schema
    return {name: defs[name] for name in sorted(defs)}


def document() -> dict:
    """The whole schema file: one ``$defs`` bundle, every message validatable by ``$ref``."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:remote-autograd:protocol:{m.PROTOCOL_VERSION}",
        "title": f"remote-autograd wire protocol {m.PROTOCOL_VERSION}",
        "description": "Every message of the protocol (see SPEC.md). Validate a message against "
        "{\"$ref\": \"schema.json#/$defs/<Name>\"}. In msgpack, TensorData.data is a bin; "
        "in JSON a flat list or a base64 string.",
        "protocol": m.PROTOCOL_VERSION,
        "$defs": definitions(),
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote_autograd.proto.schema", description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {SCHEMA_PATH.name}")
    action.add_argument("--check", action="store_true", help=f"exit 1 if {SCHEMA_PATH.name} is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        SCHEMA_PATH.write_text(text)
    elif args.check:
        current = SCHEMA_PATH.read_text() if SCHEMA_PATH.exists() else ""
        if current != text:
            print(f"{SCHEMA_PATH} is stale: run python -m remote_autograd.proto.schema --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""OpenAPI for routes that read and write raw bodies (msgpack or JSON).

The routes parse bodies themselves (one copy of tensor bytes, limits checked
before validation), so FastAPI cannot infer their schemas. ``route_doc``
gives a route decorator the request body, answers, protocol header and bearer
token as OpenAPI; ``install`` adds the message schemas of ``proto.schema`` (the
same definitions as ``proto/schema.json``) to the components, so ``/docs``
shows every body in both content types.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from remote_autograd.proto import JSON, MSGPACK, PROTOCOL_HEADER, PROTOCOL_VERSION

_REF = "#/components/schemas/{model}"
_SECURITY = "bearer"


def _content(model: str, ctypes: tuple[str, ...] = (JSON, MSGPACK)) -> dict:
    return {ctype: {"schema": {"$ref": _REF.format(model=model)}} for ctype in ctypes}


def route_doc(status: int, answer: str | None, *, body: str | None = None, v1: bool = True,
              extra: dict[int, str] | None = None) -> dict[str, Any]:
    """Decorator keywords (``responses``, ``openapi_extra``, ``response_model``) documenting one route.

    ``answer`` is the message model of the ``status`` answer (None: empty body), ``body``
    the request's, ``extra`` more statuses with their models. Routes under ``/v1``
    (``v1=True``) need the protocol header and, on a server with tokens, a bearer token;
    their failures are ``ErrorResponse`` bodies, and they answer in msgpack too; the
    others (health probes) answer JSON only.
    """
    ctypes = (JSON, MSGPACK) if v1 else (JSON,)
    responses: dict[int | str, dict] = {status: {"description": answer or "no content"}}
    if answer:
        responses[status]["content"] = _content(answer, ctypes)
    for code, model in (extra or {}).items():
        responses[code] = {"description": model, "content": _content(model, ctypes)}
    openapi_extra: dict[str, Any] = {}
    if v1:
        responses["4XX"] = {"description": "ErrorResponse: see SPEC.md §8 for codes and statuses",
                            "content": _content("ErrorResponse")}
        openapi_extra["parameters"] = [{
            "name": PROTOCOL_HEADER, "in": "header", "required": True,
            "schema": {"type": "string", "enum": [PROTOCOL_VERSION]},
            "description": "the protocol version the client speaks; a mismatch is 400 protocol_mismatch",
        }]
        openapi_extra["security"] = [{_SECURITY: []}, {}]  # a token, or none on a server without tokens
    if body:
        openapi_extra["requestBody"] = {"required": True, "content": _content(body),
                                        "description": f"{body} in JSON or msgpack (Content-Type)"}
    # response_model=None: the route writes its own body; nothing is inferred from annotations
    return {"responses": responses, "openapi_extra": openapi_extra, "response_model": None}


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the protocol's message schemas and the bearer scheme."""
    from remote_autograd.proto.schema import definitions

    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            components = schema.setdefault("components", {})
            components.setdefault("schemas", {}).update(definitions(_REF))
            components.setdefault("securitySchemes", {})[_SECURITY] = {
                "type": "http", "scheme": "bearer",
                "description": "one of REMOTE_AUTOGRAD_TOKENS; a session belongs to the token that made it",
            }
        return app.openapi_schema

    app.openapi = openapi

"""The app's exception handlers: every refusal is the protocol's error body (SPEC.md §8).

A ``ProtocolError`` raised by a route, a request FastAPI could not parse (a bad query
parameter), and Starlette's own 404/405 all answer ``{"error": {code, message}}``, in
msgpack or JSON as the request asked.
"""

from __future__ import annotations

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from remote_autograd.proto import ErrorCode, ProtocolError

from .replies import reply


async def protocol_error(request: Request, exc: ProtocolError) -> Response:
    return reply(request, exc.answer(), exc.status)


async def bad_parameters(request: Request, exc: RequestValidationError) -> Response:
    err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    where = ".".join(str(p) for p in err.get("loc", ())) or "request"
    return await protocol_error(request, ProtocolError(ErrorCode.BAD_REQUEST, f"{where}: {err.get('msg')}"))


async def framework_error(request: Request, exc: StarletteHTTPException) -> Response:
    code = ErrorCode.NOT_FOUND if exc.status_code == 404 else ErrorCode.BAD_REQUEST
    err = ProtocolError(code, f"{request.method} {request.url.path}: {exc.detail}")
    return reply(request, err.answer(), exc.status_code)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ProtocolError, protocol_error)
    app.add_exception_handler(RequestValidationError, bad_parameters)
    app.add_exception_handler(StarletteHTTPException, framework_error)

"""Error codes of the protocol and the one exception both sides raise for them.

Every failure on the wire is a status plus ``{error: {code, message, step, op}}``;
``ErrorCode`` fixes the code strings and the status each one answers with.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    """A stable machine-readable error code; ``status`` is its HTTP status."""

    BAD_REQUEST = "bad_request"
    PROTOCOL_MISMATCH = "protocol_mismatch"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    UNKNOWN_SESSION = "unknown_session"
    UNKNOWN_TENSOR = "unknown_tensor"
    UNKNOWN_OP = "unknown_op"
    UNKNOWN_MODEL = "unknown_model"  # no such file in the server's model directory
    UNKNOWN_TEMPLATE = "unknown_template"  # run_template of a template the session does not hold (send it again)
    CONFLICT = "conflict"
    SESSION_EXPIRED = "session_expired"
    SESSION_LOST = "session_lost"  # its Ray worker or node died; other sessions go on
    TOO_LARGE = "too_large"
    OP_ERROR = "op_error"
    TOO_MANY = "too_many"
    OUT_OF_MEMORY = "out_of_memory"
    TIME_LIMIT = "time_limit"  # a program ran past max_program_seconds: stopped between steps
    CANCELLED = "cancelled"  # its client disconnected while it ran: stopped between steps
    REQUEST_TIMEOUT = "request_timeout"  # a request's headers did not arrive within header_timeout_seconds
    HEADERS_TOO_LARGE = "headers_too_large"  # a request's line and headers over max_header_bytes

    @property
    def status(self) -> int:
        return _STATUS[self]


_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.PROTOCOL_MISMATCH: 400,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNKNOWN_SESSION: 404,
    ErrorCode.UNKNOWN_TENSOR: 404,
    ErrorCode.UNKNOWN_OP: 404,
    ErrorCode.UNKNOWN_MODEL: 404,
    ErrorCode.UNKNOWN_TEMPLATE: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.SESSION_EXPIRED: 410,
    ErrorCode.SESSION_LOST: 410,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.OP_ERROR: 422,
    ErrorCode.TOO_MANY: 429,
    ErrorCode.OUT_OF_MEMORY: 507,
    ErrorCode.TIME_LIMIT: 413,  # a quota, like the other limits a program can pass
    ErrorCode.CANCELLED: 409,  # seen only by a retry: the program's first run was stopped
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.HEADERS_TOO_LARGE: 431,
}


class ProtocolError(Exception):
    """A failure that has a place on the wire: a code, a message, and where it happened."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        step: int | None = None,
        op: str | None = None,
        forward: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.step = step
        self.op = op
        self.forward = forward  # a backward under anomaly detection: the step whose call made the failing node

    @property
    def status(self) -> int:
        return self.code.status

    def to_wire(self) -> dict:
        wire = {"code": self.code.value, "message": self.message, "step": self.step, "op": self.op}
        if self.forward is not None:
            wire["forward"] = self.forward
        return wire

    def answer(self, results: list | None = None, program_id: str | None = None) -> dict:
        """The protocol's error body: this error, the results of the steps before it, the program's id."""
        body = {"error": self.to_wire(), "results": results if results is not None else []}
        if program_id is not None:
            body = {"id": program_id, **body}
        return body

    def __repr__(self) -> str:
        return f"ProtocolError({self.code.value!r}, {self.message!r}, step={self.step}, op={self.op!r})"


def bad_request(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_REQUEST, message)

"""The SDK's exceptions: server errors keep their code, step and op."""

from __future__ import annotations


class RemoteError(RuntimeError):
    """A step failed on the server (or a tensor it would have made is used).

    ``code`` is the protocol's error code, ``status`` the HTTP status, ``step`` the
    index of the failing step in its program and ``op`` its op name.
    """

    def __init__(self, message: str, *, code: str = "error", status: int = 0, step: int | None = None,
                 op: str | None = None, where: str | None = None) -> None:
        self.server_message = message
        self.code, self.status, self.step, self.op, self.where = code, status, step, op, where
        text = message
        if op and where:
            text = f"{op} (called at {where}) failed: {message}"
        elif op:
            text = f"{op} failed: {message}"
        super().__init__(text)


class SessionLost(RemoteError):
    """The server no longer knows the session: it expired or was deleted, its worker died, or the
    server restarted without a state volume (or was killed: ``kill -9`` writes nothing).

    ``session_id`` names the lost session. The message always says what went with it and
    what to do next, after the server's own words (``server_message``).
    """

    def __init__(self, message: str, *, session_id: str | None = None, **kw) -> None:
        self.session_id = session_id
        name = f"session {session_id}" if session_id else "the session"
        advice = (f"{message}: {name} is gone on the server (it expired, was deleted, its worker died, or the server "
                  f"restarted without REMOTE_AUTOGRAD_STATE_DIR), "
                  f"and its tensors, their grads and its random generator state went with it. Open a new session "
                  f"(client.connect(...)) and load your last checkpoint (model.load_state_dict(...), "
                  f"optimizer.load_state_dict(...))")
        super().__init__(advice, **kw)
        self.server_message = message

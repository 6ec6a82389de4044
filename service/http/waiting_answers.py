"""``WaitingAnswers``: the bytes of answers waiting for slow readers, charged to their tokens while they wait.

An answer its client reads slower than the server writes it stays in this process until
it is read: the encoded answer (a fetched 256 MiB tensor, as the tenant's worker sent it)
and what the socket has not taken. Twelve slow readers of such a tensor held 3.4 GiB of
the front, memory every tenant shares. So when an answer has to wait for its reader (the
connection's writes pause: ``http_protocol``), what it still holds is charged to the
caller's token here, until the answer is all in the socket's hands or the connection is
gone. A token whose waiting answers hold ``max_bytes_per_token`` or more gets ``429`` for
its next program or tensor read (nothing runs; the SDK waits and sends it again) until its
readers catch up or are dropped: an answer read slower than ``min_answer_bytes_per_second``
is (``http_protocol``). An answer read as fast as it is written never waits, and costs
nothing here.
"""

from __future__ import annotations

from remote_autograd.proto import ErrorCode, ProtocolError


class WaitingAnswers:
    """Bytes held by answers waiting for their readers, per token (None: a server without tokens)."""

    def __init__(self, per_token: int) -> None:
        self.per_token = per_token
        self.held: dict[str | None, int] = {}

    def hold(self, owner: str | None, nbytes: int) -> None:
        self.held[owner] = self.held.get(owner, 0) + nbytes

    def release(self, owner: str | None, nbytes: int) -> None:
        left = self.held.get(owner, 0) - nbytes
        if left > 0:
            self.held[owner] = left
        else:
            self.held.pop(owner, None)

    def check(self, owner: str | None) -> None:
        """429 while ``owner``'s waiting answers hold its share (before a request that makes an answer)."""
        held = self.held.get(owner, 0)
        if held >= self.per_token:
            raise ProtocolError(ErrorCode.TOO_MANY, f"answers waiting for this token's readers hold {held} bytes: "
                                f"limit max_bytes_per_token={self.per_token}; read them (or close their "
                                "connections), then send this again")

"""Bearer tokens: who is calling. A session belongs to the token that created it.

With no tokens configured the server is open (and ``__main__`` keeps it on loopback);
with tokens, every path but ``PUBLIC_PATHS`` needs ``Authorization: Bearer <token>``,
``/openapi.json`` and the metrics included. Public: the two probes, and the ``/docs``
page with its Swagger UI files (they hold nothing of the server's; the page asks for
a token to read the API). A missing token and a wrong one get different messages, so a
user knows which to fix; neither names a token, and every wrong one reads the same.
"""

from __future__ import annotations

import hmac

from remote_autograd.proto import ErrorCode, ProtocolError

from .docs_page import PAGE_PATHS

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", *PAGE_PATHS})

# Both say where a token goes, for the SDK and for plain HTTP.
_WHERE = "(the Python SDK: connect(token=...) or REMOTE_AUTOGRAD_TOKEN; HTTP: Authorization: Bearer <token>)"
MISSING_TOKEN = f"missing bearer token: this server needs one of its tokens {_WHERE}"
WRONG_TOKEN = f"wrong bearer token: this server has no such token; check the one you send {_WHERE}"


METRICS_PATH = "/metrics"


class Tokens:
    """The configured tokens; ``owner`` maps an ``Authorization`` header to one of them.

    ``operator`` (``REMOTE_AUTOGRAD_METRICS_TOKEN``) is the operator's token: it is no tenant's,
    and with it ``/metrics`` shows everything. Without it, ``/metrics`` shows each token its own
    figures; a server with neither has one tenant, who sees everything.
    """

    def __init__(self, tokens: tuple[str, ...] | list[str], operator: str | None = None) -> None:
        self._tokens = tuple((t, t.encode()) for t in tokens if t)
        self._operator = operator.encode() if operator else None
        self.enabled = bool(self._tokens)  # without tokens ``owner`` is None for everyone

    def owner(self, authorization: bytes | None) -> str | None:
        """The caller's token, None when the server has none, or 401 ``unauthorized``.

        Every configured token is compared (in constant time), so the time taken
        does not say which token came close.
        """
        if not self._tokens:
            return None
        scheme, _, given = (authorization or b"").partition(b" ")
        given = given.strip()
        if scheme.lower() != b"bearer" or not given:  # no header, another scheme, or no token after it
            raise ProtocolError(ErrorCode.UNAUTHORIZED, MISSING_TOKEN)
        found = None
        for token, raw in self._tokens:
            if hmac.compare_digest(given, raw):
                found = token
        if found is None:
            raise ProtocolError(ErrorCode.UNAUTHORIZED, WRONG_TOKEN)
        return found

    def is_operator(self, authorization: bytes | None) -> bool:
        """Whether the caller may see every tenant's figures: it sent the operator token (compared in
        constant time), or the server has no tokens of either kind."""
        if self._operator is None:
            return not self._tokens
        scheme, _, given = (authorization or b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._operator)

"""The browser session of Ray's dashboard under ``/ray``: a signed cookie made
from a Raylane token.

Words:

- *sign in*: ``POST /v1/session`` with ``Authorization: Bearer <token>`` (the
  page at ``/ui`` does it when given a token). The answer sets the cookie.
- *session cookie*: ``raylane_session`` = the token's public id, signed with a
  timestamp (itsdangerous). HttpOnly (no script reads it), SameSite=Strict (no
  other site's page sends it), Secure when the request came over https, Path
  ``/ray`` (only the read-only proxy honours it: it never authenticates ``/v1``,
  so it cannot be used to act), Max-Age ``RAYLANE_SESSION_TTL_S``.

Invariants: the cookie holds no secret (a token id is public); it is honoured
only while its signature is valid, younger than the TTL, and its token live:
the token is read again on every request, so revoking it ends the session.
"""

from __future__ import annotations

import secrets

from itsdangerous import BadSignature, SignatureExpired, TimestampSigner

COOKIE = "raylane_session"
COOKIE_PATH = "/ray"
SALT = "raylane.ray-session"  # a key used for anything else never makes a valid cookie


class Sessions:
    def __init__(self, secret: str | None, ttl_s: float):
        # Unset: a random key of this process (documented: sign in again after a restart).
        self._signer = TimestampSigner(secret or secrets.token_urlsafe(32), salt=SALT)
        self.ttl_s = ttl_s

    def cookie_value(self, token_id: str) -> str:
        return self._signer.sign(token_id).decode()

    def token_id(self, value: str | None) -> str | None:
        """The token id a cookie value names, or None (forged, expired, malformed)."""
        if not value or len(value) > 256:
            return None
        try:
            return self._signer.unsign(value, max_age=self.ttl_s).decode()
        except (BadSignature, SignatureExpired, UnicodeDecodeError):
            return None

    def set_cookie_header(self, token_id: str, *, secure: bool) -> str:
        parts = [f"{COOKIE}={self.cookie_value(token_id)}", f"Path={COOKIE_PATH}", f"Max-Age={int(self.ttl_s)}",
                 "HttpOnly", "SameSite=Strict"]
        if secure:
            parts.append("Secure")
        return "; ".join(parts)

    @staticmethod
    def clear_cookie_header(*, secure: bool) -> str:
        parts = [f"{COOKIE}=", f"Path={COOKIE_PATH}", "Max-Age=0", "HttpOnly", "SameSite=Strict"]
        if secure:
            parts.append("Secure")
        return "; ".join(parts)


def cookie_from(scope) -> str | None:
    """The session cookie of an ASGI request, or None."""
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, _, v = part.strip().partition("=")
                if k == COOKIE:
                    return v
    return None

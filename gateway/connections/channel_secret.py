"""The Channel secret: what proves a client owns its Channel, because ``i`` does not.

The Channel-Identifier ``i`` is in every header an Application-Agent sees, in
the logs and in the event log, so knowing it proves nothing. Opening a Channel
issues a secret of 256 random bits (:func:`new_secret`, URL-safe base64 so that
it fits an ASBP header value, an HTTP header and a cookie unchanged). The broker
keeps only its SHA-256 digest (:func:`digest`), on the Channel and, on a bus
of many brokers, in the Channel's log (gateway.plane), so any broker can check
it; :func:`matches` compares digests in constant time. The secret itself is
written once, to the client that opened the Channel, and never to an agent, a
log line or the event log.

A digest, not a password hash: 256 random bits cannot be guessed, so a slow
hash would only slow every request down.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

from asbp.names import SECRET_HEADER, SECRET_KEY

__all__ = [
    "COOKIE_PREFIX",
    "HEADER",
    "SECRET_KEY",
    "cookie_name",
    "digest",
    "matches",
    "new_secret",
]

#: The HTTP request and response header that carries the secret.
HEADER: Final = SECRET_HEADER
#: Cookies are named ``asbp-<i>``: one per Channel, so a page may hold several.
COOKIE_PREFIX: Final = "asbp-"
#: Random bytes per secret (256 bits).
_BYTES: Final = 32


def new_secret() -> str:
    """A fresh secret: 256 random bits as 43 URL-safe base64 characters."""
    return secrets.token_urlsafe(_BYTES)


def digest(secret: str) -> bytes:
    """What the broker keeps of ``secret``."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def matches(presented: str | None, expected: bytes) -> bool:
    """Whether ``presented`` is the secret whose digest is ``expected`` (constant time)."""
    if presented is None or not expected:
        return False
    return hmac.compare_digest(digest(presented), expected)


def cookie_name(channel_id: str) -> str:
    """The cookie that carries the secret of ``channel_id``."""
    return COOKIE_PREFIX + channel_id

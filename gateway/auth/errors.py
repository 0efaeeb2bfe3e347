"""What can go wrong with Application-Agent credentials (gateway.auth.credentials).

::

    GatewayError                   (gateway.errors, under asbp.errors.AsbpError)
     ├── CredentialRefused   3101  a handshake refused; .reason: RefusalReason
     └── LocalError
          └── CredentialConfigError  start-up: a key or credentials config that
                                     cannot be loaded
"""

from __future__ import annotations

from enum import Enum

from asbp.faults import FaultCode
from gateway.errors import GatewayError, LocalError

__all__ = ["CredentialConfigError", "CredentialRefused", "RefusalReason"]


class RefusalReason(Enum):
    """Why a credential was refused; the value is stable for logs and metrics."""

    #: No credential was presented.
    MISSING = "missing"
    #: Not a compact JWS carrying JSON objects, or too long.
    MALFORMED = "malformed"
    #: The header's ``alg`` is not in the allow-list (HS*, "none", ...).
    ALGORITHM_NOT_ALLOWED = "algorithm_not_allowed"
    #: ``sub`` names no configured Application-Agent identity.
    UNKNOWN_IDENTITY = "unknown_identity"
    #: The identity has no key matching the header's ``kid`` and ``alg``.
    UNKNOWN_KEY = "unknown_key"
    #: No key of the claimed identity verifies the signature.
    BAD_SIGNATURE = "bad_signature"
    #: A required claim (sub, aud, exp, iat, jti) is absent.
    MISSING_CLAIM = "missing_claim"
    #: A claim has the wrong type or an impossible value.
    INVALID_CLAIM = "invalid_claim"
    #: ``iss`` is present and differs from ``sub``.
    WRONG_ISSUER = "wrong_issuer"
    #: ``aud`` does not contain this Broker's audience.
    WRONG_AUDIENCE = "wrong_audience"
    #: ``exp`` has passed (beyond the leeway).
    EXPIRED = "expired"
    #: ``iat`` or ``nbf`` lies in the future (beyond the leeway).
    NOT_YET_VALID = "not_yet_valid"
    #: ``exp - iat`` exceeds ``max_lifetime``.
    LIFETIME_TOO_LONG = "lifetime_too_long"
    #: This identity already presented this ``jti``.
    REPLAYED = "replayed"
    #: The replay cache is full of live entries; see :class:`JtiCache`.
    REPLAY_CACHE_FULL = "replay_cache_full"


class CredentialRefused(GatewayError):
    """The handshake credential is refused; no Command may flow.

    Attributes:
        reason: why, as a :class:`RefusalReason`.
        identity: the configured identity the credential claimed, or
            ``None`` when it named none (never an unverified string).
    """

    code = FaultCode.AUTHENTICATION_FAILED

    def __init__(self, reason: RefusalReason, message: str, *, identity: str | None = None) -> None:
        self.reason = reason
        self.identity = identity
        super().__init__(f"credential refused ({reason.value}): {message}")


# Also a ValueError: it was one before the error tree had it, and callers of
# AgentCredentials.from_config and the key loaders may catch it that way.
class CredentialConfigError(LocalError, ValueError):
    """A key or the credentials config cannot be loaded.

    Raised at start-up and never sent to a peer, so it has no fault code of its own.

    Attributes:
        detail: what is wrong, without the identity and source.
        identity: the agent identity being configured, if known.
        source: the file (or "inline JWK") the key came from, if known.
    """

    def __init__(
        self, detail: str, *, identity: str | None = None, source: str | None = None
    ) -> None:
        self.detail = detail
        self.identity = identity
        self.source = source
        where = ", ".join(
            part
            for part in (
                f"agent {identity!r}" if identity is not None else "",
                f"from {source}" if source is not None else "",
            )
            if part
        )
        super().__init__(f"{where}: {detail}" if where else detail)

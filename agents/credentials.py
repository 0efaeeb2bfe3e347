"""Application-Agent credentials: the agent side of the Tube handshake.

An Application-Agent proves its identity with a short-lived JWT signed by
its own private key; the Broker holds only the public key (see
``gateway.auth.credentials``). A credential is good for one handshake: the
Broker remembers each ``jti`` until the credential expires and refuses it a
second time, so mint a fresh one before every connect and reconnect. That is
what :class:`AgentCredentialSource` is for.

Algorithms follow the key: Ed25519 signs as "Ed25519" (the fully-specified
name from RFC 9864, which deprecates "EdDSA"), P-256 as "ES256", RSA as
"RS256". Ed25519 is the recommended key: small, fast, and no parameters to
get wrong.

This module imports nothing from ``gateway``: an agent SDK must not need
the Broker's code.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)
from joserfc import jwt
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey

# Re-exported: the SDK's callers built subprotocols from it before it moved to asbp.
from asbp.names import BEARER_SUBPROTOCOL_PREFIX

__all__ = [
    "BEARER_SUBPROTOCOL_PREFIX",
    "AgentCredentialSource",
    "bearer_subprotocol",
    "generate_agent_key",
    "mint_agent_token",
]

#: Shorter RSA keys are refused, as the Broker refuses them too.
MIN_RSA_BITS: Final = 2048


def generate_agent_key() -> tuple[str, str]:
    """Make a new Ed25519 key pair for an Application-Agent.

    Returns:
        ``(private_pem, public_pem)``: PKCS#8 and SubjectPublicKeyInfo PEM.
        Keep the private PEM with the agent; configure the public PEM on the
        Broker.
    """
    private = ed25519.Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    public_pem = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    return private_pem.decode("ascii"), public_pem.decode("ascii")


def _signing_key(private_key_pem: str | bytes) -> tuple[Key, str]:
    """Load a private PEM and pick the JWS algorithm its type implies."""
    raw = private_key_pem.encode("ascii") if isinstance(private_key_pem, str) else private_key_pem
    try:
        native = load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        # Never quote the PEM: it is the agent's secret.
        raise ValueError("not an unencrypted PEM private key") from exc
    if isinstance(native, ed25519.Ed25519PrivateKey):
        return OKPKey.import_key(native), "Ed25519"
    if isinstance(native, ec.EllipticCurvePrivateKey) and isinstance(native.curve, ec.SECP256R1):
        return ECKey.import_key(native), "ES256"
    if isinstance(native, rsa.RSAPrivateKey) and native.key_size >= MIN_RSA_BITS:
        return RSAKey.import_key(native), "RS256"
    raise ValueError(
        f"unsupported key {type(native).__name__}; use Ed25519, P-256 "
        f"or RSA of at least {MIN_RSA_BITS} bits"
    )


def _mint(
    identity: str,
    key: Key,
    alg: str,
    *,
    audience: str,
    lifetime: float,
    kid: str | None,
    now: float,
) -> str:
    if not identity:
        raise ValueError("identity must not be empty")
    if not audience:
        raise ValueError("audience must not be empty")
    # Whole seconds, as most JWT libraries expect; a lifetime under one
    # second would round to an exp that is not after iat.
    if not lifetime >= 1:
        raise ValueError("lifetime must be at least 1 second")
    issued_at = math.floor(now)
    header = {"alg": alg} if kid is None else {"alg": alg, "kid": kid}
    claims = {
        "iss": identity,
        "sub": identity,
        "aud": audience,
        "iat": issued_at,
        "exp": math.floor(now + lifetime),
        # 128 random bits: the Broker refuses a jti it has seen.
        "jti": secrets.token_urlsafe(16),
    }
    return jwt.encode(header, claims, key, algorithms=[alg])


def mint_agent_token(
    identity: str,
    private_key_pem: str | bytes,
    *,
    audience: str,
    lifetime: float = 60.0,
    kid: str | None = None,
    now: float | None = None,
) -> str:
    """Sign a fresh handshake credential for ``identity``.

    Args:
        identity: the Application-Agent identity, as configured on the Broker.
        private_key_pem: the agent's unencrypted PKCS#8 (or traditional) PEM.
        audience: the Broker's audience string.
        lifetime: seconds until ``exp``; keep it short (the Broker's default
            maximum is 300 s).
        kid: the key id to name in the header, when the Broker holds a key set.
        now: the current time; the wall clock if omitted.

    Returns:
        A compact JWS with ``iss`` = ``sub`` = identity, ``aud``, ``iat``,
        ``exp`` and a random ``jti``.

    Raises:
        ValueError: an unusable key, an empty identity or audience, or a
            lifetime under one second.
    """
    key, alg = _signing_key(private_key_pem)
    return _mint(
        identity,
        key,
        alg,
        audience=audience,
        lifetime=lifetime,
        kid=kid,
        now=time.time() if now is None else now,
    )


def bearer_subprotocol(token: str) -> str:
    """The WebSocket subprotocol that carries ``token`` for header-less clients.

    Offer it *beside* the real subprotocol; the Broker selects the real one.
    """
    return BEARER_SUBPROTOCOL_PREFIX + token


class AgentCredentialSource:
    """Mints a fresh credential for each (re)connect of one agent identity.

    The private key is parsed once, here, so a bad key fails at start-up
    rather than at the first reconnect. ``repr()`` never shows it.

    Args:
        identity: the Application-Agent identity.
        private_key_pem: the agent's private key.
        audience: the Broker's audience string.
        lifetime: seconds each credential lives.
        kid: the key id to name in the header, if any.
        clock: returns the current time in seconds since the epoch.

    Raises:
        ValueError: an unusable key or bad parameters.
    """

    def __init__(
        self,
        identity: str,
        private_key_pem: str | bytes,
        *,
        audience: str,
        lifetime: float = 60.0,
        kid: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key, self._alg = _signing_key(private_key_pem)
        self.identity = identity
        self.audience = audience
        self.lifetime = lifetime
        self.kid = kid
        self._clock = clock
        self.token()  # validate identity, audience and lifetime now

    @classmethod
    def from_file(
        cls,
        identity: str,
        path: str | os.PathLike[str],
        *,
        audience: str,
        lifetime: float = 60.0,
        kid: str | None = None,
    ) -> AgentCredentialSource:
        """Read the private key from a PEM file.

        Raises:
            ValueError: the file cannot be read or holds no usable key.
        """
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {os.fspath(path)} ({exc.strerror})") from exc
        return cls(identity, data, audience=audience, lifetime=lifetime, kid=kid)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(identity={self.identity!r}, audience={self.audience!r}, "
            f"alg={self._alg!r})"
        )

    def token(self) -> str:
        """A new credential, never handed out before."""
        return _mint(
            self.identity,
            self._key,
            self._alg,
            audience=self.audience,
            lifetime=self.lifetime,
            kid=self.kid,
            now=self._clock(),
        )

    def headers(self) -> dict[str, str]:
        """Handshake headers carrying a new credential."""
        return {"Authorization": f"Bearer {self.token()}"}

    def subprotocols(self, *protocols: str) -> list[str]:
        """``protocols`` plus a new bearer subprotocol, for header-less clients."""
        return [*protocols, bearer_subprotocol(self.token())]

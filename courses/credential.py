"""The Course handshake's two signatures: the dialling bus's credential and the answer.

Theory of operation
-------------------
Both buses hold a signing key; each lists the other's public key in
``[courses."<domain>"]``. We chose signed messages over mutual TLS because every
broker already verifies Application-Agent credentials this way (gateway.auth) and
because the domain a bus speaks for is then bound to a key its operators exchanged,
not to whichever certificate authority issued a TLS certificate::

    dialler (a.test)                                      answerer (b.test)
      GET /course, Authorization: Bearer <JWT>  ─────►
        JWT: iss = sub = "a.test", aud = "b.test",        verify with a.test's key (the
             short exp, fresh jti                         only one listed for "a.test"),
                                                          aud is us, jti never seen
                              ◄─────  c=asbp.course,domain=b.test;<JWT>
        verify with b.test's key: iss = sub = "b.test",
        aud = "a.test", jti = "re." + our jti

The answer's ``jti`` binds it to this one handshake: a recorded answer from an
earlier Course cannot be played back. TLS (``wss://``) still carries it all, so a
passive observer learns nothing and the dialler knows the host it reached; plain
``ws://`` is refused except between loopback addresses behind the Tubes' dev flag.
Both verifications are :class:`gateway.auth.credentials.AgentCredentials` with the
peer domains as identities: the same checks, the same replay cache.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Final

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from joserfc import jwt
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey

__all__ = ["ANSWER_JTI_PREFIX", "SigningKey", "answer_jti"]

#: The answer's ``jti`` is the credential's with this prefix.
ANSWER_JTI_PREFIX: Final = "re."


def answer_jti(credential_jti: str) -> str:
    """The ``jti`` the answer to a credential with ``credential_jti`` carries."""
    return ANSWER_JTI_PREFIX + credential_jti


class SigningKey:
    """This bus's private key, which signs credentials and answers.

    Raises:
        ValueError: not an unencrypted Ed25519, P-256 or RSA (2048+) PEM private key.
    """

    def __init__(self, pem: bytes, *, domain: str, kid: str | None = None) -> None:
        try:
            native = load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            # Never quote the PEM: it is the bus's secret.
            raise ValueError("signing_key is not an unencrypted PEM private key") from exc
        self._key: Key
        if isinstance(native, ed25519.Ed25519PrivateKey):
            self._key, self._alg = OKPKey.import_key(native), "Ed25519"
        elif isinstance(native, ec.EllipticCurvePrivateKey) and isinstance(
            native.curve, ec.SECP256R1
        ):
            self._key, self._alg = ECKey.import_key(native), "ES256"
        elif isinstance(native, rsa.RSAPrivateKey) and native.key_size >= 2048:
            self._key, self._alg = RSAKey.import_key(native), "RS256"
        else:
            raise ValueError("signing_key must be Ed25519, P-256 or RSA of 2048 bits or more")
        self.domain = domain
        self._kid = kid

    def sign(
        self, audience: str, *, lifetime: float, jti: str | None = None, now: float | None = None
    ) -> tuple[str, str]:
        """A JWT for ``audience`` (a peer domain); returns it and its ``jti``."""
        issued = math.floor(time.time() if now is None else now)
        jti = jti if jti is not None else secrets.token_urlsafe(16)
        header = {"alg": self._alg} if self._kid is None else {"alg": self._alg, "kid": self._kid}
        claims = {
            "iss": self.domain,
            "sub": self.domain,
            "aud": audience,
            "iat": issued,
            "exp": issued + max(1, math.floor(lifetime)),
            "jti": jti,
        }
        return jwt.encode(header, claims, self._key, algorithms=[self._alg]), jti

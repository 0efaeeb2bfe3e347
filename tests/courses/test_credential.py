"""The bus's signing key: the algorithm follows the key; unusable keys are refused (pure)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from courses.credential import SigningKey, answer_jti
from gateway.auth.credentials import AgentCredentials
from gateway.auth.keys import AgentKey

KEYS = {
    "Ed25519": ed25519.Ed25519PrivateKey.generate,
    "ES256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "RS256": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
}


@pytest.mark.parametrize("alg", sorted(KEYS))
def test_each_key_signs_what_the_peer_verifies(alg: str) -> None:
    private = KEYS[alg]()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    public = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    token, jti = SigningKey(pem, domain="a.test", kid="k1").sign("b.test", lifetime=60)
    verifier = AgentCredentials(
        {"a.test": AgentKey.from_pem(public, kid="k1")}, audience="b.test", algorithms=[alg]
    )
    verified = verifier.verify(token)
    assert (verified.identity, verified.jti) == ("a.test", jti)
    answer, bound = SigningKey(pem, domain="a.test").sign(
        "b.test", lifetime=60, jti=answer_jti(jti)
    )
    assert bound == "re." + jti and answer != token


@pytest.mark.parametrize(
    "pem",
    [
        b"not a key",
        ec.generate_private_key(ec.SECP384R1()).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        ),
        rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        ),
    ],
    ids=["garbage", "P-384", "RSA-1024"],
)
def test_unusable_keys_are_refused_without_quoting_them(pem: bytes) -> None:
    with pytest.raises(ValueError, match="signing_key") as caught:
        SigningKey(pem, domain="a.test")
    assert "PRIVATE" not in str(caught.value)

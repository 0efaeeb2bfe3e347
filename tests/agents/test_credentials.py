"""Tests for agents.credentials: minting handshake credentials on the agent side.

Each minted token is checked with joserfc against the public key, so these
tests do not lean on the Broker's verifier (tests/gateway covers the pair).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from joserfc import jwt
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey

import agents.credentials as credentials_module
from agents.credentials import (
    BEARER_SUBPROTOCOL_PREFIX,
    AgentCredentialSource,
    bearer_subprotocol,
    generate_agent_key,
    mint_agent_token,
)

AUD = "asbp-broker"
NOW = 1_750_000_000.25


def pem(private: Any) -> bytes:
    data: bytes = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return data


def decode(token: str, public: Key, alg: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify with joserfc and return (header, claims)."""
    result = jwt.decode(token, public, algorithms=[alg])
    return result.header, result.claims


@pytest.mark.parametrize(
    ("make", "jose", "alg"),
    [
        (ed25519.Ed25519PrivateKey.generate, OKPKey, "Ed25519"),
        (lambda: ec.generate_private_key(ec.SECP256R1()), ECKey, "ES256"),
        (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), RSAKey, "RS256"),
    ],
    ids=["ed25519", "p256", "rsa"],
)
def test_mint_picks_algorithm_from_key_and_sets_claims(make: Any, jose: Any, alg: str) -> None:
    private = make()

    token = mint_agent_token("billing", pem(private), audience=AUD, lifetime=45, now=NOW)

    header, claims = decode(token, jose.import_key(private.public_key()), alg)
    assert header["alg"] == alg
    assert "kid" not in header
    assert claims["iss"] == claims["sub"] == "billing"
    assert claims["aud"] == AUD
    assert (claims["iat"], claims["exp"]) == (int(NOW), int(NOW) + 45)
    assert isinstance(claims["jti"], str) and len(claims["jti"]) >= 22


def test_every_token_has_a_fresh_jti_and_kid_when_asked() -> None:
    private_pem, _ = generate_agent_key()
    tokens = [
        mint_agent_token("billing", private_pem, audience=AUD, kid="k1", now=NOW) for _ in range(50)
    ]

    payloads = [json.loads(base64.urlsafe_b64decode(t.split(".")[1] + "==")) for t in tokens]
    headers = [json.loads(base64.urlsafe_b64decode(t.split(".")[0] + "==")) for t in tokens]
    assert len({p["jti"] for p in payloads}) == 50
    assert {h["kid"] for h in headers} == {"k1"}


def test_generate_agent_key_returns_a_matching_ed25519_pair() -> None:
    private_pem, public_pem = generate_agent_key()

    private = load_pem_private_key(private_pem.encode(), password=None)
    public = load_pem_public_key(public_pem.encode())
    assert isinstance(private, ed25519.Ed25519PrivateKey)
    assert isinstance(public, ed25519.Ed25519PublicKey)
    assert private_pem.startswith("-----BEGIN PRIVATE KEY-----")
    assert public_pem.startswith("-----BEGIN PUBLIC KEY-----")
    token = mint_agent_token("billing", private_pem, audience=AUD, now=NOW)
    decode(token, OKPKey.import_key(public), "Ed25519")
    assert generate_agent_key() != (private_pem, public_pem)


@pytest.mark.parametrize(
    "private_pem",
    [
        pem(ec.generate_private_key(ec.SECP384R1())),
        pem(ed448.Ed448PrivateKey.generate()),
        pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)),
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw")
        ),
        b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n",
    ],
    ids=["p384", "ed448", "rsa1024", "encrypted", "garbage"],
)
def test_mint_refuses_unusable_keys_without_quoting_them(private_pem: bytes) -> None:
    with pytest.raises(ValueError) as caught:
        mint_agent_token("billing", private_pem, audience=AUD, now=NOW)

    body = private_pem.decode().splitlines()[1]
    assert body not in str(caught.value)


@pytest.mark.parametrize(
    ("identity", "audience", "lifetime", "expected"),
    [
        ("", AUD, 60.0, "identity"),
        ("billing", "", 60.0, "audience"),
        ("billing", AUD, 0.5, "lifetime"),
        ("billing", AUD, float("nan"), "lifetime"),
    ],
)
def test_mint_refuses_bad_parameters(
    identity: str, audience: str, lifetime: float, expected: str
) -> None:
    private_pem, _ = generate_agent_key()
    with pytest.raises(ValueError, match=expected):
        mint_agent_token(identity, private_pem, audience=audience, lifetime=lifetime, now=NOW)


def test_source_mints_fresh_tokens_on_its_clock(tmp_path: Path) -> None:
    private_pem, public_pem = generate_agent_key()
    (tmp_path / "agent.pem").write_text(private_pem)
    clock = [NOW]
    source = AgentCredentialSource(
        "billing", private_pem, audience=AUD, lifetime=30, kid="k9", clock=lambda: clock[0]
    )
    public = OKPKey.import_key(load_pem_public_key(public_pem.encode()))  # type: ignore[arg-type]  # it is Ed25519

    first = decode(source.token(), public, "Ed25519")
    clock[0] = NOW + 100
    second = decode(source.token(), public, "Ed25519")

    assert first[1]["jti"] != second[1]["jti"]
    assert (first[1]["iat"], second[1]["iat"]) == (int(NOW), int(NOW) + 100)
    assert second[1]["exp"] - second[1]["iat"] == 30
    assert first[0]["kid"] == "k9"
    from_file = AgentCredentialSource.from_file("billing", tmp_path / "agent.pem", audience=AUD)
    decode(from_file.token(), public, "Ed25519")


def test_source_headers_and_subprotocols_carry_a_token() -> None:
    private_pem, _ = generate_agent_key()
    source = AgentCredentialSource("billing", private_pem, audience=AUD)

    authorization = source.headers()["Authorization"]
    protocols = source.subprotocols("asbp")

    assert authorization.startswith("Bearer ey")
    assert protocols[0] == "asbp"
    assert protocols[1].startswith(BEARER_SUBPROTOCOL_PREFIX + "ey")
    assert protocols[1] != bearer_subprotocol(authorization.removeprefix("Bearer "))


def test_source_fails_fast_and_never_shows_the_key(tmp_path: Path) -> None:
    private_pem, _ = generate_agent_key()
    source = AgentCredentialSource("billing", private_pem, audience=AUD)

    assert "billing" in repr(source)
    assert private_pem.splitlines()[1] not in repr(source)
    with pytest.raises(ValueError, match="audience"):
        AgentCredentialSource("billing", private_pem, audience="")
    with pytest.raises(ValueError, match="cannot read"):
        AgentCredentialSource.from_file("billing", tmp_path / "missing.pem", audience=AUD)


def test_exports_exist() -> None:
    for name in credentials_module.__all__:
        assert hasattr(credentials_module, name), name

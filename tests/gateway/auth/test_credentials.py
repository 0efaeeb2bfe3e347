"""Tests for gateway.auth.credentials: every refusal is a real, crafted credential.

Keys are generated here (Ed25519, P-256, RSA); time is controlled with
``now=``, never with sleeps.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from joserfc import jws, jwt
from joserfc.errors import SecurityWarning
from joserfc.jwk import ECKey, Key, OctKey, OKPKey, RSAKey
from starlette.datastructures import Headers

import gateway.auth.credentials as credentials_module
from agents.credentials import AgentCredentialSource
from asbp.faults import FaultCode
from gateway.auth.credentials import (
    AgentCredentials,
    AgentKey,
    CredentialConfigError,
    CredentialRefused,
    JtiCache,
    RefusalReason,
    VerifiedAgent,
    credential_from_headers,
    keys_from_jwk,
    load_jwks_file,
    load_pem_file,
)

AUD = "asbp-broker"
NOW = 1_750_000_000.0

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


# --------------------------------------------------------------------------
# Key material and token crafting


@dataclass(frozen=True)
class Keys:
    """Private keys for the configured agents, plus one nobody trusts."""

    billing: ed25519.Ed25519PrivateKey  # Ed25519
    audit: ed25519.Ed25519PrivateKey  # a second Ed25519 agent
    search: ec.EllipticCurvePrivateKey  # P-256
    ledger: rsa.RSAPrivateKey  # RSA 2048
    intruder: ed25519.Ed25519PrivateKey  # configured for no one


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(
        billing=ed25519.Ed25519PrivateKey.generate(),
        audit=ed25519.Ed25519PrivateKey.generate(),
        search=ec.generate_private_key(ec.SECP256R1()),
        ledger=rsa.generate_private_key(public_exponent=65537, key_size=2048),
        intruder=ed25519.Ed25519PrivateKey.generate(),
    )


def public_pem(private: Any) -> bytes:
    data: bytes = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    return data


def private_pem(private: Any) -> bytes:
    data: bytes = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return data


def jose_key(private: PrivateKey) -> Key:
    if isinstance(private, ed25519.Ed25519PrivateKey):
        return OKPKey.import_key(private)
    if isinstance(private, ec.EllipticCurvePrivateKey):
        return ECKey.import_key(private)
    return RSAKey.import_key(private)


def claims(identity: str = "billing", **overrides: Any) -> dict[str, Any]:
    """Valid claims for ``identity`` at NOW; an override of ``None`` drops the claim."""
    base: dict[str, Any] = {
        "iss": identity,
        "sub": identity,
        "aud": AUD,
        "iat": int(NOW),
        "exp": int(NOW) + 60,
        "jti": secrets.token_urlsafe(16),
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def sign(private: PrivateKey, payload: dict[str, Any], alg: str = "", **header: Any) -> str:
    """A real signature over ``payload`` by ``private``."""
    if not alg:
        alg = {OKPKey: "Ed25519", ECKey: "ES256", RSAKey: "RS256"}[type(jose_key(private))]
    # Not strict: some rows need header parameters joserfc would not emit.
    registry = jws.JWSRegistry(algorithms=[alg], strict_check_header=False)
    return jwt.encode({"alg": alg, **header}, payload, jose_key(private), registry=registry)


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def b64decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def handmade(header: dict[str, Any] | str, payload: dict[str, Any] | str, signature: str) -> str:
    """A token assembled by hand, for what no JOSE library would emit."""
    parts = [p if isinstance(p, str) else json.dumps(p) for p in (header, payload)]
    return f"{b64(parts[0])}.{b64(parts[1])}.{signature}"


def hs256_by_hand(secret: bytes, payload: dict[str, Any]) -> str:
    """HS256 without a library: joserfc refuses to make an oct key from a PEM."""
    signing_input = f"{b64(json.dumps({'alg': 'HS256'}))}.{b64(json.dumps(payload))}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


@pytest.fixture
def registry(keys: Keys) -> AgentCredentials:
    return AgentCredentials(
        {
            "billing": AgentKey.from_pem(public_pem(keys.billing)),
            "audit": AgentKey.from_pem(public_pem(keys.audit)),
            "search": AgentKey.from_pem(public_pem(keys.search)),
            "ledger": AgentKey.from_pem(public_pem(keys.ledger)),
        },
        audience=AUD,
    )


# --------------------------------------------------------------------------
# Accepted credentials

ACCEPTED: list[tuple[str, Callable[[Keys], str], str]] = [
    ("ed25519", lambda k: sign(k.billing, claims("billing")), "billing"),
    ("es256", lambda k: sign(k.search, claims("search")), "search"),
    ("rs256", lambda k: sign(k.ledger, claims("ledger"), "RS256"), "ledger"),
    ("ps256", lambda k: sign(k.ledger, claims("ledger"), "PS256"), "ledger"),
    ("aud list", lambda k: sign(k.billing, claims(aud=["other", AUD])), "billing"),
    ("no iss", lambda k: sign(k.billing, claims(iss=None)), "billing"),
    ("float times", lambda k: sign(k.billing, claims(iat=NOW - 0.5, exp=NOW + 9.5)), "billing"),
    ("exp inside leeway", lambda k: sign(k.billing, claims(iat=NOW - 89, exp=NOW - 29)), "billing"),
    ("iat inside leeway", lambda k: sign(k.billing, claims(iat=NOW + 30, exp=NOW + 90)), "billing"),
    ("nbf reached", lambda k: sign(k.billing, claims(nbf=NOW)), "billing"),
    ("max lifetime", lambda k: sign(k.billing, claims(exp=int(NOW) + 300)), "billing"),
    ("unknown header", lambda k: sign(k.billing, claims(), **{"x-trace": "t1"}), "billing"),
]


@pytest.mark.parametrize(
    ("make", "identity"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED]
)
def test_accepts_valid_credential(
    registry: AgentCredentials, keys: Keys, make: Callable[[Keys], str], identity: str
) -> None:
    token = make(keys)
    payload = json.loads(b64decode(token.split(".")[1]))

    agent = registry.verify(token, now=NOW)

    assert agent == VerifiedAgent(
        identity=payload["sub"],
        jti=payload["jti"],
        expires_at=float(payload["exp"]),
        issued_at=float(payload["iat"]),
    )
    assert agent.identity == identity
    assert len(registry.replay_cache) == 1


# --------------------------------------------------------------------------
# Refused credentials: one row per reason, each a real crafted token

REFUSED: list[tuple[str, Callable[[Keys], str | None], RefusalReason]] = [
    # Nothing there.
    ("none", lambda k: None, RefusalReason.MISSING),
    ("empty", lambda k: "", RefusalReason.MISSING),
    # Not a JWS at all.
    ("garbage", lambda k: "this is not a token", RefusalReason.MALFORMED),
    ("two segments", lambda k: "eyJhbGciOiJub25lIn0.e30", RefusalReason.MALFORMED),
    ("four segments", lambda k: sign(k.billing, claims()) + ".AAAA", RefusalReason.MALFORMED),
    ("not base64", lambda k: "e30.e30.@@@", RefusalReason.MALFORMED),
    ("impossible base64 length", lambda k: "e.e30.AAAA", RefusalReason.MALFORMED),
    ("header not json", lambda k: handmade("nope", claims(), "AAAA"), RefusalReason.MALFORMED),
    ("header a list", lambda k: handmade('["alg"]', claims(), "AAAA"), RefusalReason.MALFORMED),
    (
        "claims a list",
        lambda k: handmade({"alg": "Ed25519"}, "[1]", "AAAA"),
        RefusalReason.MALFORMED,
    ),
    ("no alg", lambda k: handmade({"typ": "JWT"}, claims(), "AAAA"), RefusalReason.MALFORMED),
    ("too long", lambda k: sign(k.billing, claims(pad="x" * 9000)), RefusalReason.MALFORMED),
    (
        "duplicate claim",
        lambda k: handmade({"alg": "Ed25519"}, '{"sub":"nobody","sub":"billing"}', "AAAA"),
        RefusalReason.MALFORMED,
    ),
    (
        "NaN exp",
        lambda k: handmade({"alg": "Ed25519"}, '{"sub":"billing","exp":NaN}', "AAAA"),
        RefusalReason.MALFORMED,
    ),
    (
        "crit extension",
        lambda k: handmade({"alg": "Ed25519", "crit": ["x"], "x": 1}, claims(), "AAAA"),
        RefusalReason.MALFORMED,
    ),
    (
        "unencoded payload",
        lambda k: handmade({"alg": "Ed25519", "b64": False}, claims(), "AAAA"),
        RefusalReason.MALFORMED,
    ),
    (
        "kid not a string",
        lambda k: handmade({"alg": "Ed25519", "kid": 7}, claims(), "AAAA"),
        RefusalReason.MALFORMED,
    ),
    (
        "jku not a url",
        lambda k: handmade({"alg": "Ed25519", "jku": "file:///etc/keys"}, claims(), "AAAA"),
        RefusalReason.MALFORMED,
    ),
    # Algorithms that are never allowed.
    (
        "alg none",
        lambda k: handmade({"alg": "none", "typ": "JWT"}, claims(), ""),
        RefusalReason.ALGORITHM_NOT_ALLOWED,
    ),
    (
        "HS256",
        lambda k: jwt.encode(
            {"alg": "HS256"}, claims(), OctKey.import_key(secrets.token_bytes(32)), ["HS256"]
        ),
        RefusalReason.ALGORITHM_NOT_ALLOWED,
    ),
    (
        # The classic confusion: HMAC keyed with the agent's *public* PEM.
        "HS256 keyed with public pem",
        lambda k: hs256_by_hand(public_pem(k.billing), claims()),
        RefusalReason.ALGORITHM_NOT_ALLOWED,
    ),
    (
        "RS512",
        lambda k: sign(k.ledger, claims("ledger"), "RS512"),
        RefusalReason.ALGORITHM_NOT_ALLOWED,
    ),
    # Who is it?
    ("no sub", lambda k: sign(k.billing, claims(sub=None)), RefusalReason.MISSING_CLAIM),
    (
        "unknown identity",
        lambda k: sign(k.intruder, claims("payroll")),
        RefusalReason.UNKNOWN_IDENTITY,
    ),
    (
        "sub not a string",
        lambda k: sign(k.billing, claims(sub=["billing"])),
        RefusalReason.UNKNOWN_IDENTITY,
    ),
    ("key of wrong type", lambda k: sign(k.search, claims("billing")), RefusalReason.UNKNOWN_KEY),
    # Signatures.
    (
        "another agent's key",
        lambda k: sign(k.audit, claims("billing")),
        RefusalReason.BAD_SIGNATURE,
    ),
    ("intruder's key", lambda k: sign(k.intruder, claims("billing")), RefusalReason.BAD_SIGNATURE),
    (
        "tampered claims",
        lambda k: ".".join(
            [
                (good := sign(k.billing, claims(aud="elsewhere")).split("."))[0],
                b64(json.dumps(claims())),
                good[2],
            ]
        ),
        RefusalReason.BAD_SIGNATURE,
    ),
    (
        "stripped signature",
        lambda k: sign(k.billing, claims()).rsplit(".", 1)[0] + ".",
        RefusalReason.BAD_SIGNATURE,
    ),
    # Claims.
    ("no aud", lambda k: sign(k.billing, claims(aud=None)), RefusalReason.MISSING_CLAIM),
    ("no exp", lambda k: sign(k.billing, claims(exp=None)), RefusalReason.MISSING_CLAIM),
    ("no iat", lambda k: sign(k.billing, claims(iat=None)), RefusalReason.MISSING_CLAIM),
    ("no jti", lambda k: sign(k.billing, claims(jti=None)), RefusalReason.MISSING_CLAIM),
    (
        "exp a string",
        lambda k: sign(k.billing, claims(exp=str(int(NOW) + 60))),
        RefusalReason.INVALID_CLAIM,
    ),
    ("exp a bool", lambda k: sign(k.billing, claims(exp=True)), RefusalReason.INVALID_CLAIM),
    ("nbf a string", lambda k: sign(k.billing, claims(nbf="now")), RefusalReason.INVALID_CLAIM),
    ("jti empty", lambda k: sign(k.billing, claims(jti="")), RefusalReason.INVALID_CLAIM),
    ("jti a number", lambda k: sign(k.billing, claims(jti=7)), RefusalReason.INVALID_CLAIM),
    ("jti too long", lambda k: sign(k.billing, claims(jti="j" * 129)), RefusalReason.INVALID_CLAIM),
    ("aud a number", lambda k: sign(k.billing, claims(aud=7)), RefusalReason.INVALID_CLAIM),
    (
        "exp before iat",
        lambda k: sign(k.billing, claims(exp=int(NOW) - 1)),
        RefusalReason.INVALID_CLAIM,
    ),
    ("iss differs", lambda k: sign(k.billing, claims(iss="search")), RefusalReason.WRONG_ISSUER),
    (
        "wrong aud",
        lambda k: sign(k.billing, claims(aud="other-broker")),
        RefusalReason.WRONG_AUDIENCE,
    ),
    (
        "aud list without us",
        lambda k: sign(k.billing, claims(aud=["a", "b"])),
        RefusalReason.WRONG_AUDIENCE,
    ),
    (
        "lifetime too long",
        lambda k: sign(k.billing, claims(exp=int(NOW) + 301)),
        RefusalReason.LIFETIME_TOO_LONG,
    ),
    (
        "expired",
        lambda k: sign(k.billing, claims(iat=int(NOW) - 90, exp=int(NOW) - 31)),
        RefusalReason.EXPIRED,
    ),
    (
        "expired at the leeway edge",
        lambda k: sign(k.billing, claims(iat=int(NOW) - 90, exp=int(NOW) - 30)),
        RefusalReason.EXPIRED,
    ),
    (
        "iat in the future",
        lambda k: sign(k.billing, claims(iat=int(NOW) + 31, exp=int(NOW) + 91)),
        RefusalReason.NOT_YET_VALID,
    ),
    (
        "nbf in the future",
        lambda k: sign(k.billing, claims(nbf=int(NOW) + 31)),
        RefusalReason.NOT_YET_VALID,
    ),
]


@pytest.mark.parametrize(("make", "reason"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refuses_bad_credential(
    registry: AgentCredentials,
    keys: Keys,
    make: Callable[[Keys], str | None],
    reason: RefusalReason,
) -> None:
    token = make(keys)

    with pytest.raises(CredentialRefused) as caught:
        registry.verify(token, now=NOW)

    refused = caught.value
    assert refused.reason is reason
    assert refused.code is FaultCode.AUTHENTICATION_FAILED
    assert refused.identity in (None, *registry.identities)
    # The message never echoes the credential, nor any piece of it.
    for segment in (token or "").split("."):
        if len(segment) >= 8:
            assert segment not in str(refused)
    # A refused credential takes no room in the replay cache.
    assert len(registry.replay_cache) == 0


def test_refusals_only_name_configured_identities(registry: AgentCredentials, keys: Keys) -> None:
    with pytest.raises(CredentialRefused) as unknown:
        registry.verify(sign(keys.intruder, claims("payroll\r\nforged log line")), now=NOW)
    with pytest.raises(CredentialRefused) as known:
        registry.verify(sign(keys.intruder, claims("billing")), now=NOW)

    assert unknown.value.identity is None
    assert "payroll" not in str(unknown.value)
    assert known.value.identity == "billing"


def test_eddsa_is_refused_by_default_and_warns_when_opted_in(keys: Keys) -> None:
    # joserfc 1.8 deprecates "EdDSA" (RFC 9864) with a SecurityWarning,
    # raised even while signing; older agents still send it.
    with pytest.warns(SecurityWarning, match="EdDSA"):
        token = sign(keys.billing, claims(), "EdDSA")
    billing = AgentKey.from_pem(public_pem(keys.billing))

    default = AgentCredentials({"billing": billing}, audience=AUD)
    with pytest.raises(CredentialRefused) as caught:
        default.verify(token, now=NOW)
    assert caught.value.reason is RefusalReason.ALGORITHM_NOT_ALLOWED

    legacy = AgentCredentials({"billing": billing}, audience=AUD, algorithms=["Ed25519", "EdDSA"])
    with pytest.warns(SecurityWarning, match="EdDSA"):
        assert legacy.verify(token, now=NOW).identity == "billing"


# --------------------------------------------------------------------------
# Replay protection


def test_replayed_jti_is_refused_until_it_could_not_pass_anyway(
    registry: AgentCredentials, keys: Keys
) -> None:
    token = sign(keys.billing, claims(exp=int(NOW) + 60))
    registry.verify(token, now=NOW)

    for later in (NOW, NOW + 59, NOW + 89):
        with pytest.raises(CredentialRefused) as caught:
            registry.verify(token, now=later)
        assert caught.value.reason is RefusalReason.REPLAYED

    # At exp + leeway the entry is forgotten, and the token is refused as expired.
    with pytest.raises(CredentialRefused) as caught:
        registry.verify(token, now=NOW + 90)
    assert caught.value.reason is RefusalReason.EXPIRED


def test_same_jti_from_two_identities_is_not_a_replay(
    registry: AgentCredentials, keys: Keys
) -> None:
    registry.verify(sign(keys.billing, claims("billing", jti="shared")), now=NOW)
    registry.verify(sign(keys.audit, claims("audit", jti="shared")), now=NOW)

    assert len(registry.replay_cache) == 2


def test_jti_cache_stays_bounded_under_ten_thousand_tokens(keys: Keys) -> None:
    cache = JtiCache(max_entries=64)
    registry = AgentCredentials(
        {"billing": AgentKey.from_pem(public_pem(keys.billing))},
        audience=AUD,
        leeway=0,
        replay_cache=cache,
    )
    clock = [NOW]
    source = AgentCredentialSource(
        "billing", private_pem(keys.billing), audience=AUD, lifetime=1, clock=lambda: clock[0]
    )
    sizes = []
    for i in range(10_000):
        clock[0] = NOW + i * 0.05  # 20 handshakes a second, each credential lives 1 s
        registry.verify(source.token(), now=clock[0])
        sizes.append(len(cache))

    # Up to 20 live at once (every credential since the last whole second):
    # entries were kept, expired ones dropped, and the limit never reached.
    assert 15 <= max(sizes) <= 64


def test_full_cache_refuses_rather_than_forgetting_a_live_jti(keys: Keys) -> None:
    cache = JtiCache(max_entries=8)
    registry = AgentCredentials(
        {"billing": AgentKey.from_pem(public_pem(keys.billing))}, audience=AUD, replay_cache=cache
    )
    first = [sign(keys.billing, claims()) for _ in range(8)]
    for token in first:
        registry.verify(token, now=NOW)

    with pytest.raises(CredentialRefused) as caught:
        registry.verify(sign(keys.billing, claims()), now=NOW)
    assert caught.value.reason is RefusalReason.REPLAY_CACHE_FULL
    assert len(cache) == 8
    # Every live jti is still known.
    with pytest.raises(CredentialRefused) as replay:
        registry.verify(first[0], now=NOW)
    assert replay.value.reason is RefusalReason.REPLAYED

    # Once they expire (exp + leeway = NOW + 90), expired entries make room.
    later = claims(iat=int(NOW) + 90, exp=int(NOW) + 150)
    assert registry.verify(sign(keys.billing, later), now=NOW + 90).identity == "billing"
    assert len(cache) == 1


def test_one_identity_cannot_fill_the_cache_for_the_others(
    registry: AgentCredentials, keys: Keys
) -> None:
    registry.replay_cache = JtiCache(max_entries=100, max_entries_per_identity=3)
    for _ in range(3):
        registry.verify(sign(keys.billing, claims("billing")), now=NOW)

    with pytest.raises(CredentialRefused) as caught:
        registry.verify(sign(keys.billing, claims("billing")), now=NOW)
    assert caught.value.reason is RefusalReason.REPLAY_CACHE_FULL
    assert registry.verify(sign(keys.audit, claims("audit")), now=NOW).identity == "audit"


@pytest.mark.parametrize(
    "kwargs", [{"max_entries": 0}, {"max_entries_per_identity": 0}], ids=["total", "per identity"]
)
def test_jti_cache_refuses_useless_limits(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        JtiCache(**kwargs)


# --------------------------------------------------------------------------
# Key sets and kid selection


@pytest.fixture
def rotation() -> tuple[AgentCredentials, dict[str, ed25519.Ed25519PrivateKey]]:
    old, new = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    jwks = {
        "keys": [
            OKPKey.import_key(old.public_key(), {"kid": "2024"}).as_dict(),
            OKPKey.import_key(new.public_key(), {"kid": "2025"}).as_dict(),
        ]
    }
    return AgentCredentials({"search": keys_from_jwk(jwks)}, audience=AUD), {
        "2024": old,
        "2025": new,
    }


@pytest.mark.parametrize(
    ("signer", "kid", "outcome"),
    [
        ("2025", "2025", None),
        ("2024", "2024", None),
        ("2025", None, None),  # no kid: every key of the identity is tried
        ("2025", "2024", RefusalReason.BAD_SIGNATURE),  # kid picks the 2024 key only
        ("2025", "2023", RefusalReason.UNKNOWN_KEY),
    ],
)
def test_jwks_selects_key_by_kid(
    rotation: tuple[AgentCredentials, dict[str, ed25519.Ed25519PrivateKey]],
    signer: str,
    kid: str | None,
    outcome: RefusalReason | None,
) -> None:
    registry, private = rotation
    header = {"kid": kid} if kid is not None else {}
    token = sign(private[signer], claims("search"), **header)

    if outcome is None:
        assert registry.verify(token, now=NOW).identity == "search"
    else:
        with pytest.raises(CredentialRefused) as caught:
            registry.verify(token, now=NOW)
        assert caught.value.reason is outcome


def test_jwk_pinned_to_an_algorithm_verifies_only_that_algorithm(keys: Keys) -> None:
    pinned = RSAKey.import_key(keys.ledger.public_key(), {"alg": "PS256"}).as_dict()
    registry = AgentCredentials({"ledger": AgentKey.from_jwk(pinned)}, audience=AUD)

    assert registry.verify(sign(keys.ledger, claims("ledger"), "PS256"), now=NOW)
    with pytest.raises(CredentialRefused) as caught:
        registry.verify(sign(keys.ledger, claims("ledger"), "RS256"), now=NOW)
    assert caught.value.reason is RefusalReason.UNKNOWN_KEY


# --------------------------------------------------------------------------
# Loading keys and config


def test_loads_pem_and_jwks_files(tmp_path: Path, keys: Keys) -> None:
    (tmp_path / "billing.pem").write_bytes(public_pem(keys.billing))
    jwks = {"keys": [ECKey.import_key(keys.search.public_key(), {"kid": "s1"}).as_dict()]}
    (tmp_path / "search.json").write_text(json.dumps(jwks))

    billing = load_pem_file(tmp_path / "billing.pem", kid="b1")
    (search,) = load_jwks_file(tmp_path / "search.json")
    registry = AgentCredentials({"billing": billing, "search": search}, audience=AUD)

    assert (billing.kid, search.kid) == ("b1", "s1")
    assert search.source == str(tmp_path / "search.json")
    assert registry.verify(sign(keys.billing, claims(), kid="b1"), now=NOW).identity == "billing"
    assert registry.verify(sign(keys.search, claims("search")), now=NOW).identity == "search"


def test_from_config_resolves_paths_against_base_dir(tmp_path: Path, keys: Keys) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "billing.pem").write_bytes(public_pem(keys.billing))
    jwks = {"keys": [ECKey.import_key(keys.search.public_key()).as_dict()]}
    (tmp_path / "keys" / "search.jwks.json").write_text(json.dumps(jwks))
    config = {
        "audience": "broker-7",
        "max_lifetime": 120,
        "leeway": 5,
        "replay_cache_size": 10,
        "agents": {
            "billing": {"public_key": "keys/billing.pem"},
            "search": {"jwks": "keys/search.jwks.json"},
            "ledger": {"jwk": RSAKey.import_key(keys.ledger.public_key()).as_dict()},
        },
    }

    registry = AgentCredentials.from_config(config, base_dir=tmp_path)

    assert registry.identities == {"billing", "search", "ledger"}
    assert (registry.audience, registry.max_lifetime, registry.leeway) == ("broker-7", 120, 5)
    assert registry.replay_cache.max_entries == 10
    for identity, private in (
        ("billing", keys.billing),
        ("search", keys.search),
        ("ledger", keys.ledger),
    ):
        token = sign(private, claims(identity, aud="broker-7"))
        assert registry.verify(token, now=NOW).identity == identity
    with pytest.raises(CredentialRefused) as caught:
        registry.verify(sign(keys.billing, claims(exp=int(NOW) + 121, aud="broker-7")), now=NOW)
    assert caught.value.reason is RefusalReason.LIFETIME_TOO_LONG


def _rsa_1024_pem() -> bytes:
    return public_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024))


BAD_AGENT_CONFIG: list[tuple[str, Callable[[Path, Keys], dict[str, Any]], str]] = [
    ("missing file", lambda d, k: {"public_key": "nope.pem"}, "nope.pem"),
    (
        "private pem",
        lambda d, k: {"public_key": write(d, "p.pem", private_pem(k.billing))},
        "private key",
    ),
    ("not a pem", lambda d, k: {"public_key": write(d, "x.pem", b"hello")}, "not a PEM"),
    (
        "rsa 1024 pem",
        lambda d, k: {"public_key": write(d, "r.pem", _rsa_1024_pem())},
        "unsupported key",
    ),
    (
        "ed448 pem",
        lambda d, k: {
            "public_key": write(d, "e.pem", public_pem(ed448.Ed448PrivateKey.generate()))
        },
        "unsupported key",
    ),
    (
        "p384 pem",
        lambda d, k: {
            "public_key": write(d, "p.pem", public_pem(ec.generate_private_key(ec.SECP384R1())))
        },
        "unsupported key",
    ),
    ("bad json", lambda d, k: {"jwks": write(d, "k.json", b"{nope")}, "not valid JSON"),
    (
        "oct jwk",
        lambda d, k: {
            "jwks": write(d, "k.json", json.dumps({"kty": "oct", "k": "c2VjcmV0"}).encode())
        },
        "symmetric",
    ),
    (
        "private jwk",
        lambda d, k: {"jwk": OKPKey.import_key(k.billing).as_dict(private=True)},
        "private",
    ),
    (
        "rsa 1024 jwk",
        lambda d, k: {"jwk": {"kty": "RSA", "e": "AQAB", "n": b64(b"\xff" * 128)}},
        "shorter than 2048",
    ),
    (
        "enc jwk",
        lambda d, k: {"jwk": {**OKPKey.import_key(k.billing.public_key()).as_dict(), "use": "enc"}},
        "'use'",
    ),
    ("bad x", lambda d, k: {"jwk": {"kty": "OKP", "crv": "Ed25519", "x": "!!"}}, "invalid OKP JWK"),
    ("empty jwks", lambda d, k: {"jwk": {"keys": []}}, "non-empty"),
    (
        "duplicate kid",
        lambda d, k: {
            "jwk": {
                "keys": [
                    OKPKey.import_key(k.billing.public_key(), {"kid": "a"}).as_dict(),
                    OKPKey.import_key(k.audit.public_key(), {"kid": "a"}).as_dict(),
                ]
            }
        },
        "duplicate",
    ),
    (
        "sign-only jwk",
        lambda d, k: {
            "jwk": {**OKPKey.import_key(k.billing.public_key()).as_dict(), "key_ops": ["sign"]}
        },
        "'key_ops'",
    ),
    ("jwk kid a number", lambda d, k: {"jwk": {"kty": "OKP", "kid": 7}}, "'kid'"),
    ("jwk alg HS256", lambda d, k: {"jwk": {"kty": "OKP", "alg": "HS256"}}, "not supported"),
    ("jwk kty unknown", lambda d, k: {"jwk": {"kty": "AKP", "x": "AAAA"}}, "'kty'"),
    ("jwk rsa without n", lambda d, k: {"jwk": {"kty": "RSA", "e": "AQAB"}}, "shorter"),
    ("jwk rsa n garbage", lambda d, k: {"jwk": {"kty": "RSA", "e": "AQAB", "n": "!"}}, "shorter"),
    (
        "jwk p384",
        lambda d, k: {
            "jwk": ECKey.import_key(ec.generate_private_key(ec.SECP384R1()).public_key()).as_dict()
        },
        "unsupported curve",
    ),
    ("jwks member not an object", lambda d, k: {"jwk": {"keys": ["x"]}}, "every JWKS member"),
    ("jwks file missing", lambda d, k: {"jwks": "nope.json"}, "cannot read"),
    ("jwks file a list", lambda d, k: {"jwks": write(d, "l.json", b"[]")}, "JSON object"),
    ("jwks not a path", lambda d, k: {"jwks": 7}, "'jwks' must be a path"),
    ("public_key not a path", lambda d, k: {"public_key": 7}, "'public_key'"),
    ("kid a number", lambda d, k: {"public_key": "b", "kid": 7}, "'kid'"),
    ("no key", lambda d, k: {}, "no key"),
    ("typo", lambda d, k: {"public-key": "billing"}, "unknown settings"),
    (
        "kid with two pems",
        lambda d, k: {"public_key": ["a.pem", "b.pem"], "kid": "x"},
        "exactly one",
    ),
]


def write(directory: Path, name: str, data: bytes) -> str:
    (directory / name).write_bytes(data)
    return name


@pytest.mark.parametrize(
    ("make", "expected"), [c[1:] for c in BAD_AGENT_CONFIG], ids=[c[0] for c in BAD_AGENT_CONFIG]
)
def test_from_config_names_identity_and_file(
    tmp_path: Path, keys: Keys, make: Callable[[Path, Keys], dict[str, Any]], expected: str
) -> None:
    agent = make(tmp_path, keys)
    config = {"audience": AUD, "agents": {"billing": agent}}

    with pytest.raises(CredentialConfigError) as caught:
        AgentCredentials.from_config(config, base_dir=tmp_path)

    error = caught.value
    assert error.identity == "billing"
    assert "'billing'" in str(error)
    assert expected in str(error)
    for value in agent.values():
        if isinstance(value, str) and value.endswith((".pem", ".json")):
            assert error.source == str(tmp_path / value)
    # Never quote key material back.
    assert "PRIVATE KEY" not in str(error)
    assert "c2VjcmV0" not in str(error)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"agents": {}}, "non-empty table"),
        ({"audience": AUD}, "non-empty table"),
        ({"audience": "", "agents": {"a": {"jwk": {"kty": "OKP"}}}}, "invalid OKP JWK"),
        ({"audience": AUD, "agent": {}}, "unknown settings"),
        (
            {"audience": AUD, "algorithms": ["HS256"], "agents": {"b": {"jwk": "X"}}},
            "must be a table",
        ),
        ({"audience": AUD, "agents": {"b": "keys/b.pem"}}, "must be a table"),
    ],
)
def test_from_config_refuses_bad_top_level(config: dict[str, Any], expected: str) -> None:
    with pytest.raises(CredentialConfigError, match=expected):
        AgentCredentials.from_config(config, base_dir=".")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"algorithms": ["Ed25519", "HS256"]}, "HMAC"),
        ({"algorithms": ["none"]}, "unsupported algorithms"),
        ({"algorithms": []}, "unsupported algorithms"),
        ({"audience": ""}, "audience"),
        ({"max_lifetime": 0}, "positive"),
        ({"leeway": -1}, "leeway"),
    ],
)
def test_constructor_refuses_unsafe_settings(
    keys: Keys, overrides: dict[str, Any], expected: str
) -> None:
    settings: dict[str, Any] = {"audience": AUD, **overrides}
    with pytest.raises(ValueError, match=expected):
        AgentCredentials({"billing": AgentKey.from_pem(public_pem(keys.billing))}, **settings)


def test_from_config_turns_unsafe_settings_into_config_errors(tmp_path: Path, keys: Keys) -> None:
    config = {
        "audience": AUD,
        "algorithms": ["HS256"],
        "agents": {"billing": {"public_key": write(tmp_path, "b.pem", public_pem(keys.billing))}},
    }
    with pytest.raises(CredentialConfigError, match="HMAC"):
        AgentCredentials.from_config(config, base_dir=tmp_path)


def test_identity_without_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="no keys"):
        AgentCredentials({"billing": []}, audience=AUD)


def test_empty_identity_is_refused(keys: Keys) -> None:
    with pytest.raises(ValueError, match="identity"):
        AgentCredentials({"": AgentKey.from_pem(public_pem(keys.billing))}, audience=AUD)


def test_string_limits_in_config_are_config_errors(tmp_path: Path, keys: Keys) -> None:
    config = {
        "audience": AUD,
        "max_lifetime": "300",
        "agents": {"billing": {"public_key": write(tmp_path, "b.pem", public_pem(keys.billing))}},
    }
    with pytest.raises(CredentialConfigError, match="credentials config"):
        AgentCredentials.from_config(config, base_dir=tmp_path)


def test_keys_built_by_hand_that_joserfc_refuses_are_skipped(keys: Keys) -> None:
    # The loaders refuse both keys; an AgentKey constructed directly does not.
    sign_only = OKPKey.import_key(keys.billing.public_key(), {"key_ops": ["sign"]})
    ed448_key = OKPKey.import_key(ed448.Ed448PrivateKey.generate().public_key())
    registry = AgentCredentials(
        {
            "billing": AgentKey(jwk=sign_only, kid=None, source="test"),
            "audit": AgentKey(jwk=ed448_key, kid=None, source="test"),
        },
        audience=AUD,
    )

    with pytest.raises(CredentialRefused) as bad:
        registry.verify(sign(keys.billing, claims("billing")), now=NOW)
    with pytest.raises(CredentialRefused) as unknown:
        registry.verify(sign(keys.audit, claims("audit")), now=NOW)

    assert bad.value.reason is RefusalReason.BAD_SIGNATURE
    assert unknown.value.reason is RefusalReason.UNKNOWN_KEY


def test_verify_defaults_to_the_wall_clock(registry: AgentCredentials, keys: Keys) -> None:
    source = AgentCredentialSource("billing", private_pem(keys.billing), audience=AUD)
    assert registry.verify(source.token()).identity == "billing"
    with pytest.raises(CredentialRefused) as caught:
        registry.verify(sign(keys.billing, claims()))  # minted at NOW, long ago
    assert caught.value.reason is RefusalReason.EXPIRED


# --------------------------------------------------------------------------
# Finding the credential in the handshake

HEADERS: list[tuple[str, Any, str | None]] = [
    ("bearer", {"Authorization": "Bearer abc.def.ghi"}, "abc.def.ghi"),
    ("lower case", {"authorization": "bearer abc.def.ghi"}, "abc.def.ghi"),
    ("odd case and spaces", {"AUTHORIZATION": "  BeArEr   abc.def.ghi "}, "abc.def.ghi"),
    ("basic", {"Authorization": "Basic dXNlcjpwYXNz"}, None),
    ("bearer without token", {"Authorization": "Bearer "}, None),
    ("subprotocol", {"Sec-WebSocket-Protocol": "asbp, asbp.bearer.abc.def.ghi"}, "abc.def.ghi"),
    ("subprotocol only real", {"sec-websocket-protocol": "asbp"}, None),
    ("subprotocol empty token", {"Sec-WebSocket-Protocol": "asbp, asbp.bearer."}, None),
    (
        "authorization wins",
        {"Authorization": "Bearer first", "Sec-WebSocket-Protocol": "asbp.bearer.second"},
        "first",
    ),
    ("nothing", {}, None),
    ("starlette", Headers(raw=[(b"authorization", b"Bearer abc.def.ghi")]), "abc.def.ghi"),
    (
        "starlette subprotocol",
        Headers(raw=[(b"sec-websocket-protocol", b"asbp.bearer.abc.def.ghi, asbp")]),
        "abc.def.ghi",
    ),
]


@pytest.mark.parametrize(
    ("headers", "expected"), [c[1:] for c in HEADERS], ids=[c[0] for c in HEADERS]
)
def test_credential_from_headers(headers: Any, expected: str | None) -> None:
    assert credential_from_headers(headers) == expected


def test_agent_sdk_round_trip_through_headers_and_subprotocols(
    registry: AgentCredentials, keys: Keys
) -> None:
    source = AgentCredentialSource(
        "billing", private_pem(keys.billing), audience=AUD, clock=lambda: NOW
    )
    by_header = credential_from_headers(source.headers())
    by_protocol = credential_from_headers(
        {"Sec-WebSocket-Protocol": ", ".join(source.subprotocols("asbp"))}
    )

    assert registry.verify(by_header, now=NOW).identity == "billing"
    assert registry.verify(by_protocol, now=NOW).identity == "billing"


def test_exports_exist() -> None:
    for name in credentials_module.__all__:
        assert hasattr(credentials_module, name), name

"""Application-Agent credentials: who is dialling in on this Tube?

Theory of operation
-------------------

An Application-Agent dials out to the Broker and opens a Tube. Before any
Command flows, the handshake must carry a short-lived JWT (a *credential*)
that the agent signed with its own private key. The Broker holds only public
keys: a registry (:class:`AgentCredentials`) maps each trusted
Application-Agent identity to one or more :class:`AgentKey`. A verified
credential yields a :class:`VerifiedAgent` whose ``identity`` becomes the
agent's Application-Agent-Identifier ``a``. Nothing the agent writes in an
ASBP header is ever trusted for ``a``.

:meth:`AgentCredentials.verify` runs these steps, cheapest and least
trusting first, and refuses at the first failure with a
:class:`CredentialRefused` that names a :class:`RefusalReason`::

    token ──► size, shape, base64url, JSON (no NaN, no duplicate names)    MALFORMED
          ──► header "alg" in the allow-list (never HS*, never "none")     ALGORITHM_NOT_ALLOWED
          ──► "sub" names a configured identity                            UNKNOWN_IDENTITY
          ──► that identity has a key for this "kid" and "alg"             UNKNOWN_KEY
          ──► the signature verifies with one of THAT identity's keys      BAD_SIGNATURE
          ──► claims: aud, exp, iat, jti present and well typed, iss==sub,
              exp-iat <= max_lifetime, not expired, not issued in the
              future, nbf reached (leeway for clock skew)                  ...
          ──► (sub, jti) not seen before, recorded until exp + leeway      REPLAYED

Only the last step changes state, and only for a credential whose signature
verified, so a peer without an agent key cannot fill the replay cache.

Where the credential travels: ``Authorization: Bearer <jwt>`` is primary.
Browsers cannot set headers on a WebSocket handshake, so a client may also
offer the WebSocket subprotocol ``asbp.bearer.<jwt>`` beside the real
subprotocol; see :func:`credential_from_headers`.

Refusal messages never echo the token, any part of it, or key material: the
token is a bearer secret until it expires, and whatever the agent wrote
(``sub``, ``kid``, ``alg``) is attacker-controlled text we keep out of logs.
``.identity`` on a refusal is set only once ``sub`` matched a configured
identity. The reasons are distinct so operators can tell a clock problem
from an attack; a transport that wants to hide which identities exist
should send the peer only the fault code (3101) and log the reason.

This module verifies and holds the public API; it re-exports the rest, which
lives apart: key loading in :mod:`gateway.auth.keys`, the replay cache
in :mod:`gateway.auth.jwt_replay`, the errors in :mod:`gateway.auth.errors`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from joserfc import jws
from joserfc.errors import JoseError

# Re-exported: the prefix is protocol vocabulary the SDK offers and this module reads.
from asbp.names import BEARER_SUBPROTOCOL_PREFIX
from gateway.auth.errors import CredentialConfigError, CredentialRefused, RefusalReason
from gateway.auth.jwt_replay import JtiCache
from gateway.auth.keys import (
    SUPPORTED_ALGORITHMS,
    AgentKey,
    StrPath,
    b64url_decode,
    keys_from_agent_table,
    keys_from_jwk,
    load_jwks_file,
    load_pem_file,
    reject_unknown,
)

__all__ = [
    "BEARER_SUBPROTOCOL_PREFIX",
    "DEFAULT_ALGORITHMS",
    "SUPPORTED_ALGORITHMS",
    "AgentCredentials",
    "AgentKey",
    "CredentialConfigError",
    "CredentialRefused",
    "JtiCache",
    "RefusalReason",
    "VerifiedAgent",
    "credential_from_headers",
    "keys_from_jwk",
    "load_jwks_file",
    "load_pem_file",
]


#: The algorithms :class:`AgentCredentials` allows unless told otherwise.
DEFAULT_ALGORITHMS: Final = ("Ed25519", "ES256", "RS256", "PS256")

#: A jti longer than this is refused, so one cache entry has bounded size.
MAX_JTI_CHARS: Final = 128

_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class VerifiedAgent:
    """What a verified credential proves.

    Attributes:
        identity: the Application-Agent identity (the verified ``sub``); use
            it as the Application-Agent-Identifier ``a``.
        jti: the credential's unique id, for audit logs.
        expires_at: ``exp``, seconds since the epoch.
        issued_at: ``iat``, seconds since the epoch.
    """

    identity: str
    jti: str
    expires_at: float
    issued_at: float


class AgentCredentials:
    """The registry of trusted Application-Agent identities and their keys.

    Args:
        agents: identity -> one key or several (key rotation).
        audience: this Broker's audience; a credential's ``aud`` must hold it.
        max_lifetime: the longest ``exp - iat`` accepted, in seconds; keeps
            stolen credentials short-lived and bounds the replay cache.
        leeway: tolerated clock skew, in seconds.
        algorithms: allowed ``alg`` values, a subset of
            :data:`SUPPORTED_ALGORITHMS`.
        max_token_bytes: longer credentials are refused before parsing.
        replay_cache: where accepted jtis are kept; a fresh :class:`JtiCache`
            if omitted.

    Raises:
        ValueError: an empty audience or identity, an identity without keys,
            a non-positive limit, or an unsupported algorithm.
    """

    def __init__(
        self,
        agents: Mapping[str, AgentKey | Iterable[AgentKey]],
        *,
        audience: str,
        max_lifetime: float = 300.0,
        leeway: float = 30.0,
        algorithms: Collection[str] = DEFAULT_ALGORITHMS,
        max_token_bytes: int = 8 * 1024,
        replay_cache: JtiCache | None = None,
    ) -> None:
        if not audience:
            raise ValueError("audience must not be empty")
        if not max_lifetime > 0 or not leeway >= 0 or max_token_bytes < 1:
            raise ValueError("max_lifetime and max_token_bytes must be positive, leeway >= 0")
        unsupported = sorted(set(algorithms) - SUPPORTED_ALGORITHMS.keys())
        if unsupported or not algorithms:
            raise ValueError(
                f"unsupported algorithms {unsupported}; choose from {sorted(SUPPORTED_ALGORITHMS)} "
                "(HMAC and 'none' are never allowed)"
            )
        self._agents: dict[str, tuple[AgentKey, ...]] = {}
        for identity, keys in agents.items():
            if not identity:
                raise ValueError("agent identity must not be empty")
            keys = (keys,) if isinstance(keys, AgentKey) else tuple(keys)
            if not keys:
                raise ValueError(f"agent {identity!r} has no keys")
            self._agents[identity] = keys
        self.audience = audience
        self.max_lifetime = max_lifetime
        self.leeway = leeway
        self.algorithms = frozenset(algorithms)
        self.max_token_bytes = max_token_bytes
        self.replay_cache = replay_cache if replay_cache is not None else JtiCache()
        # strict_check_header=False: RFC 7515 4 says to ignore header
        # parameters we do not understand, unless listed in "crit" (which
        # _parse refuses outright).
        self._registry = jws.JWSRegistry(
            algorithms=sorted(self.algorithms), strict_check_header=False
        )

    @property
    def identities(self) -> frozenset[str]:
        """The configured Application-Agent identities."""
        return frozenset(self._agents)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, base_dir: StrPath) -> AgentCredentials:
        """Build the registry from a TOML-like table.

        ::

            audience = "asbp-broker"       # required
            max_lifetime = 300             # optional, seconds
            leeway = 30                    # optional, seconds
            algorithms = ["Ed25519", "ES256", "RS256", "PS256"]
            replay_cache_size = 100000
            replay_cache_per_identity = 10000

            [agents.billing]
            public_key = "keys/billing.pem"   # or a list of paths
            kid = "billing-2025"              # optional, with one public_key
            [agents.search]
            jwks = "keys/search.jwks.json"    # a JWK or a JWKS
            [agents.ledger]
            jwk = { kty = "OKP", crv = "Ed25519", x = "..." }

        ``base_dir`` is required, not the working directory: relative paths
        should resolve against the config file's directory, wherever the
        Broker was started from.

        Raises:
            CredentialConfigError: naming the identity and file at fault.
        """
        known = {
            "audience",
            "max_lifetime",
            "leeway",
            "algorithms",
            "max_token_bytes",
            "replay_cache_size",
            "replay_cache_per_identity",
            "agents",
        }
        reject_unknown(config, known, where="credentials config")
        agents_table = config.get("agents")
        if not isinstance(agents_table, Mapping) or not agents_table:
            raise CredentialConfigError("'agents' must be a non-empty table")
        base = Path(base_dir)
        agents = {
            str(identity): keys_from_agent_table(str(identity), table, base)
            for identity, table in agents_table.items()
        }
        options: dict[str, Any] = {
            name: config[name]
            for name in ("max_lifetime", "leeway", "algorithms", "max_token_bytes")
            if name in config
        }
        try:
            cache = JtiCache(
                max_entries=config.get("replay_cache_size", 100_000),
                max_entries_per_identity=config.get("replay_cache_per_identity", 10_000),
            )
            return cls(agents, audience=config.get("audience", ""), replay_cache=cache, **options)
        except (ValueError, TypeError) as exc:
            raise CredentialConfigError(str(exc), source="credentials config") from exc

    def verify(self, token: str | None, *, now: float | None = None) -> VerifiedAgent:
        """Check a handshake credential and return the identity it proves.

        Args:
            token: the compact JWS, as :func:`credential_from_headers` found
                it, or ``None``.
            now: the current time in seconds since the epoch; the wall clock
                if omitted (tests pass it instead of sleeping).

        Raises:
            CredentialRefused: with the first :class:`RefusalReason` found.
        """
        if now is None:
            now = time.time()
        if not token:
            raise CredentialRefused(RefusalReason.MISSING, "no credential was presented")
        header, claims = self._parse(token)
        alg = header["alg"]
        if alg not in self.algorithms:
            raise CredentialRefused(
                RefusalReason.ALGORITHM_NOT_ALLOWED,
                f"the header's alg is not one of {sorted(self.algorithms)}",
            )
        subject = claims.get("sub")
        if subject is None:
            raise CredentialRefused(RefusalReason.MISSING_CLAIM, "claim 'sub' is missing")
        keys = self._agents.get(subject) if isinstance(subject, str) else None
        if keys is None:
            raise CredentialRefused(RefusalReason.UNKNOWN_IDENTITY, "'sub' names no known agent")
        identity: str = subject
        self._verify_signature(token, header, identity, keys)
        jti, issued_at, expires_at = self._check_claims(identity, claims, now)
        self.replay_cache.remember(identity, jti, forget_after=expires_at + self.leeway, now=now)
        return VerifiedAgent(
            identity=identity, jti=jti, expires_at=float(expires_at), issued_at=float(issued_at)
        )

    def _parse(self, token: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """Decode header and claims, not yet verified; refuse odd shapes before joserfc."""

        def malformed(why: str) -> CredentialRefused:
            return CredentialRefused(RefusalReason.MALFORMED, why)

        if len(token) > self.max_token_bytes:
            raise malformed(f"the credential is longer than {self.max_token_bytes} bytes")
        if not _COMPACT_JWS.fullmatch(token):
            raise malformed("not a compact JWS (three base64url segments)")
        header_segment, payload_segment, _ = token.split(".")
        try:
            header = _json_object(b64url_decode(header_segment))
            claims = _json_object(b64url_decode(payload_segment))
        except ValueError as exc:
            raise malformed("a segment is not base64url-encoded JSON object") from exc
        if not isinstance(header.get("alg"), str):
            raise malformed("the header has no 'alg'")
        if "crit" in header or "b64" in header:
            # We implement no JWS extension, and RFC 7515 4.1.11 says to
            # refuse a "crit" we do not understand. "b64" (RFC 7797) would
            # make the payload segment raw bytes rather than base64url.
            raise malformed("the header asks for a JWS extension")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise malformed("the header's kid is not a string")
        return header, claims

    def _verify_signature(
        self, token: str, header: Mapping[str, Any], identity: str, keys: tuple[AgentKey, ...]
    ) -> None:
        alg: str = header["alg"]
        candidates = [key for key in keys if key.accepts(alg, header.get("kid"))]
        if not candidates:
            raise CredentialRefused(
                RefusalReason.UNKNOWN_KEY,
                "no key of this agent matches the header's kid and alg",
                identity=identity,
            )
        try:
            signed = jws.extract_compact(token.encode("ascii"), registry=self._registry)
            self._registry.check_header(signed.headers())
        except JoseError as exc:
            raise CredentialRefused(
                RefusalReason.MALFORMED, f"the JWS is invalid ({exc.error})", identity=identity
            ) from exc
        for key in candidates:
            try:
                if jws.validate_compact(signed, key.jwk, registry=self._registry):
                    return
            except JoseError:
                # joserfc refuses this key for this token (say, its key_ops);
                # the loaders prevent that, but an AgentKey built by hand may not.
                continue
        raise CredentialRefused(
            RefusalReason.BAD_SIGNATURE,
            "the signature does not verify with this agent's keys",
            identity=identity,
        )

    def _check_claims(
        self, identity: str, claims: Mapping[str, Any], now: float
    ) -> tuple[str, float, float]:
        def refuse(reason: RefusalReason, message: str) -> CredentialRefused:
            return CredentialRefused(reason, message, identity=identity)

        for name in ("aud", "exp", "iat", "jti"):
            if claims.get(name) is None:
                raise refuse(RefusalReason.MISSING_CLAIM, f"claim {name!r} is missing")
        times = {name: claims[name] for name in ("exp", "iat", "nbf") if name in claims}
        for name, value in times.items():
            if not _is_numeric_date(value):
                raise refuse(RefusalReason.INVALID_CLAIM, f"claim {name!r} is not a NumericDate")
        jti = claims["jti"]
        if not isinstance(jti, str) or not 0 < len(jti) <= MAX_JTI_CHARS:
            raise refuse(
                RefusalReason.INVALID_CLAIM, f"claim 'jti' must be 1..{MAX_JTI_CHARS} characters"
            )
        audience = claims["aud"]
        if isinstance(audience, str):
            audience = [audience]
        if not isinstance(audience, list) or not all(isinstance(a, str) for a in audience):
            raise refuse(RefusalReason.INVALID_CLAIM, "claim 'aud' is not a string or list")
        if "iss" in claims and claims["iss"] != identity:
            raise refuse(RefusalReason.WRONG_ISSUER, "claim 'iss' differs from 'sub'")
        if self.audience not in audience:
            raise refuse(RefusalReason.WRONG_AUDIENCE, "claim 'aud' does not name this broker")
        expires_at, issued_at = times["exp"], times["iat"]
        if expires_at <= issued_at:
            raise refuse(RefusalReason.INVALID_CLAIM, "claim 'exp' is not after 'iat'")
        if expires_at - issued_at > self.max_lifetime:
            raise refuse(
                RefusalReason.LIFETIME_TOO_LONG,
                f"exp - iat exceeds the {self.max_lifetime:g} s maximum lifetime",
            )
        if expires_at <= now - self.leeway:
            raise refuse(RefusalReason.EXPIRED, "the credential has expired")
        if issued_at > now + self.leeway:
            raise refuse(RefusalReason.NOT_YET_VALID, "claim 'iat' is in the future")
        if times.get("nbf", now) > now + self.leeway:
            raise refuse(RefusalReason.NOT_YET_VALID, "claim 'nbf' is in the future")
        return jti, issued_at, expires_at


def _json_object(data: bytes) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # RFC 7519 7.2: names must be unique; "last one wins" parsers differ.
        result = dict(pairs)
        if len(result) != len(pairs):
            raise ValueError("duplicate member name")
        return result

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    value = json.loads(data, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _is_numeric_date(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


# --------------------------------------------------------------------------
# Transport helper


def credential_from_headers(headers: Mapping[str, str]) -> str | None:
    """Find the credential in a WebSocket handshake's headers.

    ``Authorization: Bearer <jwt>`` comes first (RFC 6750; the scheme is
    case-insensitive). Browsers cannot set headers on a WebSocket, so a
    client may instead offer two subprotocols, the real one and
    ``asbp.bearer.<jwt>`` (a JWT uses only token characters, so it is a
    valid subprotocol name). The Broker must then select the real one and
    never echo the bearer entry back, which would reflect the credential
    into response headers and their logs.

    Args:
        headers: any ``Mapping[str, str]``; Starlette's and websockets'
            ``Headers`` are matched case-insensitively by themselves, a
            plain ``dict`` is searched case-insensitively here.

    Returns:
        The token, or ``None`` when neither form is present.
    """
    authorization = _header(headers, "authorization")
    if authorization is not None:
        scheme, _, credential = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            return credential.strip()
    protocols = _header(headers, "sec-websocket-protocol")
    if protocols is not None:
        for protocol in protocols.split(","):
            protocol = protocol.strip()
            if protocol.startswith(BEARER_SUBPROTOCOL_PREFIX):
                return protocol[len(BEARER_SUBPROTOCOL_PREFIX) :] or None
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    for key, candidate in headers.items():
        if key.lower() == name:
            return candidate
    return None

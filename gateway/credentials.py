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
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, KeyParameters, OKPKey, RSAKey, import_key

from asbp.errors import AsbpError
from asbp.faults import FaultCode

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

StrPath = str | os.PathLike[str]

#: The WebSocket subprotocol prefix that carries a credential for clients
#: that cannot set ``Authorization`` (browsers).
BEARER_SUBPROTOCOL_PREFIX: Final = "asbp.bearer."

#: Every algorithm this module can verify, with the key it needs: ``(kty,
#: crv)``, ``crv`` ``None`` for RSA. "EdDSA" is the pre-RFC 9864 name for
#: Ed25519 signatures; it is supported for agents on older JOSE libraries but
#: not allowed by default, and joserfc emits a ``SecurityWarning`` for it.
#: HMAC and "none" are absent on purpose: an HMAC key is a shared secret, so
#: the Broker could mint any agent's credential, and "none" is no signature.
SUPPORTED_ALGORITHMS: Final[Mapping[str, tuple[str, str | None]]] = {
    "Ed25519": ("OKP", "Ed25519"),
    "EdDSA": ("OKP", "Ed25519"),
    "ES256": ("EC", "P-256"),
    "RS256": ("RSA", None),
    "PS256": ("RSA", None),
}

#: The algorithms :class:`AgentCredentials` allows unless told otherwise.
DEFAULT_ALGORITHMS: Final = ("Ed25519", "ES256", "RS256", "PS256")

#: Below this an RSA key is refused at load time (NIST SP 800-131A).
MIN_RSA_BITS: Final = 2048

#: A jti longer than this is refused, so one cache entry has bounded size.
MAX_JTI_CHARS: Final = 128

_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_PRIVATE_JWK_MEMBERS: Final = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})


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


class CredentialRefused(AsbpError):
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


class CredentialConfigError(ValueError):
    """A key or the credentials config cannot be loaded.

    Raised at start-up, never sent to a peer, so it is a ``ValueError`` rather
    than an :class:`~asbp.errors.AsbpError` (which carries a wire fault code).

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


# --------------------------------------------------------------------------
# Keys


@dataclass(frozen=True, slots=True)
class AgentKey:
    """One public key an Application-Agent may sign credentials with.

    Build one with :meth:`from_pem`, :meth:`from_jwk`, :func:`load_pem_file`
    or :func:`load_jwks_file`; they refuse private keys (the Broker must
    never hold an agent's signing key), symmetric keys, and keys no
    supported algorithm can use (curves other than Ed25519 and P-256, RSA
    under 2048 bits).

    Attributes:
        jwk: the joserfc public key.
        kid: the key id; ``None`` matches a token with any ``kid`` or none.
        source: where the key came from, for error messages.
    """

    jwk: Key
    kid: str | None
    source: str

    @classmethod
    def from_pem(
        cls, data: str | bytes, *, kid: str | None = None, source: str = "PEM"
    ) -> AgentKey:
        """Load a SubjectPublicKeyInfo PEM (``-----BEGIN PUBLIC KEY-----``).

        Raises:
            CredentialConfigError: not a public key PEM, or an unusable key.
        """
        raw = data.encode("ascii", "replace") if isinstance(data, str) else data
        if b"PRIVATE KEY" in raw:
            raise CredentialConfigError(
                "holds a private key; give the broker the agent's public key only", source=source
            )
        try:
            native = load_pem_public_key(raw)
        except (ValueError, TypeError) as exc:
            raise CredentialConfigError("not a PEM public key", source=source) from exc
        parameters: KeyParameters | None = {"kid": kid} if kid is not None else None
        jwk: Key
        if isinstance(native, ed25519.Ed25519PublicKey):
            jwk = OKPKey.import_key(native, parameters)
        elif isinstance(native, ec.EllipticCurvePublicKey) and isinstance(
            native.curve, ec.SECP256R1
        ):
            jwk = ECKey.import_key(native, parameters)
        elif isinstance(native, rsa.RSAPublicKey) and native.key_size >= MIN_RSA_BITS:
            jwk = RSAKey.import_key(native, parameters)
        else:
            raise CredentialConfigError(
                f"unsupported key {type(native).__name__}; use Ed25519, P-256 "
                f"or RSA of at least {MIN_RSA_BITS} bits",
                source=source,
            )
        return cls(jwk=jwk, kid=kid, source=source)

    @classmethod
    def from_jwk(cls, data: Mapping[str, Any], *, source: str = "inline JWK") -> AgentKey:
        """Load one public JWK (a dict with ``kty``).

        Raises:
            CredentialConfigError: a private or symmetric key, or an unusable key.
        """
        kty = data.get("kty")
        private = _PRIVATE_JWK_MEMBERS.intersection(data)
        if kty == "oct" or "k" in private:
            raise CredentialConfigError(
                "symmetric (oct) keys are refused: a shared secret would let the "
                "broker mint the agent's credentials",
                source=source,
            )
        if private:
            raise CredentialConfigError(
                "holds private key members; give the broker the public JWK only", source=source
            )
        kid = data.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise CredentialConfigError("'kid' must be a string", source=source)
        use = data.get("use")
        if use is not None and use != "sig":
            raise CredentialConfigError(f"'use' is {use!r}, expected 'sig'", source=source)
        key_ops = data.get("key_ops")
        if key_ops is not None and (not isinstance(key_ops, list) or "verify" not in key_ops):
            raise CredentialConfigError("'key_ops' does not allow 'verify'", source=source)
        alg = data.get("alg")
        if alg is not None and alg not in SUPPORTED_ALGORITHMS:
            raise CredentialConfigError(f"'alg' {alg!r} is not supported", source=source)
        if kty == "RSA" and _jwk_rsa_bits(data) < MIN_RSA_BITS:
            # Checked before import: joserfc would only warn about a short key.
            raise CredentialConfigError(f"RSA key shorter than {MIN_RSA_BITS} bits", source=source)
        if kty not in ("OKP", "EC", "RSA"):
            raise CredentialConfigError("'kty' must be OKP, EC or RSA", source=source)
        jwk: Key
        try:
            if kty == "OKP":
                jwk = import_key(dict(data), "OKP")
                ok = jwk.curve_name == "Ed25519"
            elif kty == "EC":
                jwk = import_key(dict(data), "EC")
                ok = jwk.curve_name == "P-256"
            else:
                jwk = import_key(dict(data), "RSA")
                ok = True
        except (JoseError, ValueError, TypeError, KeyError) as exc:
            # The exception text may quote key members; name only its type.
            raise CredentialConfigError(
                f"invalid {kty} JWK ({type(exc).__name__})", source=source
            ) from exc
        if not ok:
            raise CredentialConfigError("unsupported curve; use Ed25519 or P-256", source=source)
        return cls(jwk=jwk, kid=kid, source=source)

    def accepts(self, alg: str, kid: str | None) -> bool:
        """Whether this key may verify a token with header ``alg`` and ``kid``."""
        if self.kid is not None and kid is not None and self.kid != kid:
            return False
        kty, crv = SUPPORTED_ALGORITHMS[alg]
        if self.jwk.key_type != kty:
            return False
        if crv is not None and getattr(self.jwk, "curve_name", None) != crv:
            return False
        # A JWK that pins "alg" only verifies that algorithm (RFC 7517 4.4).
        return self.jwk.alg is None or self.jwk.alg == alg


def _jwk_rsa_bits(data: Mapping[str, Any]) -> int:
    n = data.get("n")
    if not isinstance(n, str):
        return 0
    try:
        return int.from_bytes(_b64url_decode(n), "big").bit_length()
    except ValueError:
        return 0


def keys_from_jwk(data: Mapping[str, Any], *, source: str = "inline JWK") -> tuple[AgentKey, ...]:
    """Load a JWK or a JWKS (``{"keys": [...]}``) held in memory.

    Raises:
        CredentialConfigError: empty set, duplicate ``kid``, or a bad key.
    """
    if "keys" in data:
        members = data["keys"]
        if not isinstance(members, list) or not members:
            raise CredentialConfigError("'keys' must be a non-empty list", source=source)
        keys = []
        for member in members:
            if not isinstance(member, Mapping):
                raise CredentialConfigError("every JWKS member must be an object", source=source)
            keys.append(AgentKey.from_jwk(member, source=source))
    else:
        keys = [AgentKey.from_jwk(data, source=source)]
    kids = [key.kid for key in keys if key.kid is not None]
    if len(kids) != len(set(kids)):
        raise CredentialConfigError("duplicate 'kid' in key set", source=source)
    return tuple(keys)


def load_pem_file(path: StrPath, *, kid: str | None = None) -> AgentKey:
    """Load an agent's public key from a PEM file.

    Raises:
        CredentialConfigError: unreadable file or unusable key, naming the file.
    """
    source = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise CredentialConfigError(f"cannot read ({exc.strerror})", source=source) from exc
    return AgentKey.from_pem(data, kid=kid, source=source)


def load_jwks_file(path: StrPath) -> tuple[AgentKey, ...]:
    """Load an agent's public keys from a JSON file holding a JWK or a JWKS.

    Raises:
        CredentialConfigError: unreadable file, bad JSON, or a bad key.
    """
    source = os.fspath(path)
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as exc:
        raise CredentialConfigError(f"cannot read ({exc.strerror})", source=source) from exc
    except ValueError as exc:
        raise CredentialConfigError("not valid JSON", source=source) from exc
    if not isinstance(data, dict):
        raise CredentialConfigError("must hold a JSON object (a JWK or a JWKS)", source=source)
    return keys_from_jwk(data, source=source)


# --------------------------------------------------------------------------
# Replay protection


class JtiCache:
    """The ``(identity, jti)`` pairs already accepted, until they expire.

    An entry is forgotten once its credential could no longer pass the
    expiry check anyway (``exp + leeway``), so forgetting it reopens nothing.

    Memory is bounded by ``max_entries`` (and each jti by
    :data:`MAX_JTI_CHARS`). When the cache is full, expired entries go first
    (they always do: every call purges them). If it is still full of live
    entries, the new credential is refused with ``REPLAY_CACHE_FULL``
    instead of evicting a live entry. The trade-off: evicting a live jti
    would silently reopen a replay window for a still-valid token, under
    exactly the load an attacker can produce, whereas refusing fails closed
    and visibly. ``max_entries_per_identity`` keeps that refusal with the
    identity that floods: one compromised or runaway agent cannot lock out
    the others. Only credentials with a verified signature reach the cache,
    so filling it needs a real agent key.

    Capacity planning: an entry lives at most ``max_lifetime + 2 * leeway``
    (360 s by default), so ``max_entries_per_identity / 360`` is the
    sustained handshake rate one identity may keep up.

    The cache is per process. Behind several workers or replicas, a replay
    against another process is not caught; a shared store (Redis ``SET NX
    EX``) would close that gap. It is thread-safe.
    """

    def __init__(
        self, *, max_entries: int = 100_000, max_entries_per_identity: int | None = 10_000
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if max_entries_per_identity is not None and max_entries_per_identity < 1:
            raise ValueError("max_entries_per_identity must be at least 1 or None")
        self.max_entries = max_entries
        self.max_entries_per_identity = max_entries_per_identity
        self._forget_at: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, str, str]] = []
        self._per_identity: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._forget_at)

    def remember(self, identity: str, jti: str, *, forget_after: float, now: float) -> None:
        """Record ``(identity, jti)`` until ``forget_after``, or refuse it.

        Raises:
            CredentialRefused: ``REPLAYED`` if it is already recorded,
                ``REPLAY_CACHE_FULL`` if there is no room for it.
        """
        entry = (identity, jti)
        with self._lock:
            self._purge(now)
            if entry in self._forget_at:
                raise CredentialRefused(
                    RefusalReason.REPLAYED, "this jti was already used", identity=identity
                )
            cap = self.max_entries_per_identity
            if len(self._forget_at) >= self.max_entries or (
                cap is not None and self._per_identity[identity] >= cap
            ):
                raise CredentialRefused(
                    RefusalReason.REPLAY_CACHE_FULL,
                    "too many live credentials to track; retry later",
                    identity=identity,
                )
            self._forget_at[entry] = forget_after
            heapq.heappush(self._heap, (forget_after, identity, jti))
            self._per_identity[identity] += 1

    def _purge(self, now: float) -> None:
        # Each entry is pushed once (a replay is refused, not re-pushed), so
        # the heap and the dict always hold the same entries.
        while self._heap and self._heap[0][0] <= now:
            _, identity, jti = heapq.heappop(self._heap)
            del self._forget_at[(identity, jti)]
            self._per_identity[identity] -= 1
            if not self._per_identity[identity]:
                del self._per_identity[identity]


# --------------------------------------------------------------------------
# The registry


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
        _reject_unknown(config, known, where="credentials config")
        agents_table = config.get("agents")
        if not isinstance(agents_table, Mapping) or not agents_table:
            raise CredentialConfigError("'agents' must be a non-empty table")
        base = Path(base_dir)
        agents = {
            str(identity): _keys_from_agent_table(str(identity), table, base)
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
            header = _json_object(_b64url_decode(header_segment))
            claims = _json_object(_b64url_decode(payload_segment))
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


def _keys_from_agent_table(identity: str, table: object, base: Path) -> tuple[AgentKey, ...]:
    if not isinstance(table, Mapping):
        raise CredentialConfigError("must be a table", identity=identity)
    # "serves" is the agent's allow-list of Command-Names: gateway.trust reads it.
    _reject_unknown(table, {"public_key", "kid", "jwks", "jwk", "serves"}, identity=identity)
    keys: list[AgentKey] = []
    kid = table.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise CredentialConfigError("'kid' must be a string", identity=identity)
    pem_paths = table.get("public_key", [])
    if isinstance(pem_paths, str):
        pem_paths = [pem_paths]
    if not isinstance(pem_paths, list) or not all(isinstance(p, str) for p in pem_paths):
        raise CredentialConfigError("'public_key' must be a path or a list", identity=identity)
    if kid is not None and len(pem_paths) != 1:
        raise CredentialConfigError("'kid' needs exactly one 'public_key'", identity=identity)
    try:
        keys.extend(load_pem_file(base / path, kid=kid) for path in pem_paths)
        jwks_path = table.get("jwks")
        if jwks_path is not None:
            if not isinstance(jwks_path, str):
                raise CredentialConfigError("'jwks' must be a path")
            keys.extend(load_jwks_file(base / jwks_path))
        inline = table.get("jwk")
        if inline is not None:
            if not isinstance(inline, Mapping):
                raise CredentialConfigError("'jwk' must be a table")
            keys.extend(keys_from_jwk(inline))
    except CredentialConfigError as exc:
        # Re-raise with the identity: "which agent?" is the first question.
        raise CredentialConfigError(exc.detail, identity=identity, source=exc.source) from exc
    if not keys:
        raise CredentialConfigError("no key: set public_key, jwks or jwk", identity=identity)
    return tuple(keys)


def _reject_unknown(
    table: Mapping[str, Any], known: set[str], *, where: str = "", identity: str | None = None
) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        # A typo ("public-key") must not silently leave an agent keyless.
        prefix = f"{where}: " if where else ""
        raise CredentialConfigError(
            f"{prefix}unknown settings {unknown}; expected {sorted(known)}", identity=identity
        )


def _b64url_decode(segment: str) -> bytes:
    try:
        return base64.b64decode(segment + "=" * (-len(segment) % 4), altchars=b"-_", validate=True)
    except binascii.Error as exc:
        raise ValueError("not base64url") from exc


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

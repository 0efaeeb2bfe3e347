"""Application-Agent public keys: loading and checking them (gateway.auth.credentials).

The Broker holds only public keys: every loader here refuses private keys (the
Broker must never hold an agent's signing key), symmetric keys (a shared
secret would let the Broker mint any agent's credentials) and keys no
supported algorithm can use. Errors are :class:`CredentialConfigError`, raised
at start-up and naming the identity and the file at fault.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, Key, KeyParameters, OKPKey, RSAKey, import_key

from gateway.auth.errors import CredentialConfigError

__all__ = [
    "MIN_RSA_BITS",
    "SUPPORTED_ALGORITHMS",
    "AgentKey",
    "StrPath",
    "b64url_decode",
    "keys_from_agent_table",
    "keys_from_jwk",
    "load_jwks_file",
    "load_pem_file",
    "reject_unknown",
]

StrPath = str | os.PathLike[str]

#: Every algorithm gateway.auth.credentials can verify, with the key it needs: ``(kty,
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

#: Below this an RSA key is refused at load time (NIST SP 800-131A).
MIN_RSA_BITS: Final = 2048

_PRIVATE_JWK_MEMBERS: Final = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})


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
        return int.from_bytes(b64url_decode(n), "big").bit_length()
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


def keys_from_agent_table(identity: str, table: object, base: Path) -> tuple[AgentKey, ...]:
    """The keys of one ``[agents.<identity>]`` table (see ``AgentCredentials.from_config``).

    Raises:
        CredentialConfigError: naming ``identity`` and the file at fault.
    """
    if not isinstance(table, Mapping):
        raise CredentialConfigError("must be a table", identity=identity)
    # "serves" is the agent's allow-list of Command-Names: gateway.auth.trust reads it.
    reject_unknown(table, {"public_key", "kid", "jwks", "jwk", "serves"}, identity=identity)
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


def reject_unknown(
    table: Mapping[str, Any], known: set[str], *, where: str = "", identity: str | None = None
) -> None:
    """Refuse settings in ``table`` other than ``known``.

    Raises:
        CredentialConfigError: listing the unknown and the expected settings.
    """
    unknown = sorted(set(table) - known)
    if unknown:
        # A typo ("public-key") must not silently leave an agent keyless.
        prefix = f"{where}: " if where else ""
        raise CredentialConfigError(
            f"{prefix}unknown settings {unknown}; expected {sorted(known)}", identity=identity
        )


def b64url_decode(segment: str) -> bytes:
    """Decode base64url without padding (RFC 7515 2); ValueError if it is not."""
    try:
        return base64.b64decode(segment + "=" * (-len(segment) % 4), altchars=b"-_", validate=True)
    except binascii.Error as exc:
        raise ValueError("not base64url") from exc

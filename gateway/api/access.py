"""Who may call the management API, and with which scope.

Three ways in, from ``[management]``:

* **Nothing configured**: the API is open, but only while the broker listens on
  a loopback address and only to loopback peers (a developer's laptop). On any
  other address every call gets 401 until a token is configured: secure by
  default.
* **A static admin token** (``token_file``): a bearer token equal to the file's
  one line may read and write. For small set-ups.
* **JWT access tokens** (``jwks_url`` or ``jwks_file``, ``issuer``,
  ``audience``): the API is an OAuth 2 resource server. A bearer JWT must be
  signed by a key of the issuer's JWKS, carry that ``iss`` and ``aud``, be
  unexpired, and hold ``read_scope`` to read, ``write_scope`` to write (in
  ``scope``, space-separated, or ``scp``, a list). Its ``sub`` names the caller
  in the log of writes. The JWKS URL is fetched on first use and again when a
  token names a ``kid`` the cached set lacks (the issuer rotated keys), at most
  once per ``jwks_refetch_interval`` (a minute).

The JWT check is authlib's resource server: a ``ResourceProtector`` with a
``BearerTokenValidator`` (RFC 6750), so a refusal carries the standard challenge
(``WWW-Authenticate: Bearer realm="asbp", error="invalid_token"`` with 401, or
``error="insufficient_scope"`` with the scope wanted and 403). The validator
decodes with joserfc, as authlib's own JWT access-token validator
(``authlib.oauth2.rfc9068``) does; that one is not used as is because RFC 9068
makes ``client_id``, ``jti`` and ``iat`` essential, which common identity
providers leave out of their access tokens (Keycloak puts the client in ``azp``,
Okta in ``cid``): the checks here are the ones every provider's tokens pass
(signature by the issuer's JWKS, ``iss``, ``aud``, ``exp``, the scope). authlib
also does the console's OpenID Connect sign-in (gateway.console.oidc).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import time
from pathlib import Path
from typing import Any, Final

import httpx
from authlib.oauth2 import OAuth2Error
from authlib.oauth2.rfc6749 import ResourceProtector
from authlib.oauth2.rfc6750 import BearerTokenValidator, InsufficientScopeError, InvalidTokenError
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

from gateway.api.declare import ApiError, Scope
from gateway.config.errors import ConfigError
from gateway.config.model import GatewayConfig, ManagementConfig

__all__ = ["ManagementAccess", "is_loopback"]

#: Signature algorithms accepted from an issuer (no ``none``, no HMAC).
_ALGORITHMS: Final = ["RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA", "Ed25519"]
#: Seconds a JWKS fetch may take.
_FETCH_TIMEOUT: Final = 10.0


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the admin token: {exc.strerror or exc}", key="management.token_file"
        ) from exc
    if len(token) < 16:
        raise ConfigError(
            "the admin token must be at least 16 characters", key="management.token_file"
        )
    return token


def _scopes(claims: dict[str, Any]) -> set[str]:
    scope = claims.get("scope")
    if isinstance(scope, str):
        return set(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, list):
        return {item for item in scp if isinstance(item, str)}
    if isinstance(scp, str):
        return set(scp.split())
    return set()


#: The realm named in the API's challenges.
_REALM: Final = "asbp"


class _UnknownKey(Exception):
    """The token names a key the cached JWKS lacks: the issuer may have rotated."""


class _Headers:
    """What authlib's ResourceProtector reads of a request: its headers."""

    def __init__(self, authorization: str) -> None:
        self.headers = {"Authorization": authorization}


class _JwtAccessTokens(BearerTokenValidator):  # type: ignore[misc]  # authlib is untyped
    """The issuer's JWT access tokens, for authlib's ResourceProtector."""

    def __init__(self, issuer: str, audience: str) -> None:
        super().__init__(realm=_REALM)
        #: The issuer's keys, set by ManagementAccess before each check.
        self.keys: KeySet | None = None
        self._registry = jwt.JWTClaimsRegistry(
            iss={"essential": True, "value": issuer},
            aud={"essential": True, "value": audience},
            exp={"essential": True},
        )

    def authenticate_token(self, token_string: str) -> dict[str, Any]:
        if self.keys is None:
            raise self._invalid("the issuer's keys are not available")
        try:
            token = jwt.decode(token_string, self.keys, algorithms=_ALGORITHMS)
        except (ValueError, InvalidKeyIdError) as exc:
            # An unknown kid: InvalidKeyIdError from joserfc 1.8 on (a JoseError, so
            # it must be caught first), a ValueError before.
            raise _UnknownKey(str(exc)) from exc
        except JoseError as exc:
            raise self._invalid(f"the bearer token is not valid: {exc}") from exc
        try:
            self._registry.validate(token.claims)
        except JoseError as exc:
            raise self._invalid(f"the bearer token is not valid: {exc}") from exc
        return dict(token.claims)

    def validate_token(self, token: dict[str, Any], scopes: list[str], request: object) -> None:
        if self.scope_insufficient(sorted(_scopes(token)), scopes):
            raise InsufficientScopeError(description=f"the token lacks the scope {scopes[0]}")

    def _invalid(self, description: str) -> InvalidTokenError:
        return InvalidTokenError(description=description, realm=self.realm)


def _challenge(error: OAuth2Error, scope: str) -> dict[str, str]:
    """The RFC 6750 challenge for ``error`` (authlib adds none to insufficient_scope)."""
    for name, value in error.get_headers():
        if name.lower() == "www-authenticate":
            return {"WWW-Authenticate": value}
    return {"WWW-Authenticate": f'Bearer realm="{_REALM}", error="{error.error}", scope="{scope}"'}


class ManagementAccess:
    """Checks each call's bearer token against ``[management]``.

    Raises:
        ConfigError: the token or JWKS file cannot be read, or a JWKS lacks its
            issuer or audience.
    """

    def __init__(self, config: GatewayConfig) -> None:
        settings: ManagementConfig = config.management
        self._settings = settings
        self._token = _read_token(settings.token_file) if settings.token_file else None
        self._jwks: KeySet | None = None
        self._jwks_url = settings.jwks_url
        self._refetch = settings.jwks_refetch_interval
        self._fetched_at: float | None = None
        if settings.jwks_file:
            try:
                self._jwks = KeySet.import_key_set(
                    json.loads(Path(settings.jwks_file).read_text(encoding="utf-8"))
                )
            except (OSError, ValueError, JoseError) as exc:
                raise ConfigError(
                    f"cannot load the JWKS: {exc}", key="management.jwks_file"
                ) from exc
        self._jwt = bool(settings.jwks_file or settings.jwks_url)
        if self._jwt and not (settings.issuer and settings.audience):
            raise ConfigError(
                "a JWKS needs management.issuer and management.audience",
                key="management.issuer",
            )
        self._tokens = _JwtAccessTokens(settings.issuer or "", settings.audience or "")
        self._protector = ResourceProtector()
        self._protector.register_token_validator(self._tokens)
        #: Open to loopback peers without a token (nothing configured, loopback host).
        self.open = self._token is None and not self._jwt and is_loopback(config.host)

    async def principal(self, authorization: str | None, peer: str | None, scope: Scope) -> str:
        """Who is calling, if they may use ``scope``.

        Raises:
            ApiError: 401 without valid credentials, 403 without the scope.
        """
        if self.open:
            if not is_loopback(peer):
                raise ApiError(401, "the management API answers loopback peers only")
            return "loopback"
        if self._token is None and not self._jwt:
            raise ApiError(
                401,
                "the management API needs [management] token_file or a JWKS when the "
                "broker listens beyond loopback",
            )
        scheme, _, credential = (authorization or "").partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise ApiError(401, "a bearer token is required")
        if self._token is not None and hmac.compare_digest(
            credential.encode(), self._token.encode()
        ):
            return "admin-token"
        if not self._jwt:
            raise ApiError(401, "the bearer token is not valid")
        wanted = self._settings.write_scope if scope == "write" else self._settings.read_scope
        claims = await self._verify(f"Bearer {credential}", wanted)
        subject = claims.get("sub")
        return f"jwt:{subject}" if isinstance(subject, str) else "jwt"

    async def _verify(self, authorization: str, wanted: str) -> dict[str, Any]:
        """The token's claims, checked by authlib's resource server for ``wanted``."""
        request = _Headers(authorization)
        self._tokens.keys = await self._keys(refresh=False)
        try:
            try:
                return self._validate(request, wanted)
            except _UnknownKey as exc:
                if self._jwks_url is None:
                    raise ApiError(401, f"the bearer token is not valid: {exc}") from exc
                # The issuer may have rotated its keys: fetch them again (at most
                # once per interval) and check once more.
                self._tokens.keys = await self._keys(refresh=True)
                try:
                    return self._validate(request, wanted)
                except _UnknownKey as again:
                    raise ApiError(401, f"the bearer token is not valid: {again}") from again
        except OAuth2Error as error:
            status = 403 if error.error == "insufficient_scope" else 401
            raise ApiError(
                status, error.description or error.error, headers=_challenge(error, wanted)
            ) from error

    def _validate(self, request: _Headers, wanted: str) -> dict[str, Any]:
        claims: dict[str, Any] = self._protector.validate_request([wanted], request)
        return claims

    async def _keys(self, *, refresh: bool) -> KeySet:
        url = self._jwks_url
        fetched_at = self._fetched_at
        stale = refresh and (fetched_at is None or time.monotonic() - fetched_at >= self._refetch)
        if url is not None and (self._jwks is None or stale):
            self._fetched_at = time.monotonic()
            try:
                async with httpx.AsyncClient(timeout=_FETCH_TIMEOUT) as client:
                    response = await client.get(url)
                    response.raise_for_status()
                    self._jwks = KeySet.import_key_set(response.json())
            except (httpx.HTTPError, ValueError, JoseError) as exc:
                if self._jwks is None:
                    raise ApiError(401, f"the issuer's keys cannot be fetched: {exc}") from exc
        if self._jwks is None:
            raise ApiError(401, "the issuer's keys are not available")
        return self._jwks

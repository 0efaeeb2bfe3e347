"""A small OpenID Connect provider for tests, built from authlib's own server parts.

:class:`Provider` is a Starlette app (serve it with ``serve_app_async`` on a free
loopback port) with what the broker's console sign-in and the management API's
resource server use of a real provider:

* ``/.well-known/openid-configuration``: the discovery document;
* ``/authorize``: authlib's ``AuthorizationCodeGrant`` with ``CodeChallenge``
  (PKCE required, S256), which signs in :attr:`Provider.user` at once (the
  test plays an operator who already has a session at the provider);
* ``/token``: the code exchanged for a JWT access token (RS256, ``kid``,
  ``iss``, ``aud``, ``sub``, ``scope``, ``exp``), signed with joserfc (authlib's
  own JOSE is deprecated in favour of it), and, for the ``openid`` scope, an ID
  token with the authorisation request's ``nonce`` (authlib's ``OpenIDCode``),
  which the broker's authlib client checks;
* ``/jwks``: the public keys, which :meth:`Provider.rotate` replaces.

Public clients only (``token_endpoint_auth_method`` ``none``) unless a secret is
given: PKCE is what protects the code. Everything is in memory and bounded by
the test's few sign-ins.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qsl

from authlib.oauth2 import AuthorizationServer, OAuth2Error, OAuth2Request
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["Client", "Provider"]


@dataclass
class Client(ClientMixin):  # type: ignore[misc]  # authlib is untyped
    """A registered client: the broker's console."""

    client_id: str
    redirect_uris: list[str]
    scope: str
    secret: str | None = None

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str:
        return self.redirect_uris[0]

    def get_allowed_scope(self, scope: str) -> str:
        allowed = set(self.scope.split())
        return " ".join(s for s in scope.split() if s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return self.secret is not None and secrets.compare_digest(client_secret, self.secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if endpoint != "token":
            return True
        return method == ("none" if self.secret is None else "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "authorization_code"


@dataclass
class _Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: str
    code_challenge: str | None
    code_challenge_method: str | None
    nonce: str | None = None
    issued_at: float = field(default_factory=time.time)

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str | None:
        return self.nonce

    def get_auth_time(self) -> int:
        return int(self.issued_at)

    def get_acr(self) -> str | None:
        return None

    def get_amr(self) -> list[str] | None:
        return None


class _Request(OAuth2Request):  # type: ignore[misc]  # authlib is untyped
    def __init__(self, method: str, url: str, headers: Any, data: dict[str, str]) -> None:
        super().__init__(method, url, headers=headers)
        self._data = data
        self.payload = BasicOAuth2Payload(data)

    @property
    def args(self) -> dict[str, str]:
        return self._data

    @property
    def form(self) -> dict[str, str]:
        return self._data


class _Server(AuthorizationServer):  # type: ignore[misc]  # authlib is untyped
    def __init__(self, provider: Provider) -> None:
        super().__init__()
        self.provider = provider

    def query_client(self, client_id: str) -> Client | None:
        return self.provider.clients.get(client_id)

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        self.provider.issued.append(token)

    def create_oauth2_request(self, request: _Request) -> _Request:
        return request

    def handle_response(self, status: int, body: Any, headers: Any) -> Response:
        headers = dict(headers)
        if isinstance(body, dict):
            return JSONResponse(body, status_code=status, headers=headers)
        return Response(body, status_code=status, headers=headers)

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        return None


class _CodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]  # authlib is untyped
    TOKEN_ENDPOINT_AUTH_METHODS: ClassVar[list[str]] = ["none", "client_secret_post"]

    def save_authorization_code(self, code: str, request: OAuth2Request) -> None:
        data = request.payload.data
        provider: Provider = self.server.provider
        provider.codes[code] = _Code(
            code=code,
            client_id=request.client.get_client_id(),
            redirect_uri=data.get("redirect_uri", ""),
            scope=request.scope or "",
            user=request.user,
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
            nonce=data.get("nonce"),
        )

    def query_authorization_code(self, code: str, client: Client) -> _Code | None:
        provider: Provider = self.server.provider
        found = provider.codes.get(code)
        if found is not None and found.client_id == client.get_client_id():
            return found
        return None

    def delete_authorization_code(self, authorization_code: _Code) -> None:
        provider: Provider = self.server.provider
        provider.codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code: _Code) -> str:
        return authorization_code.user


class _IdToken(OpenIDCode):  # type: ignore[misc]  # authlib is untyped
    """OpenID Connect on the code grant: an ID token beside the access token."""

    def __init__(self, provider: Provider) -> None:
        super().__init__(require_nonce=True)
        self.provider = provider

    def resolve_client_private_key(self, client: Client) -> Any:
        return self.provider.signing_key()

    def get_client_algorithm(self, client: Client) -> str:
        return "RS256"

    def get_encode_header(self, client: Client) -> dict[str, Any]:
        return {"alg": "RS256", "kid": self.provider.signing_key().kid}

    def get_client_claims(self, client: Client) -> dict[str, Any]:
        issuer = self.provider.id_token_issuer or self.provider.base
        return {"iss": issuer, "aud": [client.get_client_id()]}

    def exists_nonce(self, nonce: str, request: OAuth2Request) -> bool:
        return any(code.nonce == nonce for code in self.provider.codes.values())

    def generate_user_info(self, user: str, scope: str) -> UserInfo:
        return UserInfo(sub=user)


class Provider:
    """The provider; :attr:`app` is what to serve, :meth:`set_base` its URL once known.

    Args:
        audience: the ``aud`` of its access tokens.
        user: who signs in (``sub``).
    """

    def __init__(self, *, audience: str = "asbp", user: str = "operator") -> None:
        self.audience = audience
        self.user = user
        self.base = ""
        self.clients: dict[str, Client] = {}
        self.codes: dict[str, _Code] = {}
        self.issued: list[dict[str, Any]] = []
        self.jwks_fetches = 0
        #: The ``iss`` of its ID tokens when not its own (a test of the client's checks).
        self.id_token_issuer: str | None = None
        self._keys = KeySet([self._new_key("k1")])
        self._server = _Server(self)
        self._server.register_grant(_CodeGrant, [CodeChallenge(required=True), _IdToken(self)])
        self._server.register_token_generator("default", self._generate_token)
        self.app = Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self._discovery),
                Route("/authorize", self._authorize),
                Route("/token", self._token, methods=["POST"]),
                Route("/jwks", self._jwks),
            ]
        )

    @staticmethod
    def _new_key(kid: str) -> RSAKey:
        return RSAKey.generate_key(2048, parameters={"kid": kid}, private=True)

    def set_base(self, base: str) -> None:
        """The URL it is served at (the ``iss`` of its tokens)."""
        self.base = base.rstrip("/")

    def register(self, client: Client) -> None:
        self.clients[client.client_id] = client

    def signing_key(self) -> RSAKey:
        """The key tokens are signed with now."""
        key = self._keys.keys[0]
        assert isinstance(key, RSAKey)
        return key

    def rotate(self, kid: str) -> None:
        """Replace every signing key by a new one named ``kid``."""
        self._keys = KeySet([self._new_key(kid)])

    def sign(self, **claims: Any) -> str:
        """An access token signed with the current key, with ``claims`` added."""
        now = int(time.time())
        payload = {"iss": self.base, "aud": self.audience, "sub": self.user, "iat": now,
                   "exp": now + 300}  # fmt: skip
        payload.update(claims)
        key = self._keys.keys[0]
        return jwt.encode({"alg": "RS256", "kid": key.kid}, payload, self._keys)

    def _generate_token(
        self,
        grant_type: str,
        client: Client,
        user: str | None = None,
        scope: str | None = None,
        expires_in: int | None = None,
        include_refresh_token: bool = True,
    ) -> dict[str, Any]:
        token = self.sign(sub=user or self.user, scope=scope or "", client_id=client.client_id)
        return {"token_type": "Bearer", "access_token": token, "expires_in": 300,
                "scope": scope or ""}  # fmt: skip

    async def _discovery(self, request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": self.base,
                "authorization_endpoint": f"{self.base}/authorize",
                "token_endpoint": f"{self.base}/token",
                "jwks_uri": f"{self.base}/jwks",
                "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none", "client_secret_post"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
            }
        )

    async def _jwks(self, request: Request) -> Response:
        self.jwks_fetches += 1
        return JSONResponse(self._keys.as_dict(private=False))

    async def _authorize(self, request: Request) -> Response:
        oauth_request = _Request("GET", str(request.url), request.headers,
                                 dict(request.query_params))  # fmt: skip
        try:
            grant = self._server.get_consent_grant(request=oauth_request, end_user=self.user)
        except OAuth2Error as error:  # an unknown client, a redirect URI not registered
            refused: Response = self._server.handle_error_response(oauth_request, error)
            return refused
        response: Response = self._server.create_authorization_response(
            oauth_request, grant_user=self.user, grant=grant
        )
        return response

    async def _token(self, request: Request) -> Response:
        # Parsed here: Starlette's form parser needs python-multipart, which nothing else uses.
        form = dict(parse_qsl((await request.body()).decode()))
        oauth_request = _Request("POST", str(request.url), request.headers, form)
        response: Response = self._server.create_token_response(oauth_request)
        return response

"""The console's sign-in through the operator's OpenID Connect provider.

Theory of operation
-------------------
With ``[management] oidc_discovery_url`` and ``oidc_client_id`` set, the console
offers "Sign in": authorisation code with PKCE (RFC 7636, S256), run by
authlib's Starlette client.

1. ``GET /console/login`` asks authlib for the provider's authorisation URL
   (state, nonce and the PKCE verifier are made here) and redirects the browser
   there. authlib keeps the state, with the verifier, in ``request.session``;
   this module gives it one per sign-in, kept in the broker's memory under a
   random cookie (HttpOnly, SameSite=Lax, Secure under TLS, path ``/console/``),
   so the callback is accepted only from the browser that started the flow
   (RFC 6749 §10.12) and no secret travels in a cookie. At most
   :data:`MAX_PENDING` sign-ins wait at once, each :data:`PENDING_SECONDS` at
   most; the oldest goes first.
2. The provider signs the operator in and sends the browser back to
   ``GET /console/callback`` with a code; authlib checks the state and exchanges
   the code, with the verifier, for tokens.
3. The access token is handed to the page in the URL's *fragment*
   (``/console/#access_token=...``), which browsers never send to a server or
   in a ``Referer``; the page moves it to the tab's session storage and clears
   the fragment. From then on it is a bearer token like any other: the API
   checks it as an OAuth 2 resource server (gateway.api.access), so the
   provider must issue JWT access tokens for the configured ``audience`` with
   the read and write scopes.

Without OIDC configured, none of these routes exist and the console asks for
the admin token, as before. ``GET /console/auth.json`` tells the page which.

authlib's httpx client warns that it prefers ``httpx2`` when it is imported;
the broker uses ``httpx`` everywhere, which authlib still supports, so that one
warning is silenced where authlib is imported, and nowhere else.
"""

from __future__ import annotations

import secrets
import time
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from joserfc.errors import JoseError
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.config.errors import ConfigError
from gateway.config.model import ManagementConfig

__all__ = ["COOKIE", "MAX_PENDING", "PENDING_SECONDS", "ConsoleSignIn", "auth_route"]

#: Sign-ins started and not yet back, at most (the oldest is dropped first).
MAX_PENDING: Final = 1000
#: Seconds a started sign-in may take.
PENDING_SECONDS: Final = 600.0
#: The cookie naming a pending sign-in.
COOKIE: Final = "asbp-console-sign-in"
#: The name the provider is registered under in authlib.
_CLIENT: Final = "asbp"


def _oauth() -> Any:
    with warnings.catch_warnings():
        # authlib 1.9 prefers httpx2 and warns on importing its httpx client; we
        # use httpx (supported), so only that warning is silenced, only here.
        from authlib.deprecate import AuthlibDeprecationWarning

        warnings.filterwarnings(
            "ignore",
            message="The httpx module is deprecated",
            category=AuthlibDeprecationWarning,
        )
        from authlib.integrations.starlette_client import OAuth

    return OAuth()


def _read_secret(path: str) -> str:
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the console's client secret: {exc.strerror or exc}",
            key="management.oidc_client_secret_file",
        ) from exc
    if not secret:
        raise ConfigError(
            "the console's client secret file is empty", key="management.oidc_client_secret_file"
        )
    return secret


def auth_route(settings: ManagementConfig) -> Route:
    """``GET /console/auth.json``: how the console signs in (``{"oidc": bool}``)."""
    oidc = settings.oidc_discovery_url is not None

    async def auth(request: Request) -> Response:
        return JSONResponse({"oidc": oidc})

    return Route("/console/auth.json", auth)


class ConsoleSignIn:
    """The sign-in routes, when ``[management]`` configures OIDC.

    Raises:
        ConfigError: a discovery URL without a client id, or without the JWT
            checks (``jwks_url`` or ``jwks_file``, ``issuer``, ``audience``) that
            the tokens it brings must pass.
    """

    def __init__(self, settings: ManagementConfig) -> None:
        if not settings.oidc_client_id:
            raise ConfigError(
                "management.oidc_discovery_url needs management.oidc_client_id",
                key="management.oidc_client_id",
            )
        if not (settings.jwks_url or settings.jwks_file) or not (
            settings.issuer and settings.audience
        ):
            raise ConfigError(
                "the console's OIDC sign-in brings JWT access tokens: set "
                "management.jwks_url (or jwks_file), issuer and audience to check them",
                key="management.oidc_discovery_url",
            )
        secret = (
            _read_secret(settings.oidc_client_secret_file)
            if settings.oidc_client_secret_file
            else None
        )
        self._oauth = _oauth()
        self._oauth.register(
            name=_CLIENT,
            client_id=settings.oidc_client_id,
            client_secret=secret,
            server_metadata_url=settings.oidc_discovery_url,
            client_kwargs={
                "scope": settings.oidc_scope,
                "code_challenge_method": "S256",
                "token_endpoint_auth_method": "client_secret_post" if secret else "none",
            },
        )
        #: Pending sign-ins: cookie value -> (started at, authlib's session dict).
        self._pending: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/console/login", self.login),
            Route("/console/callback", self.callback),
        ]

    async def login(self, request: Request) -> Response:
        self._expire()
        while len(self._pending) >= MAX_PENDING:
            self._pending.popitem(last=False)
        key = secrets.token_urlsafe(32)
        session: dict[str, Any] = {}
        self._pending[key] = (time.monotonic(), session)
        request.scope["session"] = session
        redirect_uri = str(request.base_url).rstrip("/") + "/console/callback"
        client = self._oauth.create_client(_CLIENT)
        try:
            response: Response = await client.authorize_redirect(request, redirect_uri)
        except Exception as exc:  # the provider's discovery document: unreachable, bad
            del self._pending[key]
            return PlainTextResponse(
                f"the identity provider cannot be reached: {exc}", status_code=502
            )
        response.set_cookie(
            COOKIE,
            key,
            max_age=int(PENDING_SECONDS),
            path="/console/",
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
        )
        return response

    async def callback(self, request: Request) -> Response:
        self._expire()
        key = request.cookies.get(COOKIE, "")
        pending = self._pending.pop(key, None)
        if pending is None:
            return PlainTextResponse(
                "no sign-in was started from this browser (or it took too long): "
                "start again from /console/",
                status_code=400,
            )
        request.scope["session"] = pending[1]
        client = self._oauth.create_client(_CLIENT)
        from authlib.integrations.base_client import OAuthError

        try:
            token = await client.authorize_access_token(request)
        except (OAuthError, JoseError) as exc:
            # A refused code, a forged state, or an ID token that fails authlib's
            # checks (issuer, audience, nonce, signature: JoseError from joserfc).
            return PlainTextResponse(f"the sign-in failed: {exc}", status_code=400)
        except Exception as exc:  # the token endpoint: unreachable, or not JSON
            return PlainTextResponse(
                f"the identity provider cannot be reached: {exc}", status_code=502
            )
        access = token.get("access_token")
        if not isinstance(access, str) or not access:
            return PlainTextResponse("the identity provider sent no access token", status_code=502)
        # In the fragment: never sent to a server, never in a Referer.
        response = RedirectResponse(f"/console/#access_token={quote(access)}", status_code=303)
        response.delete_cookie(COOKIE, path="/console/")
        return response

    def _expire(self) -> None:
        limit = time.monotonic() - PENDING_SECONDS
        pending = self._pending
        while pending and next(iter(pending.values()))[0] < limit:
            pending.popitem(last=False)

"""The console's sign-in with an OpenID Connect provider, and the API's JWKS URL.

The provider is real: tests/support/oidc.py, built from authlib's own server
parts, served by Hypercorn on a free loopback port. The broker fetches its
discovery document and JWKS over HTTP, runs the authorisation code flow with
PKCE through authlib's Starlette client, and checks the access token it brings
as the API's resource server. The browser is httpx following the redirects by
hand, then headless Chromium clicking "Sign in" on the console itself.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx
import pytest

from gateway.config.errors import ConfigError
from gateway.config.model import ManagementConfig
from gateway.console.oidc import ConsoleSignIn
from tests.support import T, serve_app_async
from tests.support.gateway import BROKER_ID, Gateway, GatewayFactory
from tests.support.messaging import user
from tests.support.oidc import Client, Provider

pytestmark = pytest.mark.anyio

HERE = Path(__file__).resolve().parent
CLIENT_ID = "asbp-console"


@pytest.fixture
async def provider() -> AsyncIterator[Provider]:
    idp = Provider()
    async with serve_app_async(idp.app) as running:
        idp.set_base(running.http_url)
        yield idp


def management(idp: Provider, **overrides: Any) -> ManagementConfig:
    options: dict[str, Any] = {
        "jwks_url": f"{idp.base}/jwks",
        "issuer": idp.base,
        "audience": "asbp",
        "oidc_discovery_url": f"{idp.base}/.well-known/openid-configuration",
        "oidc_client_id": CLIENT_ID,
    }
    options.update(overrides)
    return ManagementConfig(**options)


async def signed_in_broker(make_gateway: GatewayFactory, idp: Provider) -> Gateway:
    gateway = await make_gateway(management=management(idp))
    idp.register(
        Client(
            client_id=CLIENT_ID,
            redirect_uris=[f"{gateway.server.http_url}/console/callback"],
            scope="openid asbp:read asbp:write",
        )
    )
    return gateway


async def api(gateway: Gateway, method: str, path: str, token: str | None) -> httpx.Response:
    client = await gateway.http_client()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return await client.request(method, f"{gateway.server.http_url}/api/v1{path}", headers=headers)


async def test_the_console_signs_in_with_pkce_and_the_token_works_on_the_api(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await signed_in_broker(make_gateway, provider)
    publisher = await user(gateway)
    await publisher.publish("jobs", b"x", type="QUEUE")
    browser = await gateway.http_client(follow_redirects=False)
    base = gateway.server.http_url

    assert (await browser.get(f"{base}/console/auth.json")).json() == {"oidc": True}
    started = await browser.get(f"{base}/console/login")
    assert started.status_code == 302
    authorize = urlsplit(started.headers["location"])
    asked = parse_qs(authorize.query)
    assert f"{authorize.scheme}://{authorize.netloc}" == provider.base
    assert (asked["client_id"], asked["code_challenge_method"]) == ([CLIENT_ID], ["S256"])
    assert asked["redirect_uri"] == [f"{base}/console/callback"]
    assert "code_verifier" not in asked  # the verifier stays with the broker
    cookie = started.cookies.get("asbp-console-sign-in")
    assert cookie and started.headers["set-cookie"].lower().count("httponly") == 1

    back = await browser.get(started.headers["location"])  # the provider signs in
    assert back.status_code == 302 and back.headers["location"].startswith(f"{base}/console/")
    landed = await browser.get(back.headers["location"])
    assert landed.status_code == 303
    location = landed.headers["location"]
    assert location.startswith("/console/#access_token=")
    token = unquote(location.split("=", 1)[1])
    # The token was the provider's, made by the code and its PKCE verifier; an ID
    # token came with it, which authlib checked (issuer, audience, nonce).
    assert [issued["access_token"] for issued in provider.issued] == [token]
    assert "id_token" in provider.issued[0]

    assert (await api(gateway, "GET", "/broker", token)).status_code == 200
    purged = await api(gateway, "POST", "/queues/jobs/purge", token)
    assert purged.json() == {"queue": "jobs", "removed": 1}
    await gateway.events.wait("management.write", action="queue.purge", principal="jwt:operator")

    # The callback is good once, and only in the browser that started the sign-in.
    again = await browser.get(back.headers["location"])
    assert again.status_code == 400
    stranger = await (await gateway.http_client(follow_redirects=False)).get(
        back.headers["location"]
    )
    assert stranger.status_code == 400


async def test_a_forged_state_or_a_refused_sign_in_gets_no_token(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await signed_in_broker(make_gateway, provider)
    browser = await gateway.http_client(follow_redirects=False)
    base = gateway.server.http_url
    started = await browser.get(f"{base}/console/login")
    assert started.status_code == 302
    forged = await browser.get(f"{base}/console/callback?code=made-up&state=made-up")
    assert forged.status_code == 400
    assert provider.issued == []

    # The provider refuses (an unknown client): the broker says so, and hands out nothing.
    provider.clients.clear()
    started = await browser.get(f"{base}/console/login")
    refused = await browser.get(started.headers["location"])
    assert refused.status_code >= 400
    assert provider.issued == []


async def test_an_id_token_from_another_issuer_fails_the_sign_in(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await signed_in_broker(make_gateway, provider)
    provider.id_token_issuer = "https://evil.test"
    browser = await gateway.http_client(follow_redirects=False)
    started = await browser.get(f"{gateway.server.http_url}/console/login")
    back = await browser.get(started.headers["location"])
    landed = await browser.get(back.headers["location"])
    assert (landed.status_code, landed.text[:20]) == (400, "the sign-in failed: "), landed.text


async def test_without_oidc_the_console_has_no_sign_in_routes(gateway: Gateway) -> None:
    client = await gateway.http_client(follow_redirects=False)
    base = gateway.server.http_url
    assert (await client.get(f"{base}/console/auth.json")).json() == {"oidc": False}
    assert (await client.get(f"{base}/console/login")).status_code == 404


async def test_the_jwks_url_is_fetched_and_followed_through_a_key_rotation(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await make_gateway(
        management=management(provider, jwks_refetch_interval=0.0, oidc_discovery_url=None)
    )
    first = provider.sign(scope="asbp:read")
    assert (await api(gateway, "GET", "/broker", first)).status_code == 200
    assert provider.jwks_fetches == 1
    assert (await api(gateway, "GET", "/broker", first)).status_code == 200
    assert provider.jwks_fetches == 1  # cached

    provider.rotate("k2")
    second = provider.sign(scope="asbp:read")
    assert (await api(gateway, "GET", "/broker", second)).status_code == 200
    assert provider.jwks_fetches == 2  # an unknown kid: fetched again
    retired = await api(gateway, "GET", "/broker", first)
    assert retired.status_code == 401  # its key is gone from the issuer's set


async def test_an_unknown_kid_refetches_at_most_once_per_interval(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await make_gateway(management=management(provider, oidc_discovery_url=None))
    assert (
        await api(gateway, "GET", "/broker", provider.sign(scope="asbp:read"))
    ).status_code == 200
    provider.rotate("k2")
    for _ in range(3):
        refused = await api(gateway, "GET", "/broker", provider.sign(scope="asbp:read"))
        assert refused.status_code == 401
    # The first unknown kid came within a minute of the first fetch: no flood of fetches.
    assert provider.jwks_fetches == 1


async def test_an_unreachable_jwks_url_refuses_every_token(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await make_gateway(
        management=management(provider, jwks_url="http://127.0.0.1:9/jwks", oidc_discovery_url=None)
    )
    refused = await api(gateway, "GET", "/broker", provider.sign(scope="asbp:read"))
    assert refused.status_code == 401
    assert "cannot be fetched" in refused.json()["detail"]


async def test_the_console_signs_in_through_the_provider_in_chromium(
    make_gateway: GatewayFactory, provider: Provider, tmp_path: Path
) -> None:
    assert shutil.which("node"), "node is required (apt-get install nodejs npm)"
    gateway = await signed_in_broker(make_gateway, provider)
    screenshot = tmp_path / "signed-in.png"
    process = await asyncio.create_subprocess_exec(
        "node",
        str(HERE / "oidc.mjs"),
        gateway.server.http_url,
        str(screenshot),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=HERE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60 * T)
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["broker"] == BROKER_ID
    assert result["hash"] == ""  # the token left the address bar
    assert result["token"] == provider.issued[0]["access_token"]
    assert screenshot.stat().st_size > 0


def test_a_sign_in_needs_a_client_and_the_jwt_checks(tmp_path: Path) -> None:
    discovery = "https://idp.test/.well-known/openid-configuration"
    checks: dict[str, Any] = {
        "jwks_url": "https://idp.test/jwks",
        "issuer": "https://idp.test",
        "audience": "a",
    }
    with pytest.raises(ConfigError, match="oidc_client_id"):
        ConsoleSignIn(ManagementConfig(oidc_discovery_url=discovery, **checks))
    with pytest.raises(ConfigError, match="jwks_url"):
        ConsoleSignIn(ManagementConfig(oidc_discovery_url=discovery, oidc_client_id="c"))
    secret = tmp_path / "secret"
    for content, problem in ((None, "cannot read"), ("", "empty")):
        if content is not None:
            secret.write_text(content)
        with pytest.raises(ConfigError, match=problem):
            ConsoleSignIn(
                ManagementConfig(oidc_discovery_url=discovery, oidc_client_id="c",
                                 oidc_client_secret_file=str(secret), **checks)
            )  # fmt: skip
    secret.write_text("a-confidential-client-secret\n")
    ConsoleSignIn(
        ManagementConfig(oidc_discovery_url=discovery, oidc_client_id="c",
                         oidc_client_secret_file=str(secret), **checks)
    )  # fmt: skip


async def test_an_unreachable_provider_is_a_clear_502(
    make_gateway: GatewayFactory, provider: Provider
) -> None:
    gateway = await make_gateway(
        management=management(
            provider, oidc_discovery_url="http://127.0.0.1:9/.well-known/openid-configuration"
        )
    )
    client = await gateway.http_client(follow_redirects=False)
    started = await client.get(f"{gateway.server.http_url}/console/login")
    assert started.status_code == 502
    assert "cannot be reached" in started.text

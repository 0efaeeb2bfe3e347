"""Which pages may use /asbp (gateway/transports/cors.py): CORS for HTTP Channels.

The WebSocket side (the Origin check on the handshake) is in
test_websocket_channels.py; pages in a real Chromium in tests/browser.
"""

from __future__ import annotations

import httpx
import pytest

import asbp
from gateway.transports.cors import allowed_origins, is_allowed
from tests.support.gateway import Gateway, GatewayFactory

pytestmark = pytest.mark.anyio

APP = "https://app.example.org"
EVIL = "https://evil.example.org"


@pytest.fixture
async def gateway(make_gateway: GatewayFactory) -> Gateway:
    return await make_gateway(cors_origins=f"{APP}/, https://admin.example.org")


def test_the_setting_reads_spaces_commas_and_final_slashes() -> None:
    assert allowed_origins(None) == frozenset()
    assert allowed_origins("https://a.example, https://b.example/  http://c:8080") == {
        "https://a.example",
        "https://b.example",
        "http://c:8080",
    }


def test_same_origin_any_origin_and_no_origin() -> None:
    assert is_allowed(None, "broker:8080", ())
    assert is_allowed("http://broker:8080", "broker:8080", ())
    assert is_allowed("https://BROKER:8080", "broker:8080", ())
    assert not is_allowed("http://broker:8081", "broker:8080", ())
    assert not is_allowed("null", "broker:8080", ())
    assert not is_allowed(EVIL, None, ())
    assert is_allowed(EVIL, "broker:8080", {"*"})


async def test_options_without_origin_lists_the_methods(gateway: Gateway) -> None:
    client = await gateway.http_client()
    response = await client.options(gateway.url)
    assert response.status_code == 204
    assert response.headers["allow"] == "GET, POST, OPTIONS"
    assert "access-control-allow-origin" not in response.headers


async def test_the_preflight_of_an_allowed_origin(gateway: Gateway) -> None:
    client = await gateway.http_client()
    response = await client.options(
        gateway.url,
        headers={"origin": APP, "access-control-request-method": "POST"},
    )
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == APP
    assert response.headers["access-control-allow-methods"] == "GET, POST"
    assert response.headers["access-control-allow-headers"] == "content-type, asbp-secret"
    assert response.headers["vary"] == "Origin"


async def test_a_foreign_origin_is_refused_before_anything_is_read(gateway: Gateway) -> None:
    client = await gateway.http_client()
    for response in (
        await client.options(gateway.url, headers={"origin": EVIL}),
        await client.post(gateway.url, content=b"c=asbp.ping;", headers={"origin": EVIL}),
        await client.get(f"{gateway.url}?i={'0' * 32}", headers={"origin": EVIL}),
    ):
        assert response.status_code == 403
        assert "access-control-allow-origin" not in response.headers
        fault = asbp.decode(response.content)
        assert (fault.name, fault.get("code")) == ("asbp.fault", "3201")


async def test_an_allowed_origin_sends_and_long_polls(gateway: Gateway) -> None:
    client = await gateway.http_client(headers={"origin": APP})
    accepted = await client.post(gateway.url, content=b"c=asbp.ping,u=1;hi")
    assert accepted.status_code == 200
    assert accepted.headers["access-control-allow-origin"] == APP
    assert accepted.headers["access-control-allow-credentials"] == "true"
    # Another site's page: its requests are cross-site, so the cookie must be too.
    cookie = accepted.headers["set-cookie"].lower()
    assert "samesite=none" in cookie and "secure" in cookie and "httponly" in cookie
    channel = asbp.decode(accepted.content).channel_id
    secret = accepted.headers["asbp-secret"]
    polled = await client.get(f"{gateway.url}?i={channel}&wait=5", headers={"asbp-secret": secret})
    assert polled.status_code == 200
    assert polled.headers["access-control-allow-origin"] == APP
    assert (
        polled.headers["access-control-expose-headers"] == "ASBP-Last-Seq, ASBP-Secret, ASBP-Lost"
    )
    assert b"c=asbp.pong,u=1;hi" in polled.content


async def test_the_broker_s_own_origin_needs_no_setting(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway()
    client = await gateway.http_client()
    host = httpx.URL(gateway.url).netloc.decode()
    same = await client.post(
        gateway.url, content=b"c=asbp.ping;", headers={"origin": f"http://{host}"}
    )
    assert same.status_code == 200
    other = await client.post(gateway.url, content=b"c=asbp.ping;", headers={"origin": APP})
    assert other.status_code == 403

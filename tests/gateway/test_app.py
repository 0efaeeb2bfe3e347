"""The app's own routes: liveness, readiness, and the Broker in the lifespan."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus

from asbp import Command
from gateway.app import _route_path
from tests.support.gateway import BROKER_ID, SERVERS, Gateway, GatewayFactory


@pytest.mark.anyio
@pytest.mark.parametrize("server_name", SERVERS)
async def test_healthz(gateway: Gateway) -> None:
    client = await gateway.http_client()
    response = await client.get(f"{gateway.server.http_url}/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.anyio
@pytest.mark.parametrize("server_name", SERVERS)
async def test_readyz_names_the_broker_and_counts_connections(gateway: Gateway) -> None:
    client = await gateway.http_client()
    readyz = f"{gateway.server.http_url}/readyz"
    response = await client.get(readyz)
    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "engine": True,
        "broker": BROKER_ID,
        "channels": 0,
        "tubes": 0,
    }

    await gateway.channel()
    await gateway.tube()
    response = await client.get(readyz)
    assert response.json() == {
        "ready": True,
        "engine": True,
        "broker": BROKER_ID,
        "channels": 1,
        "tubes": 1,
    }


@pytest.mark.anyio
async def test_broker_identity_persists_in_data_dir(
    make_gateway: GatewayFactory,
) -> None:
    first = await make_gateway(broker_id=None)
    client = await first.http_client()
    generated = (await client.get(f"{first.server.http_url}/readyz")).json()["broker"]
    assert generated != BROKER_ID
    assert len(generated) == 32

    second = await make_gateway(broker_id=None, server="uvicorn")
    client = await second.http_client()
    assert (await client.get(f"{second.server.http_url}/readyz")).json()["broker"] == generated
    channel = await second.channel()
    assert channel.greeting.get("b") == generated


@pytest.mark.anyio
async def test_two_apps_in_one_process_are_separate_brokers(make_gateway: GatewayFactory) -> None:
    # No module-level state: each app builds its own Broker in its own lifespan.
    first = await make_gateway(broker_id="first")
    second = await make_gateway(broker_id="second")
    await second.tube(serves=("quote",))
    user = await first.channel()
    assert user.greeting.get("b") == "first"
    reply = await user.request(Command(c="quote", u=1))
    assert reply.name == "asbp.fault"
    assert reply.get("code") == "2101"


@pytest.mark.anyio
@pytest.mark.parametrize("server_name", SERVERS)
async def test_a_websocket_elsewhere_still_goes_through_starlette(gateway: Gateway) -> None:
    # /asbp and /tube skip Starlette's stack (gateway.app._BrokerApp); any other
    # WebSocket path is Starlette's to refuse, as before.
    with pytest.raises(InvalidStatus) as refused:
        await gateway.websocket("/nowhere")
    assert refused.value.response.status_code == 403
    assert (await gateway.channel()).greeting.name == "asbp.channel"


def test_the_websocket_endpoints_are_found_below_a_root_path() -> None:
    # As Starlette's router matches: the path below root_path, when under it.
    assert _route_path({"path": "/bus/asbp", "root_path": "/bus"}) == "/asbp"
    assert _route_path({"path": "/asbp", "root_path": ""}) == "/asbp"
    assert _route_path({"path": "/asbp"}) == "/asbp"
    assert _route_path({"path": "/busasbp", "root_path": "/bus"}) == "/busasbp"
    assert _route_path({"path": "/tube", "root_path": "/bus"}) == "/tube"

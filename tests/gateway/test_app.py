"""The app's own routes: liveness, readiness, and the Broker in the lifespan."""

from __future__ import annotations

import pytest

from asbp import Command
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

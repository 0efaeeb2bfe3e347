"""Application-Agent Tubes (draft §2.3, §2.7): TLS, the credential, and Respondents."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from agents.credentials import bearer_subprotocol, mint_agent_token
from asbp import Command
from tests.gateway.conftest import (
    AUDIENCE,
    BROKER_ID,
    SERVERS,
    Gateway,
    GatewayFactory,
    Peer,
    assert_fault,
    decode,
)
from tests.support import ServerName, T, TlsFiles

pytestmark = pytest.mark.anyio


async def assert_refused(gateway: Gateway, status: int, code: int, **options: Any) -> None:
    """The handshake fails with ``status`` and a fault body; no Command ever flows."""
    with pytest.raises(InvalidStatus) as refused:
        await gateway.websocket("/tube", **options)
    response = refused.value.response
    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/asbp"
    fault = decode(response.body or b"")
    assert_fault(fault, code)
    if status == 401:  # the same words whatever the reason: probing learns nothing
        assert fault.body == b"authentication failed"


# --------------------------------------------------------------------------
# The handshake


@pytest.mark.parametrize("server_name", SERVERS)
async def test_greeting_carries_the_credentials_identity(gateway: Gateway) -> None:
    agent = await gateway.tube("search")
    greeting = agent.greeting
    assert greeting.name == "asbp.tube"
    assert greeting.get("a") == "search"
    assert greeting.get("b") == BROKER_ID
    tube_id = greeting.get("tube")
    assert isinstance(tube_id, str) and len(tube_id) == 32
    await gateway.events.wait("tube.open", tube=tube_id, agent="search")


async def test_a_claimed_a_is_replaced_by_the_verified_identity(gateway: Gateway) -> None:
    search = await gateway.tube("search", serves=("quote",))
    billing = await gateway.tube("billing")
    user = await gateway.channel()

    await billing.send(Command(c="quote", a="search", u=1))
    assert (await search.recv()).get("a") == "billing"

    await billing.send(Command({"c": "news", "a": "search", "d": user.id}, b"x"))
    assert (await user.recv()).get("a") == "billing"


Minter = Callable[[Gateway], str]

REFUSALS: dict[str, Minter] = {
    "expired": lambda g: g.token(now=time.time() - 600, lifetime=60),
    "bad_signature": lambda g: g.token("billing", key=g.keys.stranger),
    "unknown_identity": lambda g: mint_agent_token("nobody", g.keys.stranger, audience=AUDIENCE),
    "wrong_audience": lambda g: mint_agent_token(
        "billing", g.keys.private["billing"], audience="another-broker"
    ),
    "malformed": lambda g: "not-a-jwt",
}


@pytest.mark.parametrize("server_name", SERVERS)
@pytest.mark.parametrize("reason", REFUSALS)
async def test_bad_credential_is_refused_401(gateway: Gateway, reason: str) -> None:
    token = REFUSALS[reason](gateway)
    await assert_refused(
        gateway, 401, 3101, additional_headers={"Authorization": f"Bearer {token}"}
    )
    # The peer learns only "authentication failed"; the broker logs why.
    assert gateway.events.find("tube.refused", reason=reason)
    assert not gateway.events.find("tube.open")


@pytest.mark.parametrize("server_name", SERVERS)
async def test_missing_credential_is_refused_401(gateway: Gateway) -> None:
    await assert_refused(gateway, 401, 3101)
    assert gateway.events.find("tube.refused", reason="missing")


@pytest.mark.parametrize("server_name", SERVERS)
async def test_replayed_credential_is_refused_401(gateway: Gateway) -> None:
    token = gateway.token()
    first = await gateway.tube_connection(token=token)
    assert decode(await first.recv()).get("a") == "billing"
    await assert_refused(
        gateway, 401, 3101, additional_headers={"Authorization": f"Bearer {token}"}
    )
    assert gateway.events.find("tube.refused", reason="replayed")


async def test_no_agents_configured_refuses_every_tube(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(agents={})
    await assert_refused(
        gateway, 401, 3101, additional_headers={"Authorization": f"Bearer {gateway.token()}"}
    )


@pytest.mark.parametrize("server_name", SERVERS)
async def test_plaintext_tube_is_refused_403_without_the_dev_flag(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(server=server_name, insecure_dev_tubes=False)
    await assert_refused(
        gateway, 403, 3103, additional_headers={"Authorization": f"Bearer {gateway.token()}"}
    )
    assert gateway.events.find("tube.refused", reason="tls required")
    # User-Agent Channels need no TLS.
    user = await gateway.channel()
    assert (await user.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


@pytest.mark.parametrize("server_name", SERVERS)
async def test_tube_over_wss_is_accepted_without_the_dev_flag(
    make_gateway: GatewayFactory, server_name: ServerName, tls_files: TlsFiles
) -> None:
    gateway = await make_gateway(server=server_name, tls=tls_files, insecure_dev_tubes=False)
    assert gateway.server.ws_url.startswith("wss://")
    agent = await gateway.tube("billing", serves=("echo",))
    user = await gateway.channel()
    await user.send(Command({"c": "echo", "u": 1}, b"over tls"))
    forwarded = await agent.recv()
    await agent.send(Command({"c": "echo", "d": user.id, "u": 1}, forwarded.body))
    assert await user.recv() == Command({"c": "echo", "u": 1, "a": "billing"}, b"over tls")


async def test_wss_still_needs_a_credential(
    make_gateway: GatewayFactory, tls_files: TlsFiles
) -> None:
    gateway = await make_gateway(tls=tls_files, insecure_dev_tubes=False)
    await assert_refused(gateway, 401, 3101)


@pytest.mark.parametrize("server_name", SERVERS)
async def test_browser_form_bearer_subprotocol(gateway: Gateway) -> None:
    token = gateway.token("search")
    ws = await gateway.websocket("/tube", subprotocols=["asbp", bearer_subprotocol(token)])
    # The broker selects asbp and never echoes the credential.
    assert ws.subprotocol == "asbp"
    assert ws.response is not None
    assert ws.response.headers["Sec-WebSocket-Protocol"] == "asbp"
    assert token not in str(ws.response.headers)
    assert decode(await ws.recv()).get("a") == "search"


async def test_bearer_subprotocol_is_refused_when_replayed(gateway: Gateway) -> None:
    token = gateway.token()
    await gateway.websocket("/tube", subprotocols=["asbp", bearer_subprotocol(token)])
    await assert_refused(gateway, 401, 3101, subprotocols=["asbp", bearer_subprotocol(token)])


async def test_tube_refusal_is_logged_without_the_token(gateway: Gateway) -> None:
    token = REFUSALS["bad_signature"](gateway)
    with pytest.raises(InvalidStatus):
        await connect(
            f"{gateway.server.ws_url}/tube",
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=5 * T,
        )
    assert gateway.events.find("tube.refused", reason="bad_signature")
    for record in gateway.events.records:
        assert token not in record.getMessage()
        assert all(token not in str(value) for value in vars(record).values())


# --------------------------------------------------------------------------
# Respondents


async def test_register_and_unregister_are_acknowledged(gateway: Gateway) -> None:
    agent = await gateway.tube()
    user = await gateway.channel()

    accepted = await agent.request(Command(c="asbp.register", names=["quote", "order"], u=7))
    assert accepted == Command(
        c="asbp.accepted", cause="asbp.register", names=["quote", "order"], u=7
    )
    await user.send(Command(c="order", u=1))
    assert (await agent.recv()).name == "order"

    accepted = await agent.request(Command(c="asbp.unregister", names="order", u=8))
    assert accepted == Command(c="asbp.accepted", cause="asbp.unregister", names=["order"], u=8)
    assert_fault(await user.request(Command(c="order", u=2)), 2101, u=2)
    await user.send(Command(c="quote", u=3))
    assert (await agent.recv()).name == "quote"


async def test_reserved_names_cannot_be_registered(gateway: Gateway) -> None:
    agent = await gateway.tube()
    fault = await agent.request(Command(c="asbp.register", names=["quote", "asbp.ping"], u=9))
    assert_fault(fault, 3201, u=9)
    assert fault.get("cause") == "asbp.register"
    # All or nothing: quote was not registered either.
    commands = await agent.request(Command(c="asbp.commands"))
    assert b"quote" not in commands.body


async def test_register_needs_names(gateway: Gateway) -> None:
    agent = await gateway.tube()
    assert_fault(await agent.request(Command(c="asbp.register", u=10)), 1203, u=10)


async def test_closed_tube_takes_its_registrations_along(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("quote",))
    user = await gateway.channel()
    await agent.close()
    await gateway.events.wait("tube.close", tube=agent.greeting.get("tube"))
    assert_fault(await user.request(Command(c="quote", u=4)), 2101, u=4)


async def test_agent_may_talk_text_or_binary(gateway: Gateway) -> None:
    agent = await gateway.tube()
    await agent.send("c=asbp.ping,u=1;text")
    assert await agent.recv() == Command({"c": "asbp.pong", "u": 1}, b"text")
    await agent.send(b"c=asbp.ping,u=2;bin")
    assert await agent.recv() == Command({"c": "asbp.pong", "u": 2}, b"bin")


async def test_malformed_frame_from_an_agent_faults_and_the_tube_stays_open(
    gateway: Gateway,
) -> None:
    agent: Peer = await gateway.tube()
    assert_fault(await agent.request(b"u=5,c=x,=y;"), 1201, u=5)
    assert_fault(await agent.request(Command(u=6, x="no-name")), 1201, u=6)
    assert (await agent.request(Command(c="asbp.ping", u=7))).name == "asbp.pong"

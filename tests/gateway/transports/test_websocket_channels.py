"""User-Agent Channels over WebSocket (draft §2.1, §2.4), on Hypercorn and Uvicorn."""

from __future__ import annotations

import asyncio
import re

import pytest
from websockets.exceptions import InvalidStatus

import asbp
from asbp import Command
from tests.support import ServerName, T
from tests.support.gateway import BROKER_ID, SERVERS, Gateway, GatewayFactory, assert_fault

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("server_name", SERVERS)]

UUID_HEX = re.compile(r"[0-9a-f]{32}")


async def test_first_command_is_asbp_channel_with_a_unique_id(gateway: Gateway) -> None:
    users = [await gateway.channel() for _ in range(5)]
    for user in users:
        greeting = user.greeting
        assert greeting.name == "asbp.channel"
        assert greeting.get("b") == BROKER_ID
        assert UUID_HEX.fullmatch(user.id)
    assert len({user.id for user in users}) == len(users)


async def test_the_greeting_is_a_text_message(gateway: Gateway) -> None:
    # A browser's onmessage then sees a string, not a Blob (docs/protocol.md).
    ws = await gateway.websocket("/asbp")
    greeting = await asyncio.wait_for(ws.recv(), 5 * T)
    assert isinstance(greeting, str)
    assert asbp.decode(greeting.encode()).name == "asbp.channel"


async def test_a_foreign_origin_is_refused_and_an_allowed_one_served(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(server=server_name, cors_origins="https://app.example.org")
    with pytest.raises(InvalidStatus) as refused:
        await gateway.websocket("/asbp", origin="https://evil.example.org")
    assert refused.value.response.status_code == 403
    ws = await gateway.websocket("/asbp", origin="https://app.example.org")
    assert asbp.decode((await asyncio.wait_for(ws.recv(), 5 * T)).encode()).name == "asbp.channel"


async def test_subprotocol_asbp_is_selected_only_when_offered(gateway: Gateway) -> None:
    offered = await gateway.channel(subprotocols=["asbp"])
    assert offered.ws.subprotocol == "asbp"
    plain = await gateway.channel()
    assert plain.ws.subprotocol is None


async def test_text_message_is_one_command_answered_as_text(gateway: Gateway) -> None:
    user = await gateway.channel()
    await user.send("c=asbp.ping,u=1;hello; world")  # the body may hold ";"
    reply = await user.recv_raw()
    assert isinstance(reply, str)
    pong = asbp.decode(reply.encode())
    assert pong == Command({"c": "asbp.pong", "u": 1}, b"hello; world")


async def test_binary_message_is_one_command_answered_as_binary(gateway: Gateway) -> None:
    user = await gateway.channel()
    await user.send(b"c=asbp.ping,u=2;\x00\xff\xfe")
    reply = await user.recv_raw()
    assert isinstance(reply, bytes)
    assert asbp.decode(reply) == Command({"c": "asbp.pong", "u": 2}, b"\x00\xff\xfe")


async def test_answers_follow_the_kind_of_the_last_message(gateway: Gateway) -> None:
    user = await gateway.channel()
    await user.send("c=asbp.ping,u=1;")
    assert isinstance(await user.recv_raw(), str)
    await user.send(b"c=asbp.ping,u=2;")
    assert isinstance(await user.recv_raw(), bytes)
    await user.send("c=asbp.ping,u=3;")
    assert isinstance(await user.recv_raw(), str)


async def test_text_sender_gets_binary_when_the_answer_is_not_utf8(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("blob",))
    user = await gateway.channel()
    await user.send("c=blob,u=4;")
    request = await agent.recv()
    await agent.send(Command({"c": "blob", "d": user.id, "u": 4}, b"\x89PNG\xff"))
    assert request.channel_id == user.id
    reply = await user.recv_raw()
    assert isinstance(reply, bytes)
    assert asbp.decode(reply).body == b"\x89PNG\xff"


@pytest.mark.parametrize(
    ("frame", "code", "u"),
    [
        (b"u=7,c=echo,=x;", 1201, 7),  # a key missing
        (b"u=8,c=a b;", 1201, 8),  # whitespace outside quotes
        (b"c=x,u=9,c=y;", 1201, 9),  # a duplicate key
        (b"c=asbp.ping,u=10", 1201, None),  # no ";": no header, so no u either
        (b"u=11,c=x,i=nothex;", 1203, 11),  # a reserved key's rule
        (b"u=12;\xff", 1201, 12),  # decodes, but a User-Agent's Command needs c
        (b"+u=13,c=x\xff;", 1201, 13),  # "+u=": u first in a header marked UTF-8 that is not
    ],
)
async def test_malformed_frame_faults_and_the_channel_stays_open(
    gateway: Gateway, frame: bytes, code: int, u: int | None
) -> None:
    user = await gateway.channel()
    assert_fault(await user.request(frame), code, u=u)
    assert (await user.request(Command(c="asbp.ping", u=99))).name == "asbp.pong"


async def test_oversized_frame_faults_1101_and_the_channel_stays_open(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    limits = asbp.Limits(max_frame_bytes=1024, max_header_bytes=256)
    gateway = await make_gateway(server=server_name, limits=limits)
    user = await gateway.channel()
    assert_fault(await user.request(b"u=5,c=x;" + b"x" * 1024), 1101, u=5)
    assert_fault(await user.request(b"u=6,c=" + b"y" * 300 + b";"), 1104, u=6)
    # At the limit exactly: accepted (limits are inclusive).
    body = b"z" * (1024 - len(b"c=asbp.ping,u=7;"))
    assert await user.request(b"c=asbp.ping,u=7;" + body) == Command(
        {"c": "asbp.pong", "u": 7}, body
    )


async def test_every_reply_and_fault_carries_the_commands_u(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("echo",))
    user = await gateway.channel()

    assert (await user.request(Command(c="asbp.ping", u=0))).get("u") == "0"
    assert (await user.request(Command(c="asbp.commands", u=65535))).get("u") == "65535"
    assert_fault(await user.request(Command(c="nobody.serves.this", u=31)), 2101, u=31)
    assert_fault(await user.request(Command(c="echo", u=32, s="0" * 32)), 3201, u=32)
    assert_fault(await user.request(Command(u=33, x="no-name")), 1201, u=33)
    assert_fault(await user.request(b"u=34,c=echo,bad key=1;"), 1201, u=34)

    await user.send(Command({"c": "echo", "u": 35}, b"hi"))
    forwarded = await agent.recv()
    assert forwarded.get("u") == "35"
    await agent.send(Command({"c": "echo", "d": user.id, "u": 35}, forwarded.body))
    reply = await user.recv()
    assert reply.get("u") == "35"
    assert reply.body == b"hi"

    # Without u, nothing to carry.
    assert (await user.request(Command(c="asbp.ping"))).get("u") is None
    assert_fault(await user.request(Command(c="nobody.serves.this")), 2101)

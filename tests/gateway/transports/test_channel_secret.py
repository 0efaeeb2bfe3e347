"""The Channel secret of HTTP Channels: ``i`` alone reads, acknowledges and sends nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import asbp
from asbp import Command
from gateway.broker import Broker
from gateway.config.model import EventLogConfig
from gateway.eventlog.schema import FILE_GLOB
from tests.support import T
from tests.support.gateway import Gateway, GatewayFactory, HttpChannel, assert_fault, decode

pytestmark = pytest.mark.anyio


async def test_opening_issues_a_secret_in_the_command_a_header_and_a_cookie(
    gateway: Gateway,
) -> None:
    client = await gateway.http_client()
    response = await client.post(gateway.url, content=b"c=asbp.channel;")
    accepted = decode(response.content)
    secret = accepted.get("secret")
    assert isinstance(secret, str)
    assert len(secret) == 43  # 256 random bits, URL-safe base64
    assert response.headers["asbp-secret"] == secret
    cookie = response.headers["set-cookie"]
    name, _, rest = cookie.partition("=")
    assert name == f"asbp-{accepted.channel_id}"
    assert rest.startswith(secret + ";")
    attributes = {a.strip().lower() for a in rest.split(";")[1:]}
    assert {"httponly", "secure", "samesite=strict", "path=/asbp"} <= attributes
    # Later answers carry none: the secret is written once.
    user = HttpChannel(client, gateway.url, accepted.channel_id or "", secret=secret)
    later = await client.post(
        gateway.url,
        content=asbp.encode(Command(c="asbp.ping", i=user.id, u=1)),
        headers={"ASBP-Secret": secret},
    )
    assert later.status_code == 200
    assert "asbp-secret" not in later.headers and "set-cookie" not in later.headers
    assert decode(later.content).get("secret") is None
    # Two Channels, two secrets.
    other = await gateway.http_channel()
    assert other.secret != secret


async def test_i_alone_reads_acknowledges_and_sends_nothing(gateway: Gateway) -> None:
    owner = await gateway.http_channel()
    await owner.post(Command(c="asbp.ping", i=owner.id, u=1))
    client = await gateway.http_client()
    stranger = HttpChannel(client, gateway.url, owner.id)
    unknown = HttpChannel(client, gateway.url, "0" * 32, secret=owner.secret)
    refusals = []
    for secret in ("", "x" * 43, owner.secret[:-1] + ("A" if owner.secret[-1] != "A" else "B")):
        stranger.secret = secret
        status, fault = await stranger.post(Command(c="asbp.ping", i=owner.id, u=2))
        assert status == 404
        assert_fault(fault, 2104, u=2)
        refusals.append(fault.body)
        polled = await stranger.poll_response(after=5, wait=0)
        assert polled.status_code == 404
        assert_fault(decode(polled.content), 2104)
        refusals.append(decode(polled.content).body)
    # The same words as for a Channel that does not exist: nothing said about this one.
    status, fault = await unknown.post(Command(c="asbp.ping", i=unknown.id, u=2))
    assert status == 404
    assert set(refusals) == {fault.body}
    # The stranger's poll acknowledged nothing and its ping was never routed.
    assert [(seq, c.get("u")) for seq, c in await owner.poll(after=0)] == [(1, "1")]
    assert await owner.poll(wait=0) == []


async def test_the_cookie_is_proof_enough(gateway: Gateway) -> None:
    owner = await gateway.http_channel()
    client = await gateway.http_client()
    cookie = {"Cookie": f"asbp-{owner.id}={owner.secret}"}
    posted = await client.post(
        gateway.url,
        content=asbp.encode(Command(c="asbp.ping", i=owner.id, u=1)),
        headers={"Content-Type": "application/asbp", **cookie},
    )
    assert posted.status_code == 200
    polled = await client.get(gateway.url, params={"i": owner.id, "wait": "5"}, headers=cookie)
    assert polled.status_code == 200
    assert b"c=asbp.pong,u=1;" in polled.content
    # Another Channel's cookie proves nothing for this one.
    other = await gateway.http_channel()
    wrong = {"Cookie": f"asbp-{other.id}={other.secret}"}
    refused = await client.get(gateway.url, params={"i": owner.id, "wait": "0"}, headers=wrong)
    assert refused.status_code == 404


async def test_a_closed_channel_s_reason_is_told_only_to_its_owner(gateway: Gateway) -> None:
    owner = await gateway.http_channel()

    def close(broker: Broker) -> None:
        channel = broker.channels.get(owner.id)
        assert channel is not None
        broker.close_channel(channel, asbp.FaultCode.SLOW_CONSUMER)

    await gateway.call(close)
    status, fault = await owner.post(Command(c="asbp.ping", i=owner.id, u=1))
    assert status == 410
    assert_fault(fault, 2105, u=1)
    stranger = HttpChannel(owner.client, gateway.url, owner.id, secret="nope")
    status, fault = await stranger.post(Command(c="asbp.ping", i=owner.id, u=1))
    assert status == 404
    assert_fault(fault, 2104, u=1)


async def test_the_secret_never_reaches_agents_logs_or_the_event_log(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    gateway = await make_gateway(event_log=EventLogConfig())
    agent = await gateway.tube(serves=("echo",))
    owner = await gateway.http_channel()
    status, _ = await owner.post(Command({"c": "echo", "i": owner.id, "u": 1}, b"hello"))
    assert status == 200
    raw = await asyncio.wait_for(agent.recv_raw(), 5 * T)
    frame = raw.encode() if isinstance(raw, str) else raw
    assert owner.secret.encode() not in frame
    command = asbp.decode(frame)
    assert command.get("secret") is None
    await agent.send(Command({"c": "echo.reply", "d": owner.id, "u": 1}, b"hello"))
    assert [c.get("u") for _, c in await owner.poll()] == ["1"]

    def flush(broker: Broker) -> Any:
        assert broker.event_log is not None
        loop = asyncio.get_running_loop()
        return asyncio.run_coroutine_threadsafe(broker.event_log.flush(), loop)

    await asyncio.wait_for(asyncio.wrap_future(await gateway.call(flush)), 5 * T)
    files = sorted((tmp_path / "data" / "events").glob(FILE_GLOB))
    assert files, "the event log wrote nothing"
    written = b"".join(path.read_bytes() for path in files)
    assert owner.id.encode() in written  # the Channel is there...
    assert owner.secret.encode() not in written  # ...and its secret is not
    for record in gateway.events.records:
        text = record.getMessage() + repr(record.__dict__)
        assert owner.secret not in text


async def test_a_websocket_channel_s_greeting_carries_its_secret(gateway: Gateway) -> None:
    first = await gateway.channel()
    second = await gateway.channel()
    secrets = [first.greeting.get("secret"), second.greeting.get("secret")]
    assert all(isinstance(s, str) and len(s) == 43 for s in secrets)
    assert secrets[0] != secrets[1]

    def digest(broker: Broker) -> bytes:
        channel = broker.channels.get(first.id)
        assert channel is not None
        return channel.secret_digest

    kept = await gateway.call(digest)
    assert kept and kept != str(secrets[0]).encode()  # a digest, not the secret
    for record in gateway.events.records:
        assert str(secrets[0]) not in record.getMessage() + repr(record.__dict__)

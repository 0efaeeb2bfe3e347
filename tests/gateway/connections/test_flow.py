"""Flow control toward publishers (gateway/connections/flow.py).

An unpaced publisher of 64 KiB topic messages to 20 subscribers that read as
fast as they can: with flow control the broker reads the publisher only as fast
as the subscribers drain, so none is cut off and each gets every message, in
order. With one subscriber that stops reading, only that one is cut off (2105),
once the publisher has been held back for ``flow_stall_timeout``; the others
still get everything. The outboxes are small here (1 MiB, sixteen messages) so
that without flow control the first burst would overflow them all.
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.exceptions import ConnectionClosed

from asbp import Command
from gateway.config.model import ChannelLimits
from tests.support import ServerName, T
from tests.support.gateway import (
    SERVERS,
    Gateway,
    GatewayFactory,
    Peer,
    assert_fault,
    decode,
    small_receive_buffer_socket,
)

pytestmark = pytest.mark.anyio

SUBSCRIBERS = 20
MESSAGES = 60
BODY = 64 * 1024
TOPIC = "/flow"
#: The number of the last message of a run.
END = 999_999
#: Messages at most before a stalled reader must have been cut off.
MAX_FLOOD = 2000
LIMITS = ChannelLimits(outbox_frames=64, outbox_bytes=1024 * 1024, flow_stall_timeout=1.0 * T)


def body(n: int) -> bytes:
    return b"%06d" % n + b"x" * (BODY - 6)


async def subscribe(peer: Peer, u: int) -> None:
    reply = await peer.request(Command(c="asbp.subscribe", destination=TOPIC, u=u))
    assert reply.name == "asbp.accepted", reply


async def read_all(peer: Peer) -> list[int]:
    """The numbers of the messages ``peer`` gets, read as fast as it can."""
    got: list[int] = []
    while len(got) < MESSAGES:
        command = decode(await peer.ws.recv())
        assert command.name == "asbp.notification", command
        got.append(int(command.body[:6]))
    return got


async def publish_unpaced(publisher: Peer) -> None:
    for n in range(MESSAGES):
        await publisher.send(Command({"c": "asbp.publish", "destination": TOPIC}, body(n)))


async def start(
    make_gateway: GatewayFactory, server_name: ServerName
) -> tuple[Gateway, list[Peer]]:
    gateway = await make_gateway(server=server_name, channels=LIMITS)
    subscribers = [await gateway.channel(compression=None) for _ in range(SUBSCRIBERS)]
    for u, peer in enumerate(subscribers):
        await subscribe(peer, u)
    return gateway, subscribers


@pytest.mark.parametrize("server_name", SERVERS)
async def test_an_unpaced_publisher_cuts_off_no_reader_that_keeps_up(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway, subscribers = await start(make_gateway, server_name)
    publisher = await gateway.channel(compression=None)
    readers = [asyncio.create_task(read_all(peer)) for peer in subscribers]
    await publish_unpaced(publisher)
    got = await asyncio.wait_for(asyncio.gather(*readers), 60 * T)
    assert got == [list(range(MESSAGES))] * SUBSCRIBERS
    assert gateway.events.find("channel.slow_consumer") == []
    assert (await publisher.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


@pytest.mark.parametrize("server_name", SERVERS)
async def test_only_the_reader_that_stops_is_cut_off(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway, subscribers = await start(make_gateway, server_name)
    sock = small_receive_buffer_socket(gateway.server.port)
    ws = await gateway.websocket("/asbp", sock=sock, max_queue=1, compression=None)
    stalled = Peer(ws, decode(await ws.recv()))
    await subscribe(stalled, 99)
    publisher = await gateway.channel(compression=None)
    readers = [asyncio.create_task(read_until_end(peer)) for peer in subscribers]
    # Unpaced, until the stalled reader is cut off (the kernel's buffers take a
    # few MiB first), then an end marker.
    sent = 0
    while not gateway.events.find("channel.close", channel=stalled.id, code=2105):
        assert sent < MAX_FLOOD, "the stalled reader was never cut off"
        await publisher.send(Command({"c": "asbp.publish", "destination": TOPIC}, body(sent)))
        sent += 1
        if sent % 16 == 0:
            # A round trip now and then lets the broker's log reach the test.
            await publisher.request(Command(c="asbp.ping", u=1))
    await publisher.send(Command({"c": "asbp.publish", "destination": TOPIC}, body(END)))
    got = await asyncio.wait_for(asyncio.gather(*readers), 60 * T)
    assert got == [list(range(sent))] * SUBSCRIBERS
    cut = {record.__dict__["channel"] for record in gateway.events.find("channel.slow_consumer")}
    assert cut == {stalled.id}
    with pytest.raises(ConnectionClosed):
        while True:
            await asyncio.wait_for(stalled.ws.recv(), 10 * T)


async def read_until_end(peer: Peer) -> list[int]:
    got: list[int] = []
    while True:
        command = decode(await peer.ws.recv())
        assert command.name == "asbp.notification", command
        n = int(command.body[:6])
        if n == END:
            return got
        got.append(n)


async def test_an_http_publisher_gets_429_with_2109_until_its_destination_drains(
    make_gateway: GatewayFactory,
) -> None:
    # Eight Commands per outbox: over half is five.
    gateway = await make_gateway(channels=ChannelLimits(outbox_frames=8))
    subscriber = await gateway.http_channel()
    status, _ = await subscriber.post(
        Command(c="asbp.subscribe", i=subscriber.id, destination=TOPIC, u=1)
    )
    assert status == 200
    assert [c.name for _, c in await subscriber.poll()] == ["asbp.accepted"]
    assert await subscriber.poll(wait=0) == []  # acknowledges it: the mailbox is empty
    publisher = await gateway.http_channel()
    for u in range(1, 6):
        status, _ = await publisher.post(
            Command({"c": "asbp.publish", "i": publisher.id, "destination": TOPIC, "u": u}, b"m")
        )
        assert status == 200
    # Each publication's answer means the engine has it; its delivery to the
    # subscriber, which does not poll, was scheduled before that answer.
    answers = await publisher.poll()
    assert [c.get("u") for _, c in answers] == ["1", "2", "3", "4", "5"]

    response = await publisher.client.post(
        gateway.url,
        content=b"c=asbp.publish,i=%s,destination=%s,u=6;m"
        % (publisher.id.encode(), TOPIC.encode()),
        headers={"Content-Type": "application/asbp", "ASBP-Secret": publisher.secret},
    )
    assert response.status_code == 429
    assert int(response.headers["retry-after"]) >= 1
    assert_fault(decode(response.content), 2109, u=6)

    # The subscriber reads: the publisher may send again, and nothing was lost.
    assert len(await subscriber.poll()) == 5
    await subscriber.poll(wait=0)  # acknowledges them
    status, _ = await publisher.post(
        Command({"c": "asbp.publish", "i": publisher.id, "destination": TOPIC, "u": 7}, b"m")
    )
    assert status == 200
    assert not gateway.events.find("channel.slow_consumer")

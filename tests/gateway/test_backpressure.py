"""Backpressure: a reader that stops reading is cut off; nobody else notices.

How a client "stops reading" here: the ``websockets`` client pauses reading its socket
once more than ``max_queue`` messages wait in its buffer, so a test that never calls
``recv()`` leaves the broker's data in the kernel. Its socket is made with a small fixed
``SO_RCVBUF`` (see :func:`small_receive_buffer_socket`), so the kernel's buffers fill
after a few hundred KiB instead of tens of MiB; then the broker's writes block, its
outbox for that Channel fills, and the router closes the Channel with fault 2105. The
flood is paced by the other member of the group, which must receive every message
before the next is sent, so only the stalled reader can fall behind.

The stalled client turns off permessage-deflate: with context takeover, a repeated body
compresses to a few bytes per message, and the flood would never fill anything.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from websockets.exceptions import ConnectionClosed

from asbp import Command
from gateway.config.model import ChannelLimits, TubeLimits
from tests.gateway.conftest import (
    SERVERS,
    Gateway,
    GatewayFactory,
    Peer,
    decode,
    small_receive_buffer_socket,
)
from tests.support import ServerName, T

pytestmark = pytest.mark.anyio

#: Bounds of every Channel's outbox in these tests.
OUTBOX_FRAMES = 8
#: Body of each flooded Command.
BODY = b"x" * 16 * 1024
#: Enough to fill any loopback buffers with a fixed receive buffer, many times over.
MAX_FLOOD = 2000


async def stalled_channel(gateway: Gateway) -> Peer:
    """A WebSocket Channel whose client reads its greeting and then stops reading."""
    sock = small_receive_buffer_socket(gateway.server.port)
    ws = await gateway.websocket("/asbp", sock=sock, max_queue=1, compression=None)
    greeting = decode(await ws.recv())
    return Peer(ws, greeting)


@pytest.mark.parametrize("server_name", SERVERS)
async def test_websocket_reader_that_stops_reading_is_closed_with_2105(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(
        server=server_name,
        channels=ChannelLimits(outbox_frames=OUTBOX_FRAMES, outbox_bytes=1024 * 1024),
    )
    agent = await gateway.tube()
    reader = await gateway.channel()
    stalled = await stalled_channel(gateway)
    await agent.request(Command(c="asbp.join", groups="room", channels=[reader.id, stalled.id]))

    sent = 0
    for sequence in itertools.count():
        assert sequence < MAX_FLOOD, "the stalled reader was never cut off"
        await agent.send(Command({"c": "flood", "g": "room", "n": str(sequence)}, BODY))
        sent += 1
        received = await reader.recv()
        assert received.get("n") == str(sequence)  # the reader misses nothing
        if gateway.events.find("channel.slow_consumer", channel=stalled.id):
            break
    await gateway.events.wait("channel.close", channel=stalled.id, code=2105)

    # The broker dropped the stalled Channel's outbox; the group goes on without it.
    assert await gateway.call(lambda broker: broker.channels.get(stalled.id)) is None
    for sequence in range(sent, sent + 3 * OUTBOX_FRAMES):
        await agent.send(Command({"c": "flood", "g": "room", "n": str(sequence)}, BODY))
        assert (await reader.recv()).get("n") == str(sequence)
    assert (await reader.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"
    assert (await agent.request(Command(c="asbp.ping", u=2))).name == "asbp.pong"

    # Still not reading, the stalled client sends on: a closed Channel routes nothing.
    await agent.send(Command(c="asbp.register", names="work"))
    await stalled.send(Command(c="work", u=1))
    finished = gateway.finished(stalled.ws)

    # Reading again, the stalled client gets what was already on its way, in order, and
    # then the close: 1008 with the fault code first in the reason.
    numbers: list[int] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            numbers.append(int(str((await stalled.recv()).get("n"))))
    assert numbers == list(range(len(numbers)))
    assert len(numbers) < sent  # the rest was dropped, not buffered
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert closed.value.rcvd.reason.startswith("2105")

    await asyncio.wait_for(finished.wait(), 5 * T)  # the broker has read all it sent
    assert (await agent.recv()).name == "asbp.accepted"
    assert (await agent.request(Command(c="asbp.ping"))).name == "asbp.pong"


async def test_http_mailbox_nobody_polls_is_closed_and_the_next_poll_gets_410(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway(channels=ChannelLimits(outbox_frames=OUTBOX_FRAMES))
    agent = await gateway.tube()
    reader = await gateway.channel()
    idle = await gateway.http_channel()
    await agent.request(Command(c="asbp.join", groups="room", channels=[reader.id, idle.id]))
    for sequence in range(OUTBOX_FRAMES + 1):
        await agent.send(Command({"c": "flood", "g": "room", "n": str(sequence)}, b"x"))
        assert (await reader.recv()).get("n") == str(sequence)
    await gateway.events.wait("channel.close", channel=idle.id, code=2105)

    response = await idle.poll_response()
    assert response.status_code == 410
    fault = decode(response.content)
    assert (fault.name, fault.get("code")) == ("asbp.fault", "2105")
    status, fault = await idle.post(Command(c="asbp.ping", i=idle.id, u=1))
    assert (status, fault.get("code"), fault.get("u")) == (410, "2105", "1")
    assert (await reader.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


async def test_mailbox_within_bounds_keeps_everything(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(channels=ChannelLimits(outbox_frames=OUTBOX_FRAMES))
    agent = await gateway.tube()
    user = await gateway.http_channel()
    for sequence in range(OUTBOX_FRAMES):
        await agent.send(Command({"c": "n", "d": user.id, "n": str(sequence)}, b"x"))
    await agent.request(Command(c="asbp.ping", u=1))  # the agent's Commands are routed
    assert [c.get("n") for _, c in await user.poll()] == [str(n) for n in range(OUTBOX_FRAMES)]
    # Acknowledged frames free their room.
    assert await user.poll(wait=0) == []  # acknowledges the eight
    for sequence in range(OUTBOX_FRAMES):
        await agent.send(Command({"c": "n", "d": user.id, "n": str(sequence)}, b"x"))
    await agent.request(Command(c="asbp.ping", u=2))
    assert len(await user.poll()) == OUTBOX_FRAMES


@pytest.mark.parametrize("server_name", SERVERS)
async def test_tube_that_stops_reading_is_closed_with_2105(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(
        server=server_name,
        tubes=TubeLimits(outbox_frames=OUTBOX_FRAMES, respondent_timeout=60),
        channels=ChannelLimits(max_in_flight=MAX_FLOOD),
    )
    sock = small_receive_buffer_socket(gateway.server.port)
    stalled_ws = await gateway.tube_connection(sock=sock, max_queue=1, compression=None)
    stalled = Peer(stalled_ws, decode(await stalled_ws.recv()))
    assert (await stalled.request(Command(c="asbp.register", names="work"))).name == (
        "asbp.accepted"
    )
    tube_id = stalled.greeting.get("tube")
    user = await gateway.channel()

    sent = 0
    faults: list[Command] = []
    for sequence in itertools.count():
        assert sequence < MAX_FLOOD, "the stalled Tube was never cut off"
        await user.send(Command({"c": "work", "u": sequence}, BODY))
        sent += 1
        # The answer to a ping proves the work Command before it was routed; faults
        # that routing produced arrive first.
        await user.send(Command(c="asbp.ping"))
        while (received := await user.recv()).name != "asbp.pong":
            faults.append(received)
        if gateway.events.find("tube.slow_consumer", tube=tube_id):
            break
    await gateway.events.wait("tube.close", tube=tube_id)
    # Everything the User-Agent was waiting for is faulted, never silently lost.
    assert {f.get("code") for f in faults} == {"2102"}
    assert sorted(f.command_id or 0 for f in faults) == list(range(sent))
    assert (await user.request(Command(c="work", u=1))).get("code") == "2101"

    # Still not reading, the stalled agent sends on: a closed Tube can neither register
    # again (and swallow Commands) nor deliver to Channels.
    await stalled.send(Command(c="asbp.register", names="other"))
    await stalled.send(Command(c="news", d=user.id))
    finished = gateway.finished(stalled.ws)

    numbers: list[int] = []
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            command = await stalled.recv()
            numbers.append(command.command_id or 0)
    assert len(numbers) < sent
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008
    assert closed.value.rcvd.reason.startswith("2105")

    await asyncio.wait_for(finished.wait(), 5 * T)  # the broker has read all it sent
    fault = await user.request(Command(c="other", u=2))  # and no "news" before it
    assert (fault.name, fault.get("code")) == ("asbp.fault", "2101")

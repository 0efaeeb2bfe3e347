"""Many forwards made in one loop turn, the same on every plane.

On Redis, the forwards to one broker made while a pipeline waits become one
script call and one stream entry (gateway.plane.redis.batches): whatever the
packing, each must arrive whole, once, in the order made, and a forward to a
dead broker must still say so for every Command in the batch.
"""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest

from gateway.plane.base import Envelope, EnvelopeKind
from tests.support import T
from tests.support.planes import Broker, Bus

pytestmark = pytest.mark.anyio

ONE = "0123456789abcdef0123456789abcdef"
TWO = "fedcba9876543210fedcba9876543210"
#: More than one batch holds (gateway.plane.redis.batches.MAX_ENVELOPES).
MANY = 600


async def received(broker: Broker, count: int) -> list[Envelope]:
    out = []
    with anyio.fail_after(10 * T):
        for _ in range(count):
            out.append(await broker.inbound.get())
    return out


async def test_requests_made_in_one_turn_arrive_whole_once_and_in_order(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.serving("echo")
    await b.plane.written()
    sent = [
        Envelope(
            EnvelopeKind.REQUEST if n % 3 else EnvelopeKind.LOGGED_REQUEST,
            "broker-a",
            ONE if n % 2 else TWO,
            b"c=echo,u=%d;" % n + bytes(range(256)) * (n % 5),
            ("agent-1", "agent-2") if n % 7 == 0 else (),
        )
        for n in range(MANY)
    ]
    # No await in between: on Redis they all wait for the same pipelines.
    placed = [a.plane.forward_request("echo", envelope) for envelope in sent]
    assert await asyncio.gather(*placed) == ["broker-b"] * MANY
    assert await received(b, MANY) == sent


async def test_frames_for_channels_made_in_one_turn_arrive_in_order_per_channel(
    bus: Bus,
) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    frames = [
        Envelope(EnvelopeKind.CHANNEL, "broker-b", ONE if n % 2 else TWO, b"c=x,u=%d;" % n)
        for n in range(MANY)
    ]
    # Another kind in between, and a forward by the directory: still in the order made.
    a.plane.channel_opened(ONE)
    a.plane.channel_opened(TWO)
    await a.plane.written()
    sends = [b.plane.send_to("broker-a", envelope) for envelope in frames[:200]]
    leave = Envelope(EnvelopeKind.LEAVE, "broker-b", ONE, b"", ("room",))
    sends.append(b.plane.send_to("broker-a", leave))
    sends += [b.plane.send_to("broker-a", envelope) for envelope in frames[200:400]]
    again = Envelope(EnvelopeKind.CHANNEL, "broker-b", ONE, b"c=by-the-directory;")
    found = b.plane.forward_to_channel(ONE, again)
    sends += [b.plane.send_to("broker-a", envelope) for envelope in frames[400:]]
    assert all(await asyncio.gather(*sends))
    assert await found == "broker-a"
    expected = [*frames[:200], leave, *frames[200:400], again, *frames[400:]]
    got = await received(a, len(expected))
    assert again in got
    if bus.kind == "redis-cluster":
        # There a forward by the directory is a lookup, then a send made once the
        # lookup is answered: sends made meanwhile go first (as they always did).
        got.remove(again)
        expected.remove(again)
    # The promise is per Channel (each Channel's frames in the order made), not
    # across Channels.
    for channel in (ONE, TWO):
        assert [e for e in got if e.channel == channel] == [
            e for e in expected if e.channel == channel
        ]


async def test_a_batch_to_a_dead_broker_fails_every_command_in_it(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.serving("echo")
    b.plane.channel_opened(ONE)
    await b.plane.written()
    request = Envelope(EnvelopeKind.REQUEST, "broker-a", TWO, b"c=echo;")
    assert await a.plane.forward_request("echo", request) == "broker-b"  # now a peer
    await b.abandon()
    died = time.monotonic()
    with anyio.fail_after(b.plane.lease + 5 * T):
        assert await a.lost.get() == "broker-b"
    assert time.monotonic() - died <= b.plane.lease + T
    placed = [a.plane.forward_request("echo", request) for _ in range(50)]
    frame = Envelope(EnvelopeKind.CHANNEL, "broker-a", ONE, b"c=echo.reply;")
    sent = [a.plane.send_to("broker-b", frame) for _ in range(50)]
    assert await asyncio.gather(*placed) == [None] * 50
    assert await asyncio.gather(*sent) == [False] * 50


async def test_what_a_sender_says_beside_a_frame_arrives_with_it_or_not_at_all(
    bus: Bus,
) -> None:
    # A request's name and u, a whole answer's u (Envelope.name, command_id): the
    # receiver skips decoding with them, so they must be the frame's own when they
    # arrive; a plane may drop them (Redis where it splits a call, a cluster's
    # requests), never change them. A whole answer's u arrives on every plane.
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.serving("echo")
    await b.plane.written()
    requests = [
        Envelope(
            EnvelopeKind.REQUEST,
            "broker-a",
            ONE,
            b"c=echo;" if n % 4 == 3 else b"c=echo,u=%d;" % n,
            (),
            "echo",
            None if n % 4 == 3 else n,
        )
        for n in range(40)
    ]
    placed = [a.plane.forward_request("echo", envelope) for envelope in requests]
    assert await asyncio.gather(*placed) == ["broker-b"] * len(requests)
    got = await received(b, len(requests))
    for sent, arrived in zip(requests, got, strict=True):
        assert arrived in (sent, sent._replace(name=None, command_id=None))
    answers = [
        Envelope(
            EnvelopeKind.CHANNEL, "broker-b", ONE, b"c=r,u=%d;" % n, (), None, n if n % 2 else None
        )
        for n in range(40)
    ]
    a.plane.channel_opened(ONE)
    await a.plane.written()
    assert all(await asyncio.gather(*(b.plane.send_to("broker-a", e) for e in answers)))
    assert await received(a, len(answers)) == answers

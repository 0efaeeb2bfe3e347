"""Claiming a Channel whose holder died: one broker wins, on every plane."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.plane.base import Envelope, EnvelopeKind
from tests.support import T
from tests.support.planes import Bus

pytestmark = pytest.mark.anyio

CHANNEL = "0123456789abcdef0123456789abcdef"


async def test_a_live_holder_keeps_its_channel_and_a_free_one_is_taken(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    a.plane.channel_opened(CHANNEL)
    await a.plane.written()
    # A live holder: the claim changes nothing and names it.
    assert await b.plane.claim_channel(CHANNEL) == "broker-a"
    assert await b.plane.locate_channel(CHANNEL) == "broker-a"
    # Its own holder's claim is a no-op win.
    assert await a.plane.claim_channel(CHANNEL) == "broker-a"
    # A Channel nobody holds goes to the claimant, found there by every broker.
    assert await b.plane.claim_channel("f" * 32) == "broker-b"
    assert await a.plane.locate_channel("f" * 32) == "broker-b"
    assert await a.plane.claim_channel("f" * 32) == "broker-b"


async def test_of_two_brokers_claiming_a_dead_holders_channel_at_once_one_wins(
    bus: Bus,
) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    channels = [f"{n:032x}" for n in range(8)]
    for channel_id in channels:
        a.plane.channel_opened(channel_id)
    await a.plane.written()
    # Peers of A's (they sent to it), so that each reports it lost once its lease is gone.
    for visitor in (b, c):
        assert await visitor.plane.send_to("broker-a", Envelope(EnvelopeKind.TUBE, "x", "t", b""))
    await a.abandon()
    with anyio.fail_after(a.plane.lease + 5 * T):
        assert await b.lost.get() == "broker-a"
        assert await c.lost.get() == "broker-a"
    for channel_id in channels:
        # Both claims are made before either is answered (one pipeline each on Redis).
        won = await asyncio.gather(
            b.plane.claim_channel(channel_id), c.plane.claim_channel(channel_id)
        )
        assert won[0] == won[1], won
        assert won[0] in {"broker-b", "broker-c"}
        assert await b.plane.locate_channel(channel_id) == won[0]
        assert await c.plane.locate_channel(channel_id) == won[0]
    # The winners' entries are theirs: closing one unlists it, as for a Channel opened there.
    owner = {"broker-b": b, "broker-c": c}[await b.plane.locate_channel(channels[0]) or ""]
    owner.plane.channel_closed(channels[0])
    await owner.plane.written()
    assert await b.plane.locate_channel(channels[0]) is None


async def test_a_logs_holder_and_a_brokers_lease_are_read_from_anywhere(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    log = a.plane.channel_log
    await log.open(CHANNEL, digest=b"d" * 32, idle=60.0)
    assert await b.plane.channel_log.holder(CHANNEL) == ""
    await log.hold(CHANNEL)
    # What a resume at B waits on: A's release, after A's last appends.
    assert await b.plane.channel_log.holder(CHANNEL) == "broker-a"
    await log.held_append(CHANNEL, [b"c=one;"])
    await log.release(CHANNEL)
    assert await b.plane.channel_log.holder(CHANNEL) == ""
    assert await b.plane.channel_log.holder("e" * 32) == ""
    assert await b.plane.alive("broker-a")
    assert not await b.plane.alive("broker-z")

"""The routing plane's address index (Conversation-Addresses, courses/), on every plane."""

from __future__ import annotations

import anyio
import pytest

from gateway.plane.base import Envelope, EnvelopeKind
from tests.support import T
from tests.support.planes import Bus

pytestmark = pytest.mark.anyio

ALICE = "alice*example.org"
BOB = "bob*example.org"


async def test_an_address_is_found_at_every_broker_holding_it_until_released(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    c = await bus.join("broker-c")
    b.plane.address_held(ALICE)
    c.plane.address_held(ALICE)
    c.plane.address_held(BOB)
    await b.plane.written()
    await c.plane.written()
    assert await a.plane.address_brokers(ALICE) == {"broker-b", "broker-c"}
    assert await a.plane.address_brokers(BOB) == {"broker-c"}
    assert await a.plane.address_brokers("nobody*example.org") == frozenset()
    c.plane.address_released(ALICE)
    await c.plane.written()
    assert await a.plane.address_brokers(ALICE) == {"broker-b"}
    assert await b.plane.address_brokers(BOB) == {"broker-c"}
    b.plane.address_released(ALICE)
    b.plane.address_released(ALICE)  # twice, as after a lease renewed: harmless
    await b.plane.written()
    assert await a.plane.address_brokers(ALICE) == frozenset()


async def test_an_addressed_envelope_reaches_the_holder_intact(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.address_held(ALICE)
    await b.plane.written()
    (holder,) = await a.plane.address_brokers(ALICE)
    frame = b"c=chat,r=[alice*example.org,bob*example.org],p=carol*example.org;hi\x00\xff"
    sent = Envelope(EnvelopeKind.ADDRESSED, "broker-a", "", frame, (ALICE, "x,y*example.org"))
    assert await a.plane.send_to(holder, sent)
    with anyio.fail_after(5 * T):
        assert await b.inbound.get() == sent


async def test_a_dead_brokers_addresses_drop_out_within_its_lease(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.address_held(ALICE)
    b.plane.channel_opened("0" * 32)
    await b.plane.written()
    assert await a.plane.address_brokers(ALICE) == {"broker-b"}
    envelope = Envelope(EnvelopeKind.ADDRESSED, "broker-a", "", b"c=chat;", (ALICE,))
    assert await a.plane.send_to("broker-b", envelope)  # now a peer of A
    await b.abandon()
    lease: float = a.plane.lease
    with anyio.fail_after(lease + 5 * T):
        assert await a.lost.get() == "broker-b"
    assert await a.plane.address_brokers(ALICE) == frozenset()
    assert not await a.plane.send_to("broker-b", envelope)


async def test_a_broker_that_leaves_takes_its_addresses_along(bus: Bus) -> None:
    a = await bus.join("broker-a")
    b = await bus.join("broker-b")
    b.plane.address_held(ALICE)
    b.plane.address_held(BOB)
    await b.plane.written()
    await b.plane.close()
    assert await a.plane.address_brokers(ALICE) == frozenset()
    assert await a.plane.address_brokers(BOB) == frozenset()

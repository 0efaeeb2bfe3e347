"""FlowGate and the outboxes' water marks on their own (gateway/connections/flow.py)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.connections import flow
from gateway.connections.flow import PUBLISHER, FlowGate, TopicOrigins
from gateway.connections.outboxes import Mailbox, StreamOutbox

pytestmark = pytest.mark.anyio


def offer_as(gate: FlowGate, outbox: StreamOutbox | Mailbox, count: int) -> None:
    previous, PUBLISHER.gate = PUBLISHER.gate, gate
    try:
        for _ in range(count):
            assert outbox.offer(b"x")
    finally:
        PUBLISHER.gate = previous


async def test_over_half_blocks_the_publisher_until_under_a_quarter() -> None:
    gate, outbox = FlowGate(), StreamOutbox(8, 1 << 20)
    offer_as(gate, outbox, 4)
    assert not gate.blocked  # half is not over half
    offer_as(gate, outbox, 1)
    assert gate.blocked and gate.held
    await outbox.take()  # drained
    assert not gate.blocked
    await asyncio.wait_for(gate.wait(1.0), 1.0)  # open: returns at once


async def test_bytes_count_too_and_a_mailbox_drains_by_acknowledgement() -> None:
    gate, mailbox = FlowGate(), Mailbox(100, 40)
    offer_as(gate, mailbox, 21)  # 21 bytes: over half of 40
    assert gate.blocked
    mailbox.acknowledge(5)  # 16 bytes left: over a quarter
    assert gate.blocked
    mailbox.acknowledge(11)  # 10 left
    assert not gate.blocked


async def test_a_stalled_outbox_is_given_up_until_it_drains() -> None:
    gate, outbox = FlowGate(), StreamOutbox(8, 1 << 20)
    offer_as(gate, outbox, 5)
    await asyncio.wait_for(gate.wait(0.01), 1.0)  # gives up after the stall timeout
    assert not gate.blocked
    offer_as(gate, outbox, 3)  # held back for it no more: it fills
    assert not gate.blocked
    assert not outbox.offer(b"x")  # full: its reader is cut off, as before
    await outbox.take()
    offer_as(gate, outbox, 5)  # drained once: it counts again
    assert gate.blocked
    outbox.close()  # a closed outbox holds nobody
    assert not gate.blocked


async def test_its_own_outbox_holds_no_publisher_back() -> None:
    gate, outbox = FlowGate(), StreamOutbox(8, 1 << 20)
    gate.own = outbox
    offer_as(gate, outbox, 8)
    assert not gate.blocked


async def test_topic_messages_pending_delivery_hold_the_publisher() -> None:
    gate, origins = FlowGate(), TopicOrigins()
    for n in range(flow.MAX_PENDING + 1):
        origins.remember(f"m{n}", gate)
    assert gate.held and not gate.blocked
    waiting = asyncio.ensure_future(gate.wait(5.0))
    await asyncio.sleep(0)
    assert origins.take("m0") is gate  # delivered: one fewer pending
    await asyncio.wait_for(waiting, 1.0)
    assert origins.take("m0") is None  # asked once
    gate.give_up()
    assert gate.pending == 0
    gate.delivered()  # never below 0
    assert gate.pending == 0


async def test_origins_past_the_bound_are_forgotten_as_delivered() -> None:
    origins, gate = TopicOrigins(kept=2), FlowGate()
    for n in range(5):
        origins.remember(f"o{n}", gate)
    assert gate.pending == 2 and len(origins) == 2
    assert origins.take("o0") is None  # the oldest went first
    assert origins.take("o4") is gate


async def test_each_broker_keeps_its_own_origins() -> None:
    # No module-level book: one broker's delivery never finds another's publisher.
    first, second, gate = TopicOrigins(), TopicOrigins(), FlowGate()
    first.remember("m", gate)
    assert second.take("m") is None
    assert gate.pending == 1
    assert first.take("m") is gate
    assert gate.pending == 0

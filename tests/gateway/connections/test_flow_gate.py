"""FlowGate and the outboxes' water marks on their own (gateway/connections/flow.py)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import pytest

from gateway.connections import flow
from gateway.connections.flow import PUBLISHER, FlowGate, origin_of, remember_origin
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


async def test_topic_messages_pending_delivery_hold_the_publisher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = FlowGate()
    for n in range(flow.MAX_PENDING + 1):
        remember_origin(f"m{n}", gate)
    assert gate.held and not gate.blocked
    waiting = asyncio.ensure_future(gate.wait(5.0))
    await asyncio.sleep(0)
    assert origin_of("m0") is gate  # delivered: one fewer pending
    await asyncio.wait_for(waiting, 1.0)
    assert origin_of("m0") is None  # asked once
    # Forgotten origins (past the bound) count as delivered.
    monkeypatch.setattr(flow, "_ORIGINS_KEPT", 2)
    monkeypatch.setattr(flow, "_origins", OrderedDict())
    other = FlowGate()
    for n in range(5):
        remember_origin(f"o{n}", other)
    assert other.pending == 2
    gate.give_up()
    assert gate.pending == 0
    gate.delivered()  # never below 0
    assert gate.pending == 0

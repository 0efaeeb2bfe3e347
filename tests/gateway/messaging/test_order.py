"""Pipelined messaging: order of effects and answers, and faults per Command.

A sender's queue publications and acknowledgements reach the engine without
waiting for each other (gateway.messaging.service, "In order"). These tests send
many Commands before reading any answer, on both engines, and check the rules:

- every Command is answered, in the order sent;
- queue messages are stored in the order published, per queue;
- a Command that waits its turn (subscribe, a topic publication, a poll) starts
  only after everything sent before it is done;
- an engine call that fails faults its own Command, in its place, and no other.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from asbp import Command
from gateway.config.model import MessagingLimits
from gateway.messaging.message_ids import MessageIdPool
from tests.support.gateway import Gateway, GatewayFactory, Peer, assert_fault
from tests.support.messaging import Messenger, RedisServers, start_broker

message_id = MessageIdPool().next

pytestmark = pytest.mark.anyio


def publish(destination: str, body: bytes, u: int, **keys: Any) -> Command:
    return Command({"c": "asbp.publish", "destination": destination, "u": u, **keys}, body)


async def answers(peer: Peer, count: int) -> tuple[list[Command], list[Command]]:
    """The next ``count`` answers (accepted or fault), and what arrived among them."""
    replies: list[Command] = []
    others: list[Command] = []
    while len(replies) < count:
        command = await peer.recv()
        (replies if command.name in ("asbp.accepted", "asbp.fault") else others).append(command)
    return replies, others


async def drain(consumer: Messenger, queue: str, count: int) -> list[bytes]:
    """Take ``count`` messages of ``queue`` by subscription, acknowledging each."""
    await consumer.subscribe(queue, type="QUEUE")
    bodies = []
    for _ in range(count):
        note = await consumer.notification(queue)
        bodies.append(note.body)
        await consumer.ok("asbp.ack", destination=queue, receipt=note.get("receipt"))
    return bodies


async def test_pipelined_publications_are_answered_and_stored_in_order(broker: Gateway) -> None:
    peer = await broker.channel()
    # Two queues, interleaved: the Redis engine merges each queue's enqueues.
    for n in range(1, 121):
        await peer.send(publish("left" if n % 2 else "right", b"%d" % n, n, type="QUEUE"))

    replies, _ = await answers(peer, 120)
    assert [r.get("u") for r in replies] == [str(n) for n in range(1, 121)]
    assert {(r.name, r.get("cause")) for r in replies} == {("asbp.accepted", "asbp.publish")}
    assert len({r.get("id") for r in replies}) == 120

    consumer = Messenger.of(await broker.channel())
    assert await drain(consumer, "left", 60) == [b"%d" % n for n in range(1, 121, 2)]
    assert await drain(consumer, "right", 60) == [b"%d" % n for n in range(2, 121, 2)]


async def test_a_failed_engine_call_faults_only_its_own_command(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    broker = await start_broker(
        make_gateway, engine, redis, messaging=MessagingLimits(max_queue_depth=2)
    )
    peer = await broker.channel()
    sent = [
        publish("full", b"1", 1, type="QUEUE"),
        publish("full", b"2", 2, type="QUEUE"),
        publish("full", b"3", 3, type="QUEUE"),  # the queue holds 2: refused
        publish("other", b"4", 4, type="QUEUE"),
        publish("full", b"5", 5, type="QUEUE"),  # still full: refused
        Command({"c": "asbp.ack", "destination": "full", "receipt": "unknown", "u": 6}),
        publish("other", b"7", 7, type="QUEUE"),
    ]
    for command in sent:
        await peer.send(command)

    replies, _ = await answers(peer, len(sent))
    assert [r.get("u") for r in replies] == ["1", "2", "3", "4", "5", "6", "7"]
    assert [r.name for r in replies] == [
        "asbp.accepted",
        "asbp.accepted",
        "asbp.fault",
        "asbp.accepted",
        "asbp.fault",
        "asbp.accepted",
        "asbp.accepted",
    ]
    assert_fault(replies[2], 2006, u=3)
    assert_fault(replies[4], 2006, u=5)
    assert replies[5].get("count") == "0"

    consumer = Messenger.of(await broker.channel())
    assert await drain(consumer, "full", 2) == [b"1", b"2"]
    assert await drain(consumer, "other", 2) == [b"4", b"7"]
    # Nothing else was stored.
    assert (await consumer.ok("asbp.poll", destination="full")).get("count") == "0"


async def test_a_command_in_turn_starts_after_those_before_it(broker: Gateway) -> None:
    peer = await broker.channel()
    sent = [
        publish("turns", b"a", 1, type="QUEUE"),
        Command({"c": "asbp.subscribe", "destination": "/turns", "u": 2}),
        publish("/turns", b"topic", 3),  # after the subscription: reaches it
        publish("turns", b"b", 4, type="QUEUE"),
        Command({"c": "asbp.poll", "destination": "turns", "count": "5", "u": 5}),
        publish("turns", b"c", 6, type="QUEUE"),  # after the poll started: not polled
    ]
    for command in sent:
        await peer.send(command)

    replies, others = await answers(peer, len(sent))
    assert [(r.name, r.get("u")) for r in replies] == [
        ("asbp.accepted", str(n)) for n in range(1, 7)
    ]
    # The poll started once both earlier messages were stored, and took them.
    assert replies[4].get("count") == "2"
    polled = [c.body for c in others if c.get("subscription") == "turns"]
    assert polled == [b"a", b"b"]
    # The subscription was in place before the topic message was published.
    topic = [c for c in others if c.get("subscription") == "/turns"]
    if not topic:
        topic = [await peer.recv()]
    assert [(c.name, c.body) for c in topic] == [("asbp.notification", b"topic")]


async def test_acknowledgements_sent_together_are_each_counted(broker: Gateway) -> None:
    publisher = Messenger.of(await broker.channel())
    first, second = await broker.channel(), await broker.channel()
    consumers = {first: Messenger.of(first), second: Messenger.of(second)}
    for consumer in consumers.values():
        await consumer.subscribe("acks", type="QUEUE")
    for n in range(8):
        await publisher.publish("acks", b"%d" % n, type="QUEUE")

    # Each message goes to the consumer holding fewer: four each, none acknowledged.
    receipts = {
        peer: [str((await consumer.notification()).get("receipt")) for _ in range(4)]
        for peer, consumer in consumers.items()
    }
    # Both acknowledge everything at once, one receipt per Command (the Redis engine
    # merges them into one call), the first consumer its first receipt twice.
    for peer, held in receipts.items():
        for n, receipt in enumerate([*held, held[0]] if peer is first else held):
            await peer.send(
                Command({"c": "asbp.ack", "destination": "acks", "receipt": receipt, "u": n})
            )
    for peer, expected in ((first, ["1", "1", "1", "1", "0"]), (second, ["1", "1", "1", "1"])):
        replies, others = await answers(peer, len(expected))
        assert [(r.get("u"), r.get("count")) for r in replies] == list(
            zip([str(n) for n in range(len(expected))], expected, strict=True)
        )
        assert others == []

    assert (await publisher.ok("asbp.poll", destination="acks")).get("count") == "0"


async def test_publications_to_an_unreachable_redis_each_get_2005(
    redis: RedisServers, make_gateway: GatewayFactory
) -> None:
    broker = await make_gateway(engine="redis", redis_url=await redis.url())
    peer = await broker.channel()
    await peer.send(publish("durable", b"before", 1, type="QUEUE"))
    assert (await peer.recv()).name == "asbp.accepted"
    server = redis.server
    assert server is not None
    await asyncio.to_thread(server.stop)

    for n in range(2, 5):
        await peer.send(publish("durable", b"during", n, type="QUEUE"))
    replies, _ = await answers(peer, 3)
    for n, reply in zip(range(2, 5), replies, strict=True):
        assert_fault(reply, 2005, u=n)

    await asyncio.to_thread(server.start)
    await peer.send(publish("durable", b"after", 5, type="QUEUE"))
    assert (await peer.recv()).name == "asbp.accepted"


def test_message_ids_are_uuid4_hex() -> None:
    ids = {message_id() for _ in range(1000)}
    assert len(ids) == 1000
    for value in ids:
        parsed = uuid.UUID(hex=value)
        assert (parsed.hex, parsed.version, parsed.variant) == (value, 4, uuid.RFC_4122)

"""Queues and virtual queues: store, compete, acknowledge, poll, expire, notify.

End to end on both engines, like test_service.py (with the helpers of
tests/support/messaging.py). Time-dependent behaviour (acknowledgement timeouts,
time-to-live, delays) runs with short configured times and is awaited on the messages and notices it
produces, never on sleeps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import asbp
from asbp import Command
from gateway.broker import Broker
from gateway.config.model import ChannelLimits, MessagingLimits
from tests.support import T
from tests.support.gateway import (
    Gateway,
    GatewayFactory,
    Peer,
    decode,
    small_receive_buffer_socket,
)
from tests.support.messaging import Messenger, RedisServers, start_broker, user

pytestmark = pytest.mark.anyio


@pytest.fixture
def make_broker(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> Callable[..., Awaitable[Gateway]]:
    async def make(**limits: Any) -> Gateway:
        return await start_broker(make_gateway, engine, redis, messaging=MessagingLimits(**limits))

    return make


@pytest.fixture
async def broker(make_broker: Callable[..., Awaitable[Gateway]]) -> Gateway:
    return await make_broker()


def queue(**keys: Any) -> dict[str, Any]:
    return {"type": "QUEUE", **keys}


async def ack(client: Messenger, note: Command, **keys: Any) -> Command:
    return await client.ok(
        "asbp.ack", destination=note.get("subscription"), receipt=note.get("receipt"), **keys
    )


# --------------------------------------------------------------------------
# Storing and consuming


async def test_accepted_means_stored(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    message_id = await publisher.publish("jobs", b"work", **queue(m="text/plain"))

    # Nobody was subscribed: the message waited in the queue.
    reply = await consumer.call("asbp.poll", destination="jobs")
    note = await consumer.notification()
    assert (reply.get("cause"), reply.get("count")) == ("asbp.poll", "1")
    assert note.body == b"work"
    assert note.get("id") == message_id
    assert (note.get("type"), note.get("destination"), note.get("subscription")) == (
        "QUEUE",
        "jobs",
        "jobs",
    )
    assert note.get("deliveries") == "1"
    assert note.get("m") == "text/plain"
    assert note.get("u") == reply.get("u")  # a poll's notifications carry its u
    # A queue message always expires: the engine's default time-to-live.
    assert int(str(note.get("exp"))) > int(str(note.get("ts")))


async def test_a_subscriber_gets_queued_and_new_messages(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    await publisher.publish("orders", b"before", **queue())
    await consumer.subscribe("orders", type="QUEUE")
    await publisher.publish("orders", b"after", **queue())

    first, second = await consumer.notification(), await consumer.notification()
    assert [first.body, second.body] == [b"before", b"after"]
    assert "u" not in first
    assert (await ack(consumer, first)).get("count") == "1"
    assert (await ack(consumer, second)).get("count") == "1"
    # Acknowledged messages are gone: a poll finds nothing.
    assert (await consumer.call("asbp.poll", destination="orders")).get("count") == "0"


async def test_competing_consumers_each_hold_a_message_at_a_time(make_broker: Any) -> None:
    broker = await make_broker(prefetch=1)
    publisher = await user(broker)
    first, second = await user(broker), await user(broker)
    await first.subscribe("work", type="QUEUE")
    await second.subscribe("work", type="QUEUE")
    for n in range(4):
        await publisher.publish("work", str(n).encode(), **queue())

    # With prefetch 1 each consumer holds one message until it acknowledges it.
    one, two = await first.notification(), await second.notification()
    assert {one.body, two.body} == {b"0", b"1"}
    await ack(first, one)
    three = await first.notification()
    await ack(second, two)
    four = await second.notification()
    assert {three.body, four.body} == {b"2", b"3"}
    await ack(first, three)
    await ack(second, four)
    assert first.pending() == second.pending() == []


async def test_an_unacknowledged_message_goes_to_another_consumer(make_broker: Any) -> None:
    broker = await make_broker(ack_timeout=0.5 * T, prefetch=1)
    publisher = await user(broker)
    slow, fast = await user(broker), await user(broker)
    await slow.subscribe("tasks", type="QUEUE")
    await publisher.publish("tasks", b"job", **queue())
    held = await slow.notification()
    await fast.subscribe("tasks", type="QUEUE")

    # The slow consumer never acknowledges: once its lease ends, the message is
    # delivered again, to the consumer holding fewer messages.
    again = await fast.notification()
    assert again.body == b"job" and again.get("id") == held.get("id")
    assert again.get("deliveries") == "2"
    assert again.get("receipt") != held.get("receipt")
    # The late acknowledgement does nothing; the new one removes the message.
    assert (await ack(slow, held)).get("count") == "0"
    assert (await ack(fast, again)).get("count") == "1"


async def test_a_closing_consumer_releases_its_messages_at_once(make_broker: Any) -> None:
    broker = await make_broker(ack_timeout=60.0)
    publisher, stays = await user(broker), await user(broker)
    peer = await broker.channel()
    leaves = Messenger.of(peer)
    await leaves.subscribe("mail", type="QUEUE")
    await publisher.publish("mail", b"letter", **queue())
    await leaves.notification()

    await stays.subscribe("mail", type="QUEUE")
    await peer.close()

    # Long before the 60 s acknowledgement timeout.
    note = await stays.notification()
    assert (note.body, note.get("deliveries")) == (b"letter", "2")


async def test_poll_takes_up_to_count_and_waits(broker: Gateway) -> None:
    publisher, puller = await user(broker), await user(broker)
    for n in range(3):
        await publisher.publish("pull", str(n).encode(), **queue())

    reply = await puller.call("asbp.poll", destination="pull", count="2")
    assert reply.get("count") == "2"
    notes = [await puller.notification(), await puller.notification()]
    assert [n.body for n in notes] == [b"0", b"1"]
    assert (await puller.call("asbp.poll", destination="pull", count="5")).get("count") == "1"
    assert (await puller.notification()).body == b"2"
    assert (await puller.call("asbp.poll", destination="pull")).get("count") == "0"

    # A poll that waits is answered when a message arrives.
    await puller.send(Command(c="asbp.poll", destination="pull", wait=f"{5 * T:g}", u=900))
    await publisher.publish("pull", b"late", **queue())
    assert (await puller.notification()).body == b"late"
    assert (await puller.take(lambda c: c.get("u") == "900" and c.name == "asbp.accepted")).get(
        "count"
    ) == "1"


def answer_to(command_id: int) -> Callable[[Command], bool]:
    """Matches the answer (not a notification) to the Command with ``u`` = ``command_id``."""
    return lambda c: c.get("u") == str(command_id) and c.name != "asbp.notification"


@pytest.mark.parametrize("server", ["hypercorn", "uvicorn"])
async def test_polls_in_flight_never_overflow_the_outbox(
    make_gateway: GatewayFactory, redis: RedisServers, engine: str, server: str
) -> None:
    """16 polls of 100 at once would be 1,600 deliveries for an outbox of 1,024 frames:
    each takes what the outbox has room for, so the client, which reads everything,
    is never cut off (2105), and every message comes once."""
    broker = await start_broker(
        make_gateway, engine, redis, server=server, messaging=MessagingLimits(prefetch=100)
    )
    publisher, peer = await user(broker), await broker.channel()
    puller = Messenger.of(peer)
    total, window = 2000, 200
    for start in range(0, total, window):  # pipelined, within max_pending
        for n in range(start, start + window):
            await publisher.send(
                Command({"c": "asbp.publish", "destination": "bulk", "type": "QUEUE", "u": n},
                        b"%d" % n)
            )  # fmt: skip
        for n in range(start, start + window):
            assert (await publisher.take(answer_to(n))).name == "asbp.accepted"

    bodies: list[bytes] = []
    rounds = 0
    while len(bodies) < total:
        rounds += 1
        assert rounds <= total // 100, f"polls stopped taking messages at {len(bodies)}"
        ids = range(rounds * 100, rounds * 100 + 16)
        # In one write, so the broker takes the 16 polls in together.
        async with peer.ws.send_context():
            for command_id in ids:
                peer.ws.protocol.send_binary(
                    asbp.encode(
                        Command(
                            c="asbp.poll", destination="bulk", type="QUEUE", count=100, u=command_id
                        )
                    )
                )
            peer.ws.transport.write(b"".join(peer.ws.protocol.data_to_send()))
        counts = []
        for command_id in ids:
            reply = await puller.take(answer_to(command_id))
            assert reply.name == "asbp.accepted", reply  # never 2105, nor any fault
            counts.append(int(str(reply.get("count"))))
        assert sum(counts) > 0  # every round takes some: the outbox drains between them
        notes = [await puller.notification("bulk") for _ in range(sum(counts))]
        assert {n.get("deliveries") for n in notes} == {"1"}
        bodies += [n.body for n in notes]
    assert sorted(bodies) == sorted(b"%d" % n for n in range(total))  # each once
    assert puller.pending() == []


async def test_a_poll_delivers_only_what_fits_the_outbox_bytes(
    make_gateway: GatewayFactory, redis: RedisServers, engine: str
) -> None:
    """Messages fetched that would pass the outbox's bytes go back to the queue
    (released: delivered again later, ``deliveries`` one higher), never 2105."""
    broker = await start_broker(
        make_gateway, engine, redis, channels=ChannelLimits(outbox_bytes=64 * 1024)
    )
    publisher, puller = await user(broker), await user(broker)
    for n in range(10):
        await publisher.publish("big", bytes([65 + n]) * 20_000, **queue())

    reply = await puller.call("asbp.poll", destination="big", type="QUEUE", count=10)
    assert reply.name == "asbp.accepted", reply
    first = int(str(reply.get("count")))
    assert 1 <= first < 10  # the outbox holds 64 KiB: about three of them at once
    received = [await puller.notification("big") for _ in range(first)]
    while len(received) < 10:
        reply = await puller.call("asbp.poll", destination="big", type="QUEUE", count=10)
        assert reply.name == "asbp.accepted", reply
        count = int(str(reply.get("count")))
        assert count >= 1
        received += [await puller.notification("big") for _ in range(count)]
    assert sorted(n.body[0] for n in received) == list(range(65, 75))  # each once
    # Released, then delivered again: each such delivery counts.
    assert all(int(str(n.get("deliveries"))) >= 2 for n in received[first:])


#: A message body near the frame limit: 32 of them (6.4 MiB) pass a Channel's 4 MiB outbox.
LARGE = 200 * 1024


async def publish_large(publisher: Messenger, destination: str, total: int) -> None:
    """Publish ``total`` messages of :data:`LARGE` bytes; message ``n`` is all ``n``."""
    for n in range(total):
        await publisher.publish(destination, bytes([n]) * LARGE, **queue())


@pytest.mark.parametrize("transport", ["websocket", "http"])
async def test_a_consumer_delivers_only_what_fits_the_outbox_bytes(
    make_broker: Any, transport: str
) -> None:
    """A subscriber's prefetch of large messages is more than its outbox holds: the
    consumer hands on what fits and holds the rest back until the outbox drains, so
    the client, which reads everything, is never cut off (2105), and no message is
    released (which would count toward max_deliveries) or delivered twice."""
    broker = await make_broker(prefetch=32)
    publisher = await user(broker)
    if transport == "http":
        consumer = Messenger.http(await broker.http_channel())
    else:
        consumer = await user(broker)
    total = 40
    await publish_large(publisher, "large", total)

    await consumer.subscribe("large", type="QUEUE")
    # The whole prefetch is read before any acknowledgement: what was held back comes
    # because the outbox drained, not because an acknowledgement made room.
    notes = [await consumer.notification("large") for _ in range(32)]
    receipts = [n.get("receipt") for n in notes]
    reply = await consumer.ok("asbp.ack", destination="large", receipt=receipts)
    assert reply.get("count") == "32"  # every lease still live: none was released
    rest = [await consumer.notification("large") for _ in range(total - 32)]
    receipts = [n.get("receipt") for n in rest]
    reply = await consumer.ok("asbp.ack", destination="large", receipt=receipts)
    assert reply.get("count") == str(total - 32)
    notes += rest
    assert sorted(n.body[0] for n in notes) == list(range(total))  # each once
    assert {len(n.body) for n in notes} == {LARGE}
    assert {n.get("deliveries") for n in notes} == {"1"}  # none released, none expired
    bus = await broker.call(lambda b: b.plane.spans_brokers)
    if transport == "http" and bus:
        # On a bus an HTTP Channel's mailbox is its Channel log in Redis, bounded by
        # the log's retention (log_max_bytes), not by an outbox here: nothing is
        # held back, and everything still arrives once (checked above).
        assert not broker.events.find("consumer.held_back", queue="large")
    else:
        assert broker.events.find("consumer.held_back", queue="large")  # the case under test
    assert not broker.events.find("channel.slow_consumer")
    assert (await consumer.call("asbp.poll", destination="large")).get("count") == "0"
    assert consumer.pending() == []


async def test_a_consumer_waits_for_a_client_that_stops_reading(make_broker: Any) -> None:
    """A client that stops reading leaves its outbox full; the consumer holds its
    messages back instead of cutting it off, and once it reads again it gets them all."""
    broker = await make_broker(prefetch=32)
    publisher = await user(broker)
    total, more = 40, 8
    await publish_large(publisher, "stalled", total)
    sock = small_receive_buffer_socket(broker.server.port)
    ws = await broker.websocket("/asbp", sock=sock, max_queue=1, compression=None)
    peer = Peer(ws, decode(await asyncio.wait_for(ws.recv(), 5 * T)))
    consumer = Messenger.of(peer)
    await consumer.subscribe("stalled", type="QUEUE")

    # Not reading, the client leaves the first messages in its socket buffers and
    # its outbox; the consumer holds the rest of its prefetch back.
    await broker.events.wait("consumer.held_back", queue="stalled")
    await publish_large(publisher, "stalled", more)  # while it still does not read

    def outbox_room(b: Broker) -> tuple[int, int]:
        channel = b.channels.get(peer.id)
        assert channel is not None  # not closed
        return channel.outbox.room()

    frames, _ = await broker.call(outbox_room)
    assert frames < ChannelLimits().outbox_frames  # still stalled: its outbox holds frames
    assert not broker.events.find("channel.slow_consumer")

    notes: list[Command] = []
    for _ in range(total + more):
        note = await consumer.notification("stalled")
        notes.append(note)
        await ack(consumer, note)
    assert sorted(n.body[0] for n in notes) == sorted([*range(total), *range(more)])
    assert {n.get("deliveries") for n in notes} == {"1"}  # none released, none expired
    assert not broker.events.find("channel.slow_consumer")
    assert (await consumer.call("asbp.poll", destination="stalled")).get("count") == "0"


async def test_publications_sent_before_a_close_are_stored(broker: Gateway) -> None:
    peer = await broker.channel()
    for n in range(3):
        await peer.send(
            Command({"c": "asbp.publish", "destination": "fire", "type": "QUEUE"}, b"%d" % n)
        )
    await peer.close()

    consumer = await user(broker)
    await consumer.subscribe("fire", type="QUEUE")
    got = [(await consumer.notification()).body for _ in range(3)]
    assert got == [b"0", b"1", b"2"]


@pytest.mark.parametrize(
    ("keys", "code"),
    [
        ({"count": "0"}, 1203),
        ({"count": "17"}, 1203),  # more than prefetch
        ({"wait": "26"}, 1203),  # more than max_poll_wait
        ({"wait": "-1"}, 1203),
        ({"type": "TOPIC"}, 2002),
    ],
)
async def test_poll_faults(broker: Gateway, keys: dict[str, str], code: int) -> None:
    client = await user(broker)
    fault = await client.call("asbp.poll", destination="q", **keys)
    assert (fault.name, fault.get("code")) == ("asbp.fault", str(code)), fault


async def test_ack_faults(broker: Gateway) -> None:
    client = await user(broker)
    fault = await client.call("asbp.ack", destination="q")
    assert fault.get("code") == "1203", fault
    fault = await client.call("asbp.ack", destination="/t", type="TOPIC", receipt="r")
    assert fault.get("code") == "2002", fault
    # An unknown receipt is no fault: it counts 0.
    assert (await client.ok("asbp.ack", destination="q", receipt="nope")).get("count") == "0"


async def test_higher_priorities_first_fifo_within_one(broker: Gateway) -> None:
    publisher, puller = await user(broker), await user(broker)
    for body, priority in ((b"low", "1"), (b"high-1", "9"), (b"mid", "5"), (b"high-2", "9")):
        await publisher.publish("ranked", body, **queue(priority=priority))

    assert (await puller.call("asbp.poll", destination="ranked", count="4")).get("count") == "4"
    notes = [await puller.notification() for _ in range(4)]
    assert [n.body for n in notes] == [b"high-1", b"high-2", b"mid", b"low"]
    assert [n.get("priority") for n in notes] == ["9", "9", "5", "1"]


async def test_a_delayed_message_is_not_delivered_before_its_time(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    delay = 0.5 * T
    published = time.time()
    await publisher.publish("later", b"delayed", **queue(delay=f"{delay:.3f}"))
    assert (await consumer.call("asbp.poll", destination="later")).get("count") == "0"

    await consumer.subscribe("later", type="QUEUE")
    note = await consumer.notification()
    assert note.body == b"delayed"
    assert time.time() >= published + delay


async def test_not_before_is_an_absolute_time(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    due = time.time() + 0.3 * T
    await publisher.publish("at", b"on time", **queue(not_before=str(int(due * 1000))))
    await consumer.subscribe("at", type="QUEUE")
    assert (await consumer.notification()).body == b"on time"
    assert time.time() >= int(due * 1000) / 1000


async def test_delivery_notices_queued_and_consumed(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    reply = await publisher.ok(
        "asbp.publish", b"track me", destination="parcels", notice=["queued", "dequeued"], **queue()
    )
    message_id = reply.get("id")

    queued = await publisher.take("asbp.notice")
    assert (queued.get("event"), queued.get("id"), queued.get("destination")) == (
        "queued",
        message_id,
        "parcels",
    )
    assert queued.get("u") == reply.get("u") and "reason" not in queued

    await consumer.subscribe("parcels", type="QUEUE")
    await ack(consumer, await consumer.notification())
    consumed = await publisher.take("asbp.notice")
    assert (consumed.get("event"), consumed.get("reason"), consumed.get("id")) == (
        "dequeued",
        "consumed",
        message_id,
    )


async def test_the_acceptance_comes_before_the_queued_notice(broker: Gateway) -> None:
    peer = await broker.channel()
    for u in range(1, 6):
        await peer.send(
            Command(c="asbp.publish", destination="ordered", type="QUEUE", notice="queued", u=u)
        )
    received = [await peer.recv() for _ in range(10)]
    for u in range(1, 6):
        names = [c.name for c in received if c.get("u") == str(u)]
        assert names == ["asbp.accepted", "asbp.notice"], received


async def test_an_expired_message_is_noticed_and_never_delivered(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    # It expires before it may be delivered, so it can only expire: engines remove
    # expired messages when they meet them, and the consumer's fetch meets it when due.
    await publisher.publish(
        "perishable",
        b"milk",
        **queue(ttl=f"{0.2 * T:.3f}", delay=f"{0.4 * T:.3f}", notice="dequeued"),
    )
    await consumer.subscribe("perishable", type="QUEUE")

    expired = await publisher.take("asbp.notice")
    assert (expired.get("event"), expired.get("reason")) == ("dequeued", "expired")
    assert (await consumer.call("asbp.poll", destination="perishable")).get("count") == "0"
    assert consumer.pending() == []


async def test_a_message_past_max_deliveries_is_discarded(make_broker: Any) -> None:
    broker = await make_broker(max_deliveries=1)
    publisher = await user(broker)
    peer = await broker.channel()
    consumer = Messenger.of(peer)
    await publisher.publish("poison", b"bad", **queue(notice="dequeued"))
    await consumer.subscribe("poison", type="QUEUE")
    await consumer.notification()

    await peer.close()  # releases the lease: its one delivery is used up

    discarded = await publisher.take("asbp.notice")
    assert (discarded.get("event"), discarded.get("reason")) == ("dequeued", "discarded")


async def test_notices_reach_a_publisher_that_has_no_subscriptions(broker: Gateway) -> None:
    agent = Messenger.of(await broker.tube("billing"))
    consumer = await user(broker)
    await agent.publish("invoices", b"#1", **queue(notice="dequeued"))
    await consumer.subscribe("invoices", type="QUEUE")
    note = await consumer.notification()
    assert note.get("a") == "billing"
    await ack(consumer, note)
    assert (await agent.take("asbp.notice")).get("reason") == "consumed"


async def test_max_queues_is_2003(make_broker: Any) -> None:
    broker = await make_broker(max_queues=1)
    client = await user(broker)
    await client.publish("only", b"", **queue())
    fault = await client.call("asbp.publish", destination="another", type="QUEUE")
    assert fault.get("code") == "2003", fault
    fault = await client.call("asbp.subscribe", destination="vq@/x", type="VIRTUAL_QUEUE")
    assert fault.get("code") == "2003", fault


async def test_unsubscribing_from_a_queue_stops_deliveries(broker: Gateway) -> None:
    publisher, consumer = await user(broker), await user(broker)
    await consumer.subscribe("stop", type="QUEUE")
    await consumer.ok("asbp.unsubscribe", destination="stop", type="QUEUE")
    await publisher.publish("stop", b"kept", **queue())
    # Still in the queue, not delivered to the former subscriber. (Its consumer task may
    # have been waiting in a fetch and leased it; with nobody to give it to, it releases
    # it at once: the poll waits for that.)
    reply = await consumer.call("asbp.poll", destination="stop", wait=f"{5 * T:g}")
    assert reply.get("count") == "1"
    assert [(n.body, n.get("u")) for n in consumer.pending()] == [(b"kept", reply.get("u"))]


async def test_http_consumers_subscribe_and_acknowledge(broker: Gateway) -> None:
    http = Messenger.http(await broker.http_channel())
    publisher = await user(broker)
    await http.subscribe("web-jobs", type="QUEUE")
    await publisher.publish("web-jobs", b"over http", **queue())

    note = await http.notification()
    assert note.body == b"over http"
    assert (await ack(http, note)).get("count") == "1"


# --------------------------------------------------------------------------
# Virtual queues


async def test_a_virtual_queue_keeps_topic_messages_for_its_consumers(broker: Gateway) -> None:
    publisher = await user(broker)
    peer = await broker.channel()
    first = Messenger.of(peer)
    await first.subscribe("billing@/orders/.*", type="VIRTUAL_QUEUE")
    await peer.close()

    # Nobody consumes it now, yet it keeps what its pattern matches.
    await publisher.publish("/orders/1", b"one")
    await publisher.publish("/returns/1", b"not matched")
    await publisher.publish("/orders/2", b"two")

    second = await user(broker)
    await second.subscribe("billing@/orders/.*", type="VIRTUAL_QUEUE")
    one, two = await second.notification(), await second.notification()
    assert [one.body, two.body] == [b"one", b"two"]
    assert (one.get("type"), one.get("subscription"), one.get("destination")) == (
        "VIRTUAL_QUEUE",
        "billing@/orders/.*",
        "/orders/1",
    )
    await ack(second, one, type="VIRTUAL_QUEUE")
    await ack(second, two)  # '@' names a virtual queue without 'type' too


async def test_two_virtual_queues_each_get_a_copy(broker: Gateway) -> None:
    publisher, billing, audit = await user(broker), await user(broker), await user(broker)
    await billing.subscribe("billing@/orders/.*", type="VIRTUAL_QUEUE")
    await audit.subscribe("audit@/(?:orders|refunds)/.*", type="VIRTUAL_QUEUE")
    message_id = await publisher.publish("/orders/9", b"copy")
    for consumer in (billing, audit):
        note = await consumer.notification()
        assert (note.body, note.get("id")) == (b"copy", message_id)


async def test_virtual_queue_consumers_compete(make_broker: Any) -> None:
    broker = await make_broker(prefetch=1)
    publisher, first, second = await user(broker), await user(broker), await user(broker)
    await first.subscribe("shared@/jobs/.*", type="VIRTUAL_QUEUE")
    await second.subscribe("shared@/jobs/.*", type="VIRTUAL_QUEUE")
    await publisher.publish("/jobs/1", b"a")
    await publisher.publish("/jobs/2", b"b")
    one, two = await first.notification(), await second.notification()
    assert {one.body, two.body} == {b"a", b"b"}


async def test_poll_a_virtual_queue(broker: Gateway) -> None:
    publisher, puller = await user(broker), await user(broker)
    await puller.subscribe("pull@/feed", type="VIRTUAL_QUEUE")
    await puller.ok("asbp.unsubscribe", destination="pull@/feed", type="VIRTUAL_QUEUE")
    await publisher.publish("/feed", b"x")
    # (Waiting, as its former consumer task may hold it for a moment: see above.)
    reply = await puller.call("asbp.poll", destination="pull@/feed", wait=f"{5 * T:g}")
    assert reply.get("count") == "1"
    note = await puller.notification()
    assert note.get("type") == "VIRTUAL_QUEUE"


async def test_a_virtual_queue_delivers_only_topics_the_consumer_may_read(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    from tests.support.messaging import security

    policy = """
    [security]
    [[security.policies.default.entries]]
    action = "DENY"
    types = ["TOPIC"]
    destination = '/feed/secret'
    privileges = ["READ"]
    condition = { always = true }
    """
    broker = await start_broker(make_gateway, engine, redis, acl=security(policy))
    publisher, consumer = await user(broker), await user(broker)
    await consumer.subscribe("mine@/feed/.*", type="VIRTUAL_QUEUE")
    await publisher.publish("/feed/secret", b"hidden")
    await publisher.publish("/feed/open", b"visible")

    note = await consumer.notification()
    assert note.get("destination") == "/feed/open"
    # The unreadable copy was removed, not left to block the queue.
    await ack(consumer, note)
    assert (await consumer.call("asbp.poll", destination="mine@/feed/.*")).get("count") == "0"


# --------------------------------------------------------------------------
# Several brokers on one Redis


async def test_brokers_sharing_redis_share_queues_and_notices(
    redis: RedisServers, make_gateway: GatewayFactory
) -> None:
    url = await redis.url()
    first = await make_gateway(engine="redis", redis_url=url, broker_id="broker-one")
    second = await make_gateway(engine="redis", redis_url=url, broker_id="broker-two")
    publisher, consumer = await user(first), await user(second)

    await publisher.publish("shared", b"across", **queue(notice="dequeued"))
    await consumer.subscribe("shared", type="QUEUE")
    note = await consumer.notification()
    assert note.body == b"across"
    await ack(consumer, note)

    # The acknowledgement on the second broker reaches the publisher on the first.
    assert (await publisher.take("asbp.notice")).get("reason") == "consumed"


async def test_an_unreachable_redis_is_fault_2005_and_nothing_is_accepted(
    redis: RedisServers, make_gateway: GatewayFactory
) -> None:
    import asyncio

    url = await redis.url()
    broker = await make_gateway(engine="redis", redis_url=url)
    client = await user(broker)
    await client.publish("durable", b"before", **queue())
    server = redis.server
    assert server is not None
    await asyncio.to_thread(server.stop)

    fault = await client.call("asbp.publish", b"during", destination="durable", type="QUEUE")
    assert fault.get("code") == "2005", fault

    await asyncio.to_thread(server.start)
    await client.publish("durable", b"after", **queue())

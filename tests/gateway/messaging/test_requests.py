"""gateway.messaging.requests and .notifications: pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

import asbp
from asbp import AsbpError, Command
from gateway.acl import DestinationType
from gateway.engines.base import Delivery, DeliveryNotice, Message, NoticeEvent
from gateway.messaging.message_ids import MessageIdPool
from gateway.messaging.notifications import (
    accepted,
    notice,
    notification,
    notification_size,
    published,
)
from gateway.messaging.requests import (
    MAX_DESTINATION_BYTES,
    is_pattern,
    read_ack,
    read_poll,
    read_publish,
    read_subscription,
)

message_id = MessageIdPool().next


def command(name: str, body: bytes = b"", **keys: Any) -> Command:
    return Command({"c": name, **keys}, body)


def test_a_publication_with_every_key() -> None:
    publish = read_publish(
        command(
            "asbp.publish",
            b"data",
            destination="jobs",
            type="QUEUE",
            priority="9",
            ttl="1.5",
            delay="0",
            notice=["queued", "dequeued"],
            m="text/plain",
            e="UTF-8",
            other="x",
        )
    )
    assert publish.destination.type is DestinationType.QUEUE
    assert (publish.destination.name, publish.payload) == ("jobs", b"data")
    assert (publish.priority, publish.ttl, publish.delay) == (9, 1.5, 0.0)
    assert publish.notices == set(NoticeEvent)
    assert publish.headers == {"m": "text/plain", "e": "UTF-8"}


def test_a_publication_defaults_to_a_topic_without_qos() -> None:
    publish = read_publish(command("asbp.publish", destination="/t", not_before="1700000000000"))
    assert publish.destination.type is DestinationType.TOPIC
    assert (publish.priority, publish.ttl, publish.delay) == (None, None, None)
    assert publish.not_before_ms == 1_700_000_000_000
    assert publish.notices == frozenset()


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("/a/b", False),
        ("/a-b_c:d@e", False),
        ("/a.b", True),
        ("/a/.*", True),
        ("/a/[bc]", True),
        ("x|y", True),
    ],
)
def test_pattern_or_exact_name(name: str, pattern: bool) -> None:
    assert is_pattern(name) is pattern
    destination = read_subscription(command("asbp.subscribe", destination=name)).destination
    assert (destination.pattern is not None) is pattern
    assert destination.exact is not pattern


def test_a_virtual_queue_subscription() -> None:
    destination = read_subscription(
        command("asbp.subscribe", destination="app@/orders/.*@x", type="VIRTUAL_QUEUE")
    ).destination
    assert destination.queue_parts == ("app", "/orders/.*@x")
    assert destination.pattern is not None and destination.pattern.fullmatch("/orders/1@x")
    assert not destination.exact


def test_poll_and_ack_find_virtual_queues_by_their_at() -> None:
    poll = read_poll(
        command("asbp.poll", destination="app@/t", count="3", wait="2.5"), max_count=3, max_wait=5
    )
    assert (poll.destination.type, poll.count, poll.wait) == (DestinationType.VIRTUAL_QUEUE, 3, 2.5)
    ack = read_ack(command("asbp.ack", destination="q", receipt=["r1", "r2"]))
    assert (ack.destination.type, ack.receipts) == (DestinationType.QUEUE, ("r1", "r2"))


@pytest.mark.parametrize(
    ("keys", "code"),
    [
        ({"destination": "x" * (MAX_DESTINATION_BYTES + 1)}, 2001),
        ({"destination": "é" * (MAX_DESTINATION_BYTES // 2 + 1)}, 2001),  # bytes, not chars
        ({"destination": "/a\x07"}, 2001),
        ({"destination": "/a", "type": ["TOPIC"]}, 2002),
        ({"destination": "/a", "priority": ["1"]}, 1203),
        ({"destination": "/a", "ttl": "01.5x"}, 1203),
        ({"destination": "/a", "delay": str(10 * 365 * 24 * 3600 + 1)}, 1203),
        ({"destination": "/a", "not_before": "01"}, 1203),
    ],
)
def test_publication_faults(keys: dict[str, Any], code: int) -> None:
    with pytest.raises(AsbpError) as caught:
        read_publish(command("asbp.publish", **keys))
    assert caught.value.code == code


def test_the_longest_name_is_accepted() -> None:
    name = "x" * MAX_DESTINATION_BYTES
    assert read_publish(command("asbp.publish", destination=name)).destination.name == name


def test_a_notification_of_a_queue_delivery() -> None:
    message = Message(
        id="a" * 32,
        destination="/orders/1",
        payload=b"p",
        timestamp=1.2345,
        expiration=61.2345,
        priority=7,
        headers={"m": "text/plain", "a": "billing"},
    )
    delivery = Delivery(message, "vq@/orders/.*", 2, 99.0, "r-1")
    frame = notification(
        message,
        subscription="vq@/orders/.*",
        kind=DestinationType.VIRTUAL_QUEUE,
        delivery=delivery,
        command_id=5,
    )
    decoded = asbp.decode(frame)
    assert decoded == Command(
        {
            "c": "asbp.notification",
            "destination": "/orders/1",
            "subscription": "vq@/orders/.*",
            "type": "VIRTUAL_QUEUE",
            "id": "a" * 32,
            "ts": 1234,
            "priority": 7,
            "exp": 61234,
            "receipt": "r-1",
            "deliveries": 2,
            "u": 5,
            "m": "text/plain",
            "a": "billing",
        },
        b"p",
    )
    # The size bound holds with the longest subscription and receipt.
    header = len(frame) - len(b"p")
    assert header <= notification_size("/orders/1", b"p", message.headers)


def reference_notification(
    message: Message,
    subscription: str,
    kind: DestinationType,
    delivery: Delivery | None,
    command_id: int | None,
) -> bytes:
    """What ``notification`` writes, through Command and asbp.encode (the slow, sure way)."""
    header: dict[str, asbp.HeaderInput] = {
        "c": "asbp.notification",
        "destination": message.destination,
        "subscription": subscription,
        "type": kind.value,
        "id": message.id,
        "ts": int(message.timestamp * 1000),
        "priority": message.priority,
    }
    if message.expiration is not None:
        header["exp"] = int(message.expiration * 1000)
    if delivery is not None:
        header["receipt"] = delivery.receipt
        header["deliveries"] = delivery.delivery_count
    if command_id is not None:
        header["u"] = command_id
    header.update(message.headers)
    return asbp.encode(Command(header, message.payload))


@pytest.mark.parametrize(
    ("destination", "subscription", "kind", "headers"),
    [
        ("/news/sport", "/news/sport", DestinationType.TOPIC, {}),
        # Pattern characters that need quotes (+, [, ], comma) and some that do not.
        ("/a+b", "/a\\+.*", DestinationType.TOPIC, {"m": "text/plain"}),
        ("/x", "/[a-z],(y|z)", DestinationType.TOPIC, {}),
        # Non-ASCII: the UTF-8 marker.
        ("/café", "/caf.*", DestinationType.TOPIC, {"e": "UTF-8"}),
        ("jobs", "jobs", DestinationType.QUEUE, {"m": "text/plain; charset=utf-8", "a": "billing"}),
        ("/orders/1", "vq@/orders/.*", DestinationType.VIRTUAL_QUEUE, {"z": "application/gzip"}),
        ("q", "q", DestinationType.QUEUE, {"f": "1.3.6.1.4.1", "m": "text/x; a=b"}),
    ],
)
@pytest.mark.parametrize("queued", [False, True])
def test_a_notification_is_what_the_codec_would_write(
    destination: str,
    subscription: str,
    kind: DestinationType,
    headers: dict[str, str],
    queued: bool,
) -> None:
    message = Message(
        id="0123456789abcdef" * 2,
        destination=destination,
        payload=b"body; with = separators",
        timestamp=1_763_712_000.1239,
        expiration=1_763_712_060.5 if queued else None,
        priority=9,
        headers=headers,
    )
    receipts = ["r.1", "3:1763712000123-0:2:a1b2c3:1", "with space", "a+b"]
    for receipt in receipts if queued else [None]:
        delivery = None if receipt is None else Delivery(message, subscription, 3, 9.0, receipt)
        for command_id in (None, 0, 65535):
            frame = notification(
                message,
                subscription=subscription,
                kind=kind,
                delivery=delivery,
                command_id=command_id,
            )
            expected = reference_notification(message, subscription, kind, delivery, command_id)
            assert frame == expected


def test_acceptances() -> None:
    assert accepted("asbp.publish", 7, id="ab" * 16) == asbp.encode(
        Command({"c": "asbp.accepted", "u": 7, "cause": "asbp.publish", "id": "ab" * 16})
    )
    assert accepted("asbp.ack", 0, count=12) == asbp.encode(
        Command({"c": "asbp.accepted", "u": 0, "cause": "asbp.ack", "count": 12})
    )
    assert accepted("asbp.subscribe", 65535) == asbp.encode(
        Command({"c": "asbp.accepted", "u": 65535, "cause": "asbp.subscribe"})
    )
    for command_id in (0, 7, 65535):
        identifier = message_id()
        assert published(command_id, identifier) == accepted(
            "asbp.publish", command_id, id=identifier
        )


def test_notices() -> None:
    queued = DeliveryNotice("b" * 32, "jobs", NoticeEvent.QUEUED, "broker/c/x/", 2.0)
    assert asbp.decode(notice(queued, command_id=None)) == Command(
        c="asbp.notice", event="queued", id="b" * 32, destination="jobs", ts=2000
    )
    expired = DeliveryNotice("b" * 32, "jobs", NoticeEvent.EXPIRED, "broker/c/x/9", 3.0)
    decoded = asbp.decode(notice(expired, command_id=9))
    assert (decoded.get("event"), decoded.get("reason"), decoded.get("u")) == (
        "dequeued",
        "expired",
        "9",
    )

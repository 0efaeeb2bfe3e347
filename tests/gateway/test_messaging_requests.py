"""gateway.messaging.requests and .notifications: pure, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

import asbp
from asbp import AsbpError, Command
from gateway.acl import DestinationType
from gateway.engines.base import Delivery, DeliveryNotice, Message, NoticeEvent
from gateway.messaging.notifications import notice, notification, notification_size
from gateway.messaging.requests import (
    MAX_DESTINATION_BYTES,
    is_pattern,
    read_ack,
    read_poll,
    read_publish,
    read_subscription,
)


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

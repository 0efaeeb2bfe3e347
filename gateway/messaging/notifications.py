"""What the broker sends about messages: notifications, notices, acceptances.

Pure builders from engine values to Commands or encoded frames. The keys are
documented in docs/protocol.md ("Topics and queues"):

``asbp.notification`` (broker → subscriber), Sapo's Notification
    ``destination`` (where the message was published), ``subscription`` (the
    subscription that matched: a topic name or pattern, a queue, or
    ``name@pattern``), ``type`` (the subscription's), ``id``, ``ts`` and
    ``exp`` (epoch milliseconds, ``exp`` absent for a message that never
    expires), ``priority``; for a queue delivery also ``receipt`` (what
    ``asbp.ack`` takes) and ``deliveries`` (1, then one more per redelivery);
    the publisher's ``e``, ``f``, ``m``, ``z`` and, for an Application-Agent,
    its verified ``a``. The body is the payload.
``asbp.notice`` (broker → publisher), the DCE model's delivery notices
    ``event`` (``queued`` or ``dequeued``), ``reason`` (for dequeued:
    ``consumed``, ``expired`` or ``discarded``), ``id``, ``destination`` (the
    queue), ``ts``, and the ``u`` of the publication when it had one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import asbp
from asbp import Command
from gateway import builtins
from gateway.acl import DestinationType
from gateway.engines.base import Delivery, DeliveryNotice, Message, NoticeEvent
from gateway.messaging.requests import MAX_DESTINATION_BYTES

__all__ = [
    "NOTIFICATION_RESERVE",
    "accepted",
    "milliseconds",
    "notice",
    "notification",
    "notification_size",
]

#: Header bytes of a notification beyond its destination, subscription and the
#: publisher's carried keys: every other key at its longest (a receipt up to 256
#: bytes), quotes and separators included, rounded up.
NOTIFICATION_RESERVE: Final = 640


def milliseconds(seconds: float) -> int:
    """Epoch seconds as the whole epoch milliseconds the wire carries."""
    return math.floor(seconds * 1000)


def notification(
    message: Message,
    *,
    subscription: str,
    kind: DestinationType,
    delivery: Delivery | None = None,
    command_id: int | None = None,
) -> bytes:
    """The encoded ``asbp.notification`` of ``message`` for one subscription."""
    header: dict[str, asbp.HeaderInput] = {
        "c": builtins.NOTIFICATION,
        "destination": message.destination,
        "subscription": subscription,
        "type": kind.value,
        "id": message.id,
        "ts": milliseconds(message.timestamp),
        "priority": message.priority,
    }
    if message.expiration is not None:
        header["exp"] = milliseconds(message.expiration)
    if delivery is not None:
        header["receipt"] = delivery.receipt
        header["deliveries"] = delivery.delivery_count
    if command_id is not None:
        header["u"] = command_id
    header.update(message.headers)
    return asbp.encode(Command(header, message.payload))


def notification_size(destination: str, payload: bytes, headers: Mapping[str, str]) -> int:
    """The most header bytes a notification of this publication can need.

    Its subscription is not known yet (a pattern can be as long as any name), so
    the longest one is assumed. Each value may need quotes, hence the ``+ 2``s.
    """
    carried = sum(len(k) + len(v.encode()) + 4 for k, v in headers.items())
    return (
        NOTIFICATION_RESERVE
        + len(destination.encode()) + 2
        + MAX_DESTINATION_BYTES + 2
        + carried
    )  # fmt: skip


def notice(event: DeliveryNotice, *, command_id: int | None) -> bytes:
    """The encoded ``asbp.notice`` for one delivery notice."""
    header: dict[str, asbp.HeaderInput] = {"c": builtins.NOTICE}
    if event.event is NoticeEvent.QUEUED:
        header["event"] = "queued"
    else:
        header["event"] = "dequeued"
        header["reason"] = event.event.value
    header["id"] = event.message_id
    header["destination"] = event.queue
    header["ts"] = milliseconds(event.at)
    if command_id is not None:
        header["u"] = command_id
    return asbp.encode(Command(header))


def accepted(cause: str, command_id: int, **keys: asbp.HeaderInput) -> Command:
    """``asbp.accepted`` for the messaging Command ``cause`` that carried ``u``."""
    return Command({"c": builtins.ACCEPTED, "u": command_id, "cause": cause, **keys})

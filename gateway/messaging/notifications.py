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

Notifications and acceptances are written straight to bytes, not through
``Command`` and ``asbp.encode``: one of each goes out per queue message, and
building a Command re-validates every value (about 10 µs a notification, the
largest cost of a delivery). Every value written is already valid: names,
payloads and the publisher's keys were checked when the publication was read
(gateway.messaging.requests, and the codec before it); ids, times, counts and
receipts are the broker's or the engine's own. Only the token form is left to
decide, with the grammar's rule (:func:`asbp.grammar.is_bare`), exactly as
``asbp.encode`` does; tests/gateway/messaging/test_requests.py holds the two
to the same bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Final

import asbp
from asbp import Command
from asbp.grammar import is_bare
from asbp.names import ACCEPTED, NOTICE, NOTIFICATION, PUBLISH
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
    "published",
]

#: Header bytes of a notification beyond its destination, subscription and the
#: publisher's carried keys: every other key at its longest (a receipt up to 256
#: bytes), quotes and separators included, rounded up.
NOTIFICATION_RESERVE: Final = 640


def milliseconds(seconds: float) -> int:
    """Epoch seconds as the whole epoch milliseconds the wire carries."""
    return math.floor(seconds * 1000)


@functools.lru_cache(maxsize=1024)
def _name_token(value: str) -> str:
    """A destination or subscription as a Value-Token; cached, as few recur often."""
    return _token(value)


def _token(value: str) -> str:
    """``value`` as ``asbp.encode`` writes it: bare when the grammar allows, else quoted.

    ``value`` is known to be carriable (no quote, CR or LF): see the module docstring.
    Letters and digits, with ``:``, ``-`` and ``.`` between them (ids, receipts),
    are bare by the grammar's rule; that is checked without the regular expression.
    """
    if value.isalnum() or _plain(value) or is_bare(value):
        return value
    return f"'{value}'"


def _plain(value: str) -> bool:
    return value.replace(":", "").replace("-", "").replace(".", "").isalnum()


def _frame(text: str, body: bytes) -> bytes:
    """A header's text and a body as one frame (the "+" marker for non-ASCII text)."""
    if text.isascii():
        return b"%s;%s" % (text.encode("ascii"), body)
    return b"+%s;%s" % (text.encode("utf-8"), body)


def notification(
    message: Message,
    *,
    subscription: str,
    kind: DestinationType,
    delivery: Delivery | None = None,
    command_id: int | None = None,
) -> bytes:
    """The encoded ``asbp.notification`` of ``message`` for one subscription."""
    # One f-string, not a list joined: one notification per message delivered.
    text = (
        f"{_NOTIFICATION_START}{_name_token(message.destination)}"
        f",subscription={_name_token(subscription)},type={kind.value}"
        f",id={_token(message.id)},ts={math.floor(message.timestamp * 1000)}"
        f",priority={message.priority}"
    )
    expiration = message.expiration
    if expiration is not None:
        text += f",exp={math.floor(expiration * 1000)}"
    if delivery is not None:
        text += f",receipt={_token(delivery.receipt)},deliveries={delivery.delivery_count}"
    if command_id is not None:
        text += f",u={command_id}"
    headers = message.headers
    if headers:
        for key, value in headers.items():
            text += f",{key}={_token(value)}"
    return _frame(text, message.payload)


_NOTIFICATION_START: Final = f"c={NOTIFICATION},destination="


def notification_size(destination: str, payload: bytes, headers: Mapping[str, str]) -> int:
    """The most header bytes a notification of this publication can need.

    Its subscription is not known yet (a pattern can be as long as any name), so
    the longest one is assumed. Each value may need quotes, hence the ``+ 2``s.
    """
    carried = sum(len(k) + len(v.encode()) + 4 for k, v in headers.items()) if headers else 0
    return (
        NOTIFICATION_RESERVE
        + len(destination.encode()) + 2
        + MAX_DESTINATION_BYTES + 2
        + carried
    )  # fmt: skip


def notice(event: DeliveryNotice, *, command_id: int | None) -> bytes:
    """The encoded ``asbp.notice`` for one delivery notice."""
    header: dict[str, asbp.HeaderInput] = {"c": NOTICE}
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


def accepted(cause: str, command_id: int, **keys: str | int) -> bytes:
    """The encoded ``asbp.accepted`` for the messaging Command ``cause`` that carried ``u``.

    ``keys`` are the broker's own (a message id, a count).
    """
    text = f"c={ACCEPTED},u={command_id},cause={_token(cause)}"
    for key, value in keys.items():
        text += f",{key}={value if type(value) is int else _token(str(value))}"
    return _frame(text, b"")


def published(command_id: int, message_id: str) -> bytes:
    """``accepted(PUBLISH, command_id, id=message_id)`` for one of the broker's own ids.

    One goes out per publication; a message id is 32 hex digits (always a bare
    token), so the frame is formatted in one step.
    """
    return _PUBLISHED % (command_id, message_id.encode("ascii"))


_PUBLISHED: Final = f"c={ACCEPTED},u=%d,cause={PUBLISH},id=%s;".encode()

"""How the Redis engine writes messages, receipts and notices as bytes.

A stored message is two stream fields: ``h``, the header (every field of
:class:`~gateway.engines.base.Message` but the payload) as one orjson array,
and ``p``, the payload as it is. orjson is a dependency already, and keeping
the payload out of the JSON spares it an escape and a copy. A topic message on
pub/sub is ``origin (16 bytes) + header + b"\\n" + payload``: JSON never holds
a raw newline, so the first one after the origin ends the header.

Receipts are ``<priority>:<stream id>:<delivery count>:<tag>``, the priority
followed by ``n`` when the message carries a notice spec (so ``ack`` looks the
message up only then). The stream id names the entry; the delivery count and
the tag (random per fetch call) name the lease: after a redelivery the count
and the tag differ, so an old receipt no longer matches, and the tag tells
apart leases of two queues whose streams hold the same id.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

import orjson

from gateway.engines.base import DeliveryNotice, Message, NoticeEvent, new_message

__all__ = [
    "ORIGIN_BYTES",
    "Receipt",
    "notice_spec",
    "pack_header",
    "pack_topic",
    "parse_notice",
    "parse_receipt",
    "receipt",
    "receipt_token",
    "split_receipt",
    "unpack_message",
    "unpack_topic",
]

#: Length of the origin tag that prefixes a topic message on pub/sub.
ORIGIN_BYTES: Final = 16

_DEQUEUED: Final = frozenset({NoticeEvent.CONSUMED, NoticeEvent.EXPIRED, NoticeEvent.DISCARDED})
_NO_NOTICES: Final[frozenset[NoticeEvent]] = frozenset()
_EVENTS: Final = {event.value: event for event in NoticeEvent}
_notice_sets: dict[tuple[str, ...], frozenset[NoticeEvent]] = {}


def pack_header(message: Message, expiration: float | None = None) -> bytes:
    """Every field of ``message`` but the payload, as a compact JSON array.

    ``expiration``, if given, stands for ``message.expiration`` (a queue stores
    its default TTL's end for a message that has none).
    """
    return orjson.dumps(
        [
            message.id,
            message.destination,
            message.timestamp,
            message.expiration if expiration is None else expiration,
            message.priority,
            message.not_before,
            message.notify,
            [event.value for event in message.notices] if message.notices else 0,
            message.headers or 0,
        ]
    )


def unpack_message(header: bytes, payload: bytes) -> Message:
    """The message that :func:`pack_header` and its payload describe."""
    (
        message_id,
        destination,
        timestamp,
        expiration,
        priority,
        not_before,
        notify,
        notices,
        headers,
    ) = orjson.loads(header)
    return new_message(
        message_id,
        destination,
        payload,
        timestamp,
        expiration,
        priority,
        not_before,
        notify,
        _notice_set(notices) if notices else _NO_NOTICES,
        headers or {},
    )


def _notice_set(values: list[str]) -> frozenset[NoticeEvent]:
    key = tuple(values)
    found = _notice_sets.get(key)
    if found is None:
        found = _notice_sets[key] = frozenset(_EVENTS[value] for value in values)
    return found


def pack_topic(origin: bytes, header: bytes, payload: bytes) -> bytes:
    """A topic message as published on pub/sub (tests and tools; the script builds it)."""
    return origin + header + b"\n" + payload


def unpack_topic(data: bytes) -> tuple[bytes, Message]:
    """Split a pub/sub topic message into its origin tag and the message."""
    end = data.index(b"\n", ORIGIN_BYTES)
    return data[:ORIGIN_BYTES], unpack_message(data[ORIGIN_BYTES:end], data[end + 1 :])


def notice_spec(message: Message, channel_prefix: str) -> str:
    """The ``n`` field: which notices to send and where, or '' for none.

    The rule is :class:`~gateway.engines.base.NoticeEvent`'s: QUEUED when asked
    for, and every DEQUEUED reason when any of them is. Notices go to the
    channel of the broker named by the ``notify`` address's first segment
    (``"<broker id>/..."``).
    """
    notify = message.notify
    if notify is None or not message.notices:
        return ""
    flags = ("Q" if NoticeEvent.QUEUED in message.notices else "") + (
        "X" if not message.notices.isdisjoint(_DEQUEUED) else ""
    )
    if not flags:
        return ""
    broker_id = notify.partition("/")[0]
    return orjson.dumps([flags, channel_prefix + broker_id, message.id, notify]).decode()


def parse_notice(data: bytes) -> DeliveryNotice:
    """A notice as the scripts publish it: ``[event, at, queue, message id, notify]``."""
    event, at, queue, message_id, notify = orjson.loads(data)
    return DeliveryNotice(
        message_id=message_id, queue=queue, event=_EVENTS[event], notify=notify, at=float(at)
    )


class Receipt(NamedTuple):
    """A parsed receipt."""

    priority: int
    stream_id: str
    delivery_count: str
    tag: str
    noticed: bool


def receipt(priority: int, stream_id: str, delivery_count: int, tag: str, noticed: bool) -> str:
    """Format a receipt (see the module docstring)."""
    return f"{priority}{'n' if noticed else ''}:{stream_id}:{delivery_count}:{tag}"


def parse_receipt(text: str) -> Receipt | None:
    """The receipt ``text`` names, or None if it is not one this engine made."""
    found = _RECEIPT.fullmatch(text)
    if found is None:
        return None
    priority, noticed, stream_id, count, tag = found.groups()
    return Receipt(int(priority), stream_id, count, tag, bool(noticed))


def split_receipt(text: str) -> tuple[str, str] | None:
    """A receipt this engine made, split at its first ``:`` (as the ack and release
    scripts take it: the priority and notice flag, then the lease); None otherwise."""
    if _RECEIPT.fullmatch(text) is None:
        return None
    head, _, lease = text.partition(":")
    return head, lease


def receipt_token(text: str) -> tuple[str, str, str] | None:
    """A receipt this engine made, as the ack and release scripts take it: its head
    (the priority digit, then ``n`` if the message has notices), its lease token
    (``<stream id>``, or ``<stream id>:<count>`` after the first delivery, as the
    batch lists it) and its batch (the tag); None if it is not one."""
    found = _RECEIPT.fullmatch(text)
    if found is None:
        return None
    priority, noticed, stream_id, count, tag = found.groups()
    return priority + noticed, stream_id if count == "1" else f"{stream_id}:{count}", tag


# ASCII digits only ([0-9], not \d: "٣" is a digit to Python, not to Redis).
_RECEIPT: Final = re.compile(r"([0-9])(n?):([0-9]+-[0-9]+):([0-9]+):([^:]+)")

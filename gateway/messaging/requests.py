"""Messaging Commands read into requests: destination names, types and QoS keys.

Pure: no I/O, no event loop, no engine. Each ``read_*`` function turns one
decoded Command into a frozen request or raises a fault-coded error, so the
broker refuses a bad Command before it costs an engine call. The rules are
the ones docs/protocol.md ("Topics and queues") states; the codes are Sapo's
(Sapo-Broker 3, "Error handling"):

* 2001 invalid destination name: missing or empty, too long, holding
  whitespace, control or invisible formatting characters; a QUEUE name with
  ``@``; a VIRTUAL_QUEUE without ``@`` ("e.g., VIRTUAL_QUEUE without '@' in
  name", checked by gateway.engines.topic_patterns like every engine does); a topic
  pattern that is not a regular expression, or one that could take unbounded
  time to match (gateway.acl.compile_destination decides).
* 2002 invalid destination type: ``type`` other than TOPIC, QUEUE or
  VIRTUAL_QUEUE, or a type the Command cannot take ("e.g., publications to
  VIRTUAL_QUEUE").
* 1203 invalid header value: ``priority``, ``ttl``, ``delay``,
  ``not_before``, ``notice``, ``count``, ``wait`` or ``receipt`` out of rule.

Topic subscriptions are regular expressions, as in Sapo ("TOPIC names can be
referred using a regular expression, not the exact name"), matched against the
whole topic name. A destination without any of ``.^$*+?{}[]\\|()`` can only
match itself, so it is kept as an *exact* subscription: a dictionary lookup per
message instead of a match, and ACLs checked once, at subscription.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from asbp import Command, FaultCode, HeaderValue, InvalidHeaderValue
from gateway.acl import DestinationType, PatternError, compile_destination
from gateway.engines.base import NoticeEvent
from gateway.engines.topic_patterns import parse_virtual_queue
from gateway.errors import GatewayError

__all__ = [
    "CARRIED_KEYS",
    "MAX_DESTINATION_BYTES",
    "MAX_SECONDS",
    "Ack",
    "Destination",
    "InvalidDestinationName",
    "InvalidDestinationType",
    "Poll",
    "Publish",
    "Subscription",
    "read_ack",
    "read_poll",
    "read_publish",
    "read_subscription",
]

#: The longest destination name (or subscription pattern), in UTF-8 bytes.
MAX_DESTINATION_BYTES: Final = 1024
#: The longest ``ttl`` or ``delay``: ten years, in seconds.
MAX_SECONDS: Final = 10 * 365 * 24 * 3600
#: Keys of a publication that describe its body and travel with it to every
#: consumer: Encoding, Format, Mime Type, Compression (draft §1.3.4.2).
CARRIED_KEYS: Final = ("e", "f", "m", "z")

_PATTERN_CHARACTERS: Final = frozenset(".^$*+?{}[]\\|()")
_SECONDS_RE: Final = re.compile(r"(?:0|[1-9][0-9]{0,9})(?:\.[0-9]{1,6})?")
_INTEGER_RE: Final = re.compile(r"0|[1-9][0-9]{0,15}")
_TYPES: Final = {t.value: t for t in DestinationType if t is not DestinationType.COMMAND}
_NO_NOTICES: Final[frozenset[NoticeEvent]] = frozenset()
_OPTIONAL_PUBLISH_KEYS: Final = frozenset(
    ("priority", "ttl", "delay", "not_before", "notice", *CARRIED_KEYS)
)
_NOTICES: Final = {
    "queued": frozenset({NoticeEvent.QUEUED}),
    "dequeued": frozenset({NoticeEvent.CONSUMED, NoticeEvent.EXPIRED, NoticeEvent.DISCARDED}),
}


class InvalidDestinationName(GatewayError):
    """Sapo 2001: the destination name (or pattern) is not acceptable."""

    code = FaultCode.INVALID_DESTINATION_NAME


class InvalidDestinationType(GatewayError):
    """Sapo 2002: the destination type is unknown, or not one this Command takes."""

    code = FaultCode.INVALID_DESTINATION_TYPE


@dataclass(frozen=True, slots=True)
class Destination:
    """A checked destination: its type and its full name."""

    type: DestinationType
    #: The name as routed: a topic, a topic pattern, a queue, or ``name@pattern``.
    name: str
    #: TOPIC: the compiled pattern, or None for an exact name. VIRTUAL_QUEUE: the
    #: compiled topic pattern after ``@``. QUEUE: None.
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    @property
    def exact(self) -> bool:
        """Whether this names one topic or queue (not a pattern of topics)."""
        return self.type is not DestinationType.VIRTUAL_QUEUE and self.pattern is None

    @property
    def queue_parts(self) -> tuple[str, str]:
        """A virtual queue's private name and topic pattern."""
        name, _, pattern = self.name.partition("@")
        return name, pattern


class Publish(NamedTuple):
    """``asbp.publish``.

    A named tuple rather than a frozen dataclass, as immutable and several
    times cheaper to build: one is read per publication.
    """

    destination: Destination
    payload: bytes
    priority: int | None
    #: Seconds the message lives; None: the engine's default (queues) or forever.
    ttl: float | None
    #: Seconds before it may be delivered; None: at once.
    delay: float | None
    #: Epoch milliseconds before which it may not be delivered.
    not_before_ms: int | None
    notices: frozenset[NoticeEvent]
    #: The body's ``e``, ``f``, ``m`` and ``z``, carried to consumers (a new dict each).
    headers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Subscription:
    """``asbp.subscribe`` or ``asbp.unsubscribe``."""

    destination: Destination


@dataclass(frozen=True, slots=True)
class Poll:
    """``asbp.poll``."""

    destination: Destination
    count: int = 1
    wait: float = 0.0


@dataclass(frozen=True, slots=True)
class Ack:
    """``asbp.ack``."""

    destination: Destination
    receipts: tuple[str, ...]


# -- names -------------------------------------------------------------------


def _single(command: Command, key: str) -> str | None:
    value = command.get(key)
    if isinstance(value, tuple):
        raise InvalidHeaderValue(key, "takes one value, not a list")
    return value


# Cached: one check per publication, and few names recur often; a refusal
# raises, so only good names are kept.
@functools.lru_cache(maxsize=1024)
def check_name(name: str, what: str = "a destination name") -> None:
    """Refuse a name no destination may have (2001).

    Raises:
        InvalidDestinationName: empty, longer than MAX_DESTINATION_BYTES, or with
            whitespace, control or invisible formatting characters.
    """
    if not name:
        raise InvalidDestinationName(f"{what} must not be empty")
    # ASCII (most names): printable and without a space is exactly "no whitespace,
    # control or formatting character" (ASCII has no Cf or Cs characters), and its
    # length is its length in bytes. Anything else takes the full check.
    if name.isascii() and name.isprintable() and " " not in name:
        if len(name) > MAX_DESTINATION_BYTES:
            raise InvalidDestinationName(
                f"{what} may be {MAX_DESTINATION_BYTES} bytes (UTF-8) at most"
            )
        return
    if len(name.encode("utf-8", "surrogatepass")) > MAX_DESTINATION_BYTES:
        raise InvalidDestinationName(f"{what} may be {MAX_DESTINATION_BYTES} bytes (UTF-8) at most")
    for char in name:
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Cs"):
            raise InvalidDestinationName(
                f"{what} must not hold whitespace, control or formatting characters "
                f"(U+{ord(char):04X})"
            )


def _pattern(text: str, what: str) -> re.Pattern[str]:
    try:
        return compile_destination(text)
    except PatternError as exc:
        raise InvalidDestinationName(f"{what} {text!r}: {exc}") from exc


def is_pattern(name: str) -> bool:
    """Whether a topic subscription is a regular expression rather than one name."""
    return not _PATTERN_CHARACTERS.isdisjoint(name)


def _destination_name(command: Command) -> str:
    name = command.get("destination")
    if name is None:
        raise InvalidDestinationName("the Command needs its destination in 'destination'")
    if isinstance(name, tuple):
        raise InvalidDestinationName("'destination' takes one name, not a list")
    check_name(name)
    return name


def _type(command: Command) -> DestinationType | None:
    value = command.get("type")
    if value is None:
        return None
    kind = _TYPES.get(value) if isinstance(value, str) else None
    if kind is None:
        raise InvalidDestinationType(f"'type' must be TOPIC, QUEUE or VIRTUAL_QUEUE, not {value!r}")
    return kind


@functools.lru_cache(maxsize=1024)  # as check_name is
def _queue(name: str) -> Destination:
    if "@" in name:
        raise InvalidDestinationName(
            f"a queue name must not hold '@', which names virtual queues: {name!r}"
        )
    return Destination(DestinationType.QUEUE, name)


def _virtual_queue(name: str) -> Destination:
    # gateway.engines.topic_patterns splits at the first "@" and checks both parts, as
    # every engine does: InvalidVirtualQueue is fault 2001 too.
    queue = parse_virtual_queue(name)
    return Destination(DestinationType.VIRTUAL_QUEUE, name, queue.regex)


def _topic_subscription(name: str) -> Destination:
    if not is_pattern(name):
        return Destination(DestinationType.TOPIC, name)
    return Destination(DestinationType.TOPIC, name, _pattern(name, "the topic pattern"))


def _consumed_queue(command: Command) -> Destination:
    """The queue a poll or ack names: ``@`` makes it a virtual queue."""
    name = _destination_name(command)
    kind = _type(command)
    if kind is DestinationType.TOPIC:
        raise InvalidDestinationType(f"{command.name} takes a QUEUE or VIRTUAL_QUEUE, not a TOPIC")
    if kind is DestinationType.VIRTUAL_QUEUE or (kind is None and "@" in name):
        return _virtual_queue(name)
    return _queue(name)


# -- numbers -----------------------------------------------------------------


def _seconds(command: Command, key: str, *, positive: bool, limit: float = MAX_SECONDS) -> float:
    value = _single(command, key)
    assert value is not None
    if not _SECONDS_RE.fullmatch(value):
        raise InvalidHeaderValue(
            key, f"must be a number of seconds such as 30 or 0.5, not {value!r}"
        )
    seconds = float(value)
    if positive and seconds <= 0:
        raise InvalidHeaderValue(key, "must be more than 0 seconds")
    if seconds > limit:
        raise InvalidHeaderValue(key, f"may be {limit:g} seconds at most")
    return seconds


def _integer(command: Command, key: str, low: int, high: int) -> int | None:
    value = _single(command, key)
    if value is None:
        return None
    if not _INTEGER_RE.fullmatch(value) or not low <= int(value) <= high:
        raise InvalidHeaderValue(key, f"must be an integer from {low} to {high}, not {value!r}")
    return int(value)


# -- the Commands ------------------------------------------------------------


def read_publish(command: Command) -> Publish:
    """Read ``asbp.publish``.

    Raises:
        InvalidDestinationName: 2001.
        InvalidDestinationType: 2002 (VIRTUAL_QUEUE, or an unknown type).
        InvalidHeaderValue: 1203 for the QoS keys.
    """
    header = command.header
    destination = _published_destination(header.get("destination"), header.get("type"))
    if header.keys().isdisjoint(_OPTIONAL_PUBLISH_KEYS):
        # Most publications carry none of them: one check instead of nine lookups.
        return Publish(destination, command.body, None, None, None, None, _NO_NOTICES, {})
    # The keys a publication usually lacks are looked up once each, and read only
    # when present.
    priority = _integer(command, "priority", 0, 9) if "priority" in header else None
    ttl = _seconds(command, "ttl", positive=True) if "ttl" in header else None
    delay = _seconds(command, "delay", positive=False) if "delay" in header else None
    not_before_ms = _integer(command, "not_before", 0, 10**16) if "not_before" in header else None
    if delay is not None and not_before_ms is not None:
        raise InvalidHeaderValue("not_before", "give 'delay' or 'not_before', not both")
    notices = _NO_NOTICES
    raw = header.get("notice")
    if raw is not None:
        for item in (raw,) if isinstance(raw, str) else raw:
            events = _NOTICES.get(item)
            if events is None:
                raise InvalidHeaderValue("notice", f"must be queued and/or dequeued, not {item!r}")
            notices |= events
    headers = {}
    for key in CARRIED_KEYS:
        value = header.get(key)
        if isinstance(value, str):
            headers[key] = value
    return Publish(destination, command.body, priority, ttl, delay, not_before_ms, notices, headers)


# Cached as check_name is (a refusal raises, so only good pairs are kept): one
# lookup per publication instead of reading and checking both keys each time.
@functools.lru_cache(maxsize=1024)
def _published_destination(name: HeaderValue | None, type_value: HeaderValue | None) -> Destination:
    """The destination of a publication's ``destination`` and ``type`` values."""
    if name is None:
        raise InvalidDestinationName("the Command needs its destination in 'destination'")
    if isinstance(name, tuple):
        raise InvalidDestinationName("'destination' takes one name, not a list")
    check_name(name)
    kind = DestinationType.TOPIC
    if type_value is not None:
        found = _TYPES.get(type_value) if isinstance(type_value, str) else None
        if found is None:
            raise InvalidDestinationType(
                f"'type' must be TOPIC, QUEUE or VIRTUAL_QUEUE, not {type_value!r}"
            )
        kind = found
    if kind is DestinationType.VIRTUAL_QUEUE:
        raise InvalidDestinationType(
            "a virtual queue cannot be published to: publish to the TOPIC its pattern matches"
        )
    return _queue(name) if kind is DestinationType.QUEUE else Destination(kind, name)


def read_subscription(command: Command) -> Subscription:
    """Read ``asbp.subscribe`` or ``asbp.unsubscribe`` (``type`` defaults to TOPIC).

    Raises:
        InvalidDestinationName: 2001, an unsafe or invalid pattern included.
        InvalidDestinationType: 2002.
    """
    name = _destination_name(command)
    kind = _type(command) or DestinationType.TOPIC
    if kind is DestinationType.TOPIC:
        return Subscription(_topic_subscription(name))
    if kind is DestinationType.QUEUE:
        return Subscription(_queue(name))
    return Subscription(_virtual_queue(name))


def read_poll(command: Command, *, max_count: int, max_wait: float) -> Poll:
    """Read ``asbp.poll``: ``count`` (1 to ``max_count``), ``wait`` (seconds).

    Raises:
        InvalidDestinationName: 2001.
        InvalidDestinationType: 2002 (a TOPIC).
        InvalidHeaderValue: 1203.
    """
    destination = _consumed_queue(command)
    count = _integer(command, "count", 1, max_count)
    wait = _seconds(command, "wait", positive=False, limit=max_wait) if "wait" in command else 0.0
    return Poll(destination, 1 if count is None else count, wait)


def read_ack(command: Command) -> Ack:
    """Read ``asbp.ack``: the queue and the ``receipt`` (one or a list).

    Raises:
        InvalidDestinationName: 2001.
        InvalidDestinationType: 2002 (a TOPIC).
        InvalidHeaderValue: 1203 without a receipt.
    """
    destination = _consumed_queue(command)
    raw = command.get("receipt")
    receipts = (raw,) if isinstance(raw, str) else tuple(raw or ())
    if not receipts or not all(receipts):
        raise InvalidHeaderValue("receipt", "name the receipts to acknowledge")
    return Ack(destination, receipts)

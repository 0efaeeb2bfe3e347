"""The engine interface: topics, queues and virtual queues behind one Protocol.

Two engines implement it: ``memory`` (embedded, zero set-up, one broker) and
``redis`` (durable, shared by many brokers). The broker never knows which
it runs on; one conformance suite (tests/conformance/) holds both to this
contract.

Concepts (Sapo-Broker 3, "Message Publication and Subscription"; the DCE
model's "Quality of Service"):

Topic
    Publish-subscribe. ``publish`` hands a message to every broker that
    shares the engine; each broker matches it against its own subscribers
    (exact names and regular expressions) and drops it if none matches.
    A topic message is also copied into every virtual queue whose pattern
    matches the topic's name, once, by the engine.
Queue
    Point-to-point with competing consumers. ``enqueue`` returns once the
    message is stored (for ``redis``: in Redis, with AOF as configured); only
    then may the broker send ``asbp.accepted``. ``fetch`` leases messages to
    one consumer at a time; a lease not acknowledged (``ack``) before its
    deadline ends and the message is delivered again, to any consumer, with
    ``delivery_count`` one higher. Messages wait for consumers until they
    expire. An expired message leaves (with its EXPIRED notice) when a fetch
    meets it, or at the engine's periodic sweep, within about a second of its
    expiration even if nobody consumes the queue; one that expires while
    leased stays with its consumer until the lease ends.
Virtual queue
    ``name@pattern``: a durable queue fed by every topic message whose name
    fully matches ``pattern``; consumed like a queue under its full name.
Quality of service
    Priority 0-9 (higher first, FIFO within a priority); delayed delivery
    (not before ``not_before``); delivery notices to the publisher when asked:
    QUEUED when stored, DEQUEUED with the reason (CONSUMED, EXPIRED,
    DISCARDED) when it leaves the queue.
Dead letters
    A message whose ``max_deliveries``-th delivery ends unacknowledged leaves
    the queue (DISCARDED notice) for the queue's dead letters: kept, oldest
    first, at most :data:`MAX_DEAD_LETTERS` per queue (a newer one pushes the
    oldest out), outside ``depth``, until an operator moves them back
    (``requeue_dead_letters``: each joins the queue's tail as though just
    published, deliveries from zero, QUEUED notice if asked) or the queue's
    next dead letters push them out.
Inspection
    ``peek`` lists a queue's messages without leasing them; ``queue_stats``
    gives depth, the age of the oldest message at the head of the queue and
    how many dead letters it has (docs/operations.md, "Queues").

Times are wall-clock seconds since the epoch (``time.time()``), because
messages outlive processes and cross machines. Every method may raise
``EngineUnavailable`` (fault-coded) when the backing store cannot be reached;
the broker turns it into a fault, never into a lost Command.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from asbp import FaultCode
from gateway.errors import GatewayError

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_DEAD_LETTERS",
    "Delivery",
    "DeliveryNotice",
    "Engine",
    "EngineLimits",
    "EngineUnavailable",
    "Message",
    "NoticeEvent",
    "NoticeListener",
    "QueueFull",
    "QueueLimitReached",
    "QueueStats",
    "QueuedMessage",
    "TopicListener",
    "new_delivery",
    "new_message",
]

#: The priority of a message that asks for none (the middle of 0-9).
DEFAULT_PRIORITY: Final = 4
#: Dead letters one queue keeps at most; a newer one pushes the oldest out. A
#: constant rather than a limit: the Redis engine's scripts hold it, so every
#: broker of a bus agrees without passing it on each call.
MAX_DEAD_LETTERS: Final = 10_000


class EngineUnavailable(GatewayError):
    """The backing store cannot be reached; the operation may not have happened.

    "May not", not "did not": when a connection fails after a request went out,
    the store may have applied it without the engine hearing back. So a
    publisher that retries an enqueue after this may store it twice (queues are
    at-least-once), and an ack may have landed although this was raised.
    """

    code = FaultCode.ENGINE_UNAVAILABLE


class QueueLimitReached(GatewayError):
    """A new queue would pass the configured maximum number of queues (2003)."""

    code = FaultCode.MAX_QUEUES_REACHED


class QueueFull(QueueLimitReached):
    """The queue already holds ``EngineLimits.max_queue_depth`` messages (2006).

    A subclass of QueueLimitReached, so a broker that maps that maps this too,
    with its own code (Sapo's table has no "queue full" fault).
    """

    code = FaultCode.QUEUE_FULL


@dataclass(frozen=True, slots=True)
class Message:
    """One published message: immutable, as stored."""

    #: Unique per message, assigned by the broker at publication (uuid4 hex).
    id: str
    #: The topic or queue it was published to.
    destination: str
    #: The data, opaque.
    payload: bytes
    #: When it was published (epoch seconds).
    timestamp: float
    #: When it stops being deliverable (epoch seconds); None: never. A queue
    #: stores (and delivers) ``timestamp + EngineLimits.default_ttl`` instead
    #: of None.
    expiration: float | None = None
    #: 0 (lowest) to 9 (highest).
    priority: int = DEFAULT_PRIORITY
    #: Not delivered before this time (epoch seconds); None: at once.
    not_before: float | None = None
    #: Where delivery notices go; None: no notices. The broker's own address,
    #: "<broker id>/<rest>": everything up to the first "/" is the id of the
    #: broker that gets the notices (so a broker id holds no "/"); a shared
    #: engine routes each notice there whichever broker saw the event. The
    #: rest is the broker's own (e.g. "<channel id>/<u>").
    notify: str | None = None
    #: Which notices the publisher asked for (see NoticeEvent for the rule).
    notices: frozenset[NoticeEvent] = frozenset()
    #: Publisher metadata carried to consumers (for example ``p``, ``a``, ``s``).
    headers: Mapping[str, str] = field(default_factory=dict)


class NoticeEvent(enum.Enum):
    """What happened to a queued message (DCE "Delivery Notification").

    The DCE sender asks for None, Queued, Dequeued, or Queued and Dequeued;
    Dequeued is one option that reports the reason. So, for a message with a
    ``notify`` address (none without one):

    - QUEUED is sent when ``notices`` contains QUEUED;
    - CONSUMED, EXPIRED and DISCARDED are all sent (whichever happens) when
      ``notices`` contains any of them.

    Every stored copy counts: a topic message copied into two virtual queues
    gives two QUEUED notices, told apart by ``DeliveryNotice.queue``.
    """

    #: Stored in the queue.
    QUEUED = "queued"
    #: Removed because a consumer acknowledged it.
    CONSUMED = "consumed"
    #: Removed because its expiration passed before anyone took it.
    EXPIRED = "expired"
    #: Removed by the system (the queue was deleted, or it was redelivered
    #: more often than the configured maximum).
    DISCARDED = "discarded"


@dataclass(frozen=True, slots=True)
class DeliveryNotice:
    """A delivery notice for the publisher of ``message_id``."""

    message_id: str
    queue: str
    event: NoticeEvent
    #: The message's ``notify`` address.
    notify: str
    #: When it happened (epoch seconds).
    at: float


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message leased to one consumer until ``deadline``."""

    message: Message
    #: The queue (or virtual queue) it came from.
    queue: str
    #: 1 on first delivery, then one more per redelivery.
    delivery_count: int
    #: The lease ends at this time (epoch seconds) unless acknowledged.
    deadline: float
    #: What ``ack`` takes: opaque to the broker, unique per lease.
    receipt: str


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message as ``peek`` and ``dead_letters`` show it: nothing is leased."""

    message: Message
    #: Deliveries so far (0: never delivered); for a dead letter, the ones that
    #: made it one (``max_deliveries``).
    deliveries: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue at a glance (``queue_stats``)."""

    #: Messages in it: ready, leased and delayed (as ``depth``).
    depth: int
    #: Seconds since the oldest message at the head of any priority was
    #: published (ready or leased; delayed ones count once due); None when
    #: there is none. How far behind the consumers are.
    oldest_age: float | None
    #: Dead letters kept for it.
    dead_letters: int


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Bounds an engine enforces."""

    #: Distinct queues (virtual queues included); more raises QueueLimitReached.
    max_queues: int = 10_000
    #: Seconds a consumer has to acknowledge before the message is redelivered.
    ack_timeout: float = 30.0
    #: Seconds a queued message lives when its publisher gave no expiration.
    default_ttl: float = 7 * 24 * 3600.0
    #: Deliveries after which a message is discarded (a poison message).
    max_deliveries: int = 20
    #: Messages one queue holds (leased and delayed ones included); enqueue
    #: past it raises QueueFull, and a full virtual queue drops topic copies.
    max_queue_depth: int = 100_000


# -- fast constructors ------------------------------------------------------------
#
# A frozen dataclass's __init__ sets each field through object.__setattr__, by
# name: about 1.3 µs for a Message, paid twice per queue message (publication,
# then fetch). These build the same frozen objects through the slots' own
# descriptors, in a third of the time; a new field makes the assertion below fail
# until they set it too.


def _setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[object, object], None], ...]:
    slots: tuple[str, ...] = cls.__slots__  # type: ignore[attr-defined]  # dataclass(slots=True)
    assert slots == names, f"{cls.__name__} has new fields: set them in its fast constructor too"
    return tuple(cls.__dict__[name].__set__ for name in names)


(_ID, _DESTINATION, _PAYLOAD, _TIMESTAMP, _EXPIRATION, _PRIORITY, _NOT_BEFORE, _NOTIFY,
 _NOTICES, _HEADERS) = _setters(Message, (
    "id", "destination", "payload", "timestamp", "expiration", "priority", "not_before",
    "notify", "notices", "headers",
))  # fmt: skip
_D_MESSAGE, _D_QUEUE, _D_COUNT, _D_DEADLINE, _D_RECEIPT = _setters(
    Delivery, ("message", "queue", "delivery_count", "deadline", "receipt")
)
_new = object.__new__


def new_message(
    id: str,
    destination: str,
    payload: bytes,
    timestamp: float,
    expiration: float | None,
    priority: int,
    not_before: float | None,
    notify: str | None,
    notices: frozenset[NoticeEvent],
    headers: Mapping[str, str],
) -> Message:
    """``Message(...)`` with every field given, at a third of the cost (the hot paths)."""
    message: Message = _new(Message)
    _ID(message, id)
    _DESTINATION(message, destination)
    _PAYLOAD(message, payload)
    _TIMESTAMP(message, timestamp)
    _EXPIRATION(message, expiration)
    _PRIORITY(message, priority)
    _NOT_BEFORE(message, not_before)
    _NOTIFY(message, notify)
    _NOTICES(message, notices)
    _HEADERS(message, headers)
    return message


def new_delivery(
    message: Message, queue: str, delivery_count: int, deadline: float, receipt: str
) -> Delivery:
    """``Delivery(...)``, likewise."""
    delivery: Delivery = _new(Delivery)
    _D_MESSAGE(delivery, message)
    _D_QUEUE(delivery, queue)
    _D_COUNT(delivery, delivery_count)
    _D_DEADLINE(delivery, deadline)
    _D_RECEIPT(delivery, receipt)
    return delivery


#: Called (in the broker's event loop) for every topic message from any broker.
#: Never from inside an engine method: later in the loop (call_soon, a reader task).
TopicListener = Callable[[Message], None]
#: Called (in the broker's event loop) for every delivery notice; never from
#: inside an engine method either.
NoticeListener = Callable[[DeliveryNotice], None]


class Engine(Protocol):
    """Topics, queues and virtual queues; see the module docstring."""

    async def start(self) -> None:
        """Connect and start background work; call inside the serving loop."""
        ...

    async def close(self) -> None:
        """Stop background work and disconnect; nothing accepted is lost."""
        ...

    # -- topics ----------------------------------------------------------

    def listen(self, listener: TopicListener) -> None:
        """Receive every topic message published on any broker sharing the engine."""
        ...

    async def publish(self, message: Message) -> None:
        """Publish to the topic ``message.destination`` and feed matching virtual queues.

        Returns once every matching virtual queue has stored its copy. A full
        virtual queue (max_queue_depth) drops its copy: a topic publication
        never fails because of one subscriber's queue.
        """
        ...

    # -- queues -------------------------------------------------------------

    def enqueue(self, message: Message) -> Awaitable[None]:
        """Store ``message`` in the queue ``message.destination``.

        Done once stored; a QUEUED notice follows if it was asked for. An
        awaitable rather than a coroutine function, so that an engine may return
        a future: the broker calls it once per queue publication and cares for
        what a coroutine costs. Either way the call is made (and ordered after
        the calls before it) when ``enqueue`` is called, not when awaited.

        Raises:
            QueueLimitReached: the queue is new and there are max_queues already.
            QueueFull: the queue holds max_queue_depth messages already.
        """
        ...

    async def fetch(
        self, queue: str, consumer: str, *, count: int = 1, wait: float = 0.0
    ) -> list[Delivery]:
        """Lease up to ``count`` deliverable messages of ``queue`` to ``consumer``.

        Highest priority first, FIFO within a priority; messages before their
        ``not_before`` are not deliverable yet; expired ones are removed (with
        an EXPIRED notice) instead of delivered; leases past their deadline are
        delivered again. Waits up to ``wait`` seconds when none is deliverable.
        """
        ...

    def ack(self, queue: str, receipts: Sequence[str]) -> Awaitable[int]:
        """Acknowledge leases: their messages leave the queue (CONSUMED notices).

        An awaitable (as ``enqueue`` returns) of how many receipts were still
        live (a late ack of a lease that already ended does nothing: the
        message was or will be redelivered).
        """
        ...

    def release(self, queue: str, receipts: Sequence[str]) -> Awaitable[int]:
        """End leases early without acknowledging: deliverable again at once.

        An awaitable (as ``enqueue`` returns) of how many receipts were still
        live. The ended delivery still counts: a message released after its
        max_deliveries-th delivery is discarded (DISCARDED notice), as when such
        a lease runs out.
        """
        ...

    # -- virtual queues ----------------------------------------------------

    async def declare_virtual_queue(self, name: str, pattern: str) -> None:
        """Create the durable virtual queue ``name@pattern`` (idempotent).

        Raises:
            InvalidVirtualQueue: (a ValueError, fault 2001, from
                gateway.engines.topic_patterns) ``name`` is empty or holds ``@``, or
                ``pattern`` is not a safe regular expression.
            QueueLimitReached: it is new and there are max_queues already.
        """
        ...

    # -- observation -----------------------------------------------------------

    def on_notice(self, listener: NoticeListener) -> None:
        """Receive delivery notices (for messages published through this broker)."""
        ...

    async def depth(self, queue: str) -> int:
        """Messages in ``queue`` (leased or not)."""
        ...

    async def queues(self) -> list[str]:
        """Every queue and virtual queue (virtual ones as ``name@pattern``)."""
        ...

    async def depths(self) -> dict[str, int]:
        """Every queue's depth, in one call (a metrics scrape asks for all of them).

        May lag by one expiry sweep: messages that expired since are still counted.
        """
        ...

    # -- inspection (the management API) ----------------------------------------

    async def peek(self, queue: str, count: int) -> list[QueuedMessage]:
        """Up to ``count`` of ``queue``'s messages, leasing none: ready and leased
        ones, highest priority first, then in the order they joined the queue
        (delayed ones not before they are due)."""
        ...

    async def queue_stats(self, queue: str) -> QueueStats:
        """``queue``'s depth, oldest message's age and dead letters."""
        ...

    async def dead_letters(self, queue: str, count: int) -> list[QueuedMessage]:
        """Up to ``count`` of ``queue``'s dead letters, oldest first, leaving them."""
        ...

    async def requeue_dead_letters(self, queue: str, count: int) -> int:
        """Move up to ``count`` dead letters back into ``queue``, oldest first.

        Each joins the tail of its priority as though just published: deliveries
        from zero, a QUEUED notice if its publisher asked. An expired one is
        dropped instead. Stops when the queue is full (max_queue_depth); returns
        how many it moved back.
        """
        ...

    async def ping(self) -> None:
        """Return once the backing store answers (``/readyz``).

        Raises:
            EngineUnavailable: it cannot be reached.
        """
        ...

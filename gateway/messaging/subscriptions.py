"""Who receives what at this broker: endpoints and topic subscriptions.

An :class:`Endpoint` is the messaging side of one Channel or Tube: where its
notifications go, the topic subscriptions and queues it holds, the queue
messages leased to it and not yet acknowledged, and its messaging Commands:
those whose engine call is under way (``in_flight``, answered in order) and
those waiting for their turn (``operations``). User-Agents and
Application-Agents are alike here; only the ``send`` function differs.

:class:`Topics` holds the broker's topic subscriptions: exact names in a
dictionary (one lookup per message), patterns in a second one scanned per
message (one ``fullmatch`` each, linear in the name because
``compile_destination`` refused the patterns that backtrack). Each
subscription keeps its members with the access context they subscribed with,
so a pattern subscription's READ can be checked per topic delivered (Sapo
checks the delivered name, not the pattern's text).
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from gateway.acl import AccessContext
from gateway.messaging.requests import Destination

if TYPE_CHECKING:
    from gateway.messaging.consumers import QueueConsumer

__all__ = ["Endpoint", "Lease", "Operation", "TopicSubscription", "Topics"]


class Lease(NamedTuple):
    """A queue message leased to an endpoint, not yet acknowledged.

    A named tuple: one is made per message delivered, and it is the cheapest
    immutable record to build.
    """

    queue: str
    #: When the engine ends the lease (epoch seconds).
    deadline: float


@dataclass(eq=False, slots=True)
class Operation:
    """One messaging Command accepted on sight, waiting for the engine or under way.

    Two kinds (gateway.messaging.service, "In order"; gateway.messaging.sequencing):

    - *pipelined* (queue publications, acknowledgements): ``run`` starts as
      soon as the Command's turn comes, without waiting for the engine calls
      ahead of it; ``answer`` gets its result once every Command ahead has been
      answered.
    - *in turn* (the others): ``run`` starts once every Command ahead has been
      answered; ``answer`` (if any) gets its result at once.
    """

    #: The Command-Name, for faults and logs.
    name: str
    #: The Command's ``u``.
    command_id: int | None
    #: The engine call, or the whole work; an AsbpError it raises becomes a fault
    #: to the sender (after ``abandon``). Pipelined, a coroutine or a future.
    run: Callable[[], Awaitable[Any]]
    #: Takes ``run``'s result and answers.
    answer: Callable[[Any], None] | None = None
    #: Undoes what was prepared for ``answer`` when ``run`` failed.
    abandon: Callable[[], object] | None = None
    #: Whether ``run`` starts without waiting for the Commands ahead to be answered.
    pipelined: bool = False
    #: Whether it still runs after its Channel or Tube closed: publications and
    #: acknowledgements do (the client sent them; only the answer is lost),
    #: subscriptions do not.
    after_close: bool = False
    #: Whether it starts in its turn and then runs beside the queue (a poll).
    detached: bool = False
    #: Pipelined, once started: the engine call.
    task: asyncio.Future[Any] | None = None
    #: Pipelined: when ``run`` started (``time.perf_counter``), for the metrics'
    #: engine-call latency.
    began: float = 0.0


@dataclass(eq=False, slots=True)
class Endpoint:
    """The messaging side of one Channel or Tube."""

    #: ``c/<Channel-Identifier>`` or ``t/<Tube id>``: its part of a notice address.
    key: str
    #: Leaves an encoded Command for the client (never blocks).
    send: Callable[[bytes], object]
    #: Sends the client a fault: ``fault(code, message, command_id=…, cause=…)``.
    fault: Callable[..., None]
    #: The frames and bytes its outbox takes now (gateway.connections.outboxes.Outbox.room).
    room: Callable[[], tuple[int, int]]
    #: The verified Application-Agent-Identifier of a Tube; carried as ``a``.
    agent_id: str | None = None
    #: Leaves a queue delivery for the client: ``send``, except that a resumable
    #: Channel does not log it (the queue is its log: docs/protocol.md,
    #: "Resuming a Channel"). None: ``send``.
    send_delivery: Callable[[bytes], object] | None = None
    #: Its topic subscriptions, by name or pattern.
    topics: dict[str, TopicSubscription] = field(default_factory=dict)
    #: The queues (and virtual queues) it consumes, by full name.
    queues: dict[str, QueueConsumer] = field(default_factory=dict)
    #: Unacknowledged queue messages, by receipt.
    leases: dict[str, Lease] = field(default_factory=dict)
    #: Unacknowledged queue messages, counted per queue.
    held: dict[str, int] = field(default_factory=dict)
    #: Pipelined Commands whose engine call started, oldest first: answered from
    #: the head, each once its call and every one ahead of it are done.
    in_flight: deque[Operation] = field(default_factory=deque)
    #: Commands waiting for their turn, oldest first (behind an in-turn Command).
    operations: deque[Operation] = field(default_factory=deque)
    #: Commands accepted and not yet answered (waiting, in flight, or polling).
    pending: int = 0
    #: The task working through ``operations``, while there are any.
    worker: asyncio.Task[None] | None = None
    #: Set by the worker while it waits for ``in_flight`` to empty; resolved then.
    idle: asyncio.Future[None] | None = None
    #: Polls waiting for messages (they run beside ``operations``).
    polls: set[asyncio.Future[None]] = field(default_factory=set)
    #: Outbox frames held for the deliveries of polls whose fetch is under way.
    poll_frames: int = 0
    #: Resolved when such a fetch ends (its room is taken or given back).
    poll_ended: asyncio.Future[None] | None = None
    closed: bool = False
    #: A resumable Channel's endpoint while its connection is away: its topic
    #: notifications go to the Channel's log (gateway.messaging.service,
    #: "Resumed Channels"), it consumes no queue and answers nothing.
    parked: bool = False
    #: Parked: the id of the last topic message sent on (where the handover to the
    #: broker it resumed at starts).
    last_topic: str = ""
    #: Resumed here from another broker whose parked subscriptions may still send
    #: it publications: the topic notifications (message id, frame) held back until
    #: that broker says which was its last (None: not holding).
    holding: list[tuple[str, bytes]] | None = None

    def reply(self, frame: bytes) -> None:
        """Send an answer, unless the client is gone (nobody is left to read it)."""
        if not self.closed:
            self.send(frame)

    def hold(self, receipt: str, queue: str, deadline: float) -> None:
        """Record a lease delivered to this endpoint."""
        if receipt not in self.leases:
            self.leases[receipt] = Lease(queue, deadline)
            self.held[queue] = self.held.get(queue, 0) + 1

    def poll_share(self, count: int) -> int:
        """How many messages a poll for ``count`` may fetch now (0 to ``count``).

        Every delivery is a frame in the outbox. What a poll may take is the
        outbox's free frames less those held for other polls' fetches, and less
        one for the answer of each Command still to be answered (``pending``,
        the poll's own acceptance among them): so neither the deliveries nor
        the answers behind them find the outbox full (docs/protocol.md, "Topics
        and queues").
        """
        return max(0, min(count, self.room()[0] - self.poll_frames - self.pending))

    def has_room_for_delivery(self, size: int, answer_bytes: int) -> bool:
        """Whether a poll's delivery of ``size`` bytes fits now, leaving the frames
        :meth:`poll_share` keeps, and ``answer_bytes`` for each answer, free."""
        frames, room = self.room()
        return (
            frames > self.poll_frames + self.pending and size + answer_bytes * self.pending <= room
        )

    def end_poll_fetch(self, frames: int) -> None:
        """A poll's fetch that held ``frames`` ended: wake the polls waiting for room."""
        self.poll_frames -= frames
        ended, self.poll_ended = self.poll_ended, None
        if ended is not None and not ended.done():
            ended.set_result(None)

    def drop(self, receipt: str) -> Lease | None:
        """Forget a lease (acknowledged, released or expired)."""
        lease = self.leases.pop(receipt, None)
        if lease is not None:
            left = self.held[lease.queue] - 1
            if left:
                self.held[lease.queue] = left
            else:
                del self.held[lease.queue]
        return lease

    def expired(self, now: float) -> set[str]:
        """Forget leases the engine has ended; returns their queues."""
        queues: set[str] = set()
        for receipt, lease in list(self.leases.items()):
            if lease.deadline <= now:
                self.drop(receipt)
                queues.add(lease.queue)
        return queues

    def leases_by_queue(self) -> dict[str, list[str]]:
        """Every live receipt, grouped by queue."""
        grouped: dict[str, list[str]] = {}
        for receipt, lease in self.leases.items():
            grouped.setdefault(lease.queue, []).append(receipt)
        return grouped


@dataclass(eq=False, slots=True)
class TopicSubscription:
    """One distinct topic subscription at this broker, and its members."""

    #: The topic name or pattern, as subscribed.
    name: str
    #: The compiled pattern; None for an exact name.
    pattern: re.Pattern[str] | None
    #: Who subscribed, with the access context each subscribed with.
    members: dict[Endpoint, AccessContext] = field(default_factory=dict)


class Topics:
    """The broker's topic subscriptions."""

    __slots__ = ("_exact", "_patterns")

    def __init__(self) -> None:
        self._exact: dict[str, TopicSubscription] = {}
        self._patterns: dict[str, TopicSubscription] = {}

    def __len__(self) -> int:
        return len(self._exact) + len(self._patterns)

    def counts(self) -> list[tuple[str, bool, int]]:
        """Every subscription: its topic or pattern, whether a pattern, its members."""
        return [
            (name, table is self._patterns, len(subscription.members))
            for table in (self._exact, self._patterns)
            for name, subscription in table.items()
        ]

    def get(self, name: str) -> TopicSubscription | None:
        """The subscription to ``name`` (a topic or a pattern), if any."""
        return self._exact.get(name) or self._patterns.get(name)

    def add(self, endpoint: Endpoint, destination: Destination, access: AccessContext) -> bool:
        """Subscribe ``endpoint``; True if the subscription is new to it.

        The caller checks the limit on distinct subscriptions first.
        """
        table = self._exact if destination.pattern is None else self._patterns
        subscription = table.get(destination.name)
        if subscription is None:
            subscription = TopicSubscription(destination.name, destination.pattern)
            table[destination.name] = subscription
        new = endpoint not in subscription.members
        subscription.members[endpoint] = access
        endpoint.topics[destination.name] = subscription
        return new

    def remove(self, endpoint: Endpoint, name: str) -> TopicSubscription | None:
        """Unsubscribe ``endpoint`` from ``name``; the subscription, if it held it."""
        subscription = endpoint.topics.pop(name, None)
        if subscription is None:
            return None
        subscription.members.pop(endpoint, None)
        if not subscription.members:
            table = self._exact if subscription.pattern is None else self._patterns
            table.pop(name, None)
        return subscription

    def matching(self, topic: str) -> list[TopicSubscription]:
        """Every subscription that ``topic`` matches: its exact name, then patterns."""
        found: list[TopicSubscription] = []
        exact = self._exact.get(topic)
        if exact is not None:
            found.append(exact)
        for subscription in self._patterns.values():
            assert subscription.pattern is not None
            if subscription.pattern.fullmatch(topic) is not None:
                found.append(subscription)
        return found

    def all(self) -> list[TopicSubscription]:
        """Every subscription."""
        return [*self._exact.values(), *self._patterns.values()]

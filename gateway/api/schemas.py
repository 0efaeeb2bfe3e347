"""The management API's request and response bodies, as msgspec Structs.

They are the single source of the OpenAPI document's schemas
(``msgspec.json.schema_components``) and of the JSON the handlers write, so the
two cannot disagree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

__all__ = [
    "AclCheck",
    "AclDecision",
    "AclPolicy",
    "AclReloaded",
    "AgentInfo",
    "AgentList",
    "BrokerInfo",
    "BusInfo",
    "ChannelInfo",
    "ChannelPage",
    "CloseChannel",
    "Closed",
    "ConfigDocument",
    "Problem",
    "Purged",
    "QueueInfo",
    "QueueMessages",
    "QueuePage",
    "QueuedMessageInfo",
    "RequeueDeadLetters",
    "Requeued",
    "SubjectCount",
    "SubjectEnded",
    "TopicList",
    "TopicSubscription",
    "TubeInfo",
]

#: A reason an operator gives; logged with who gave it.
Reason = Annotated[str, Meta(min_length=1, max_length=500)]


class Problem(Struct, kw_only=True):
    """An error (RFC 9457 problem details)."""

    type: str = "about:blank"
    #: The HTTP status phrase.
    title: str
    status: int
    #: What went wrong, for people.
    detail: str


class BrokerInfo(Struct, kw_only=True):
    """One broker."""

    broker: str
    version: str
    engine: Literal["memory", "redis"]
    server: Literal["hypercorn", "uvicorn"]
    #: Unix time the broker started.
    started_at: float
    uptime_seconds: float
    channels: int
    tubes: int
    subjects: int
    in_flight: int


class BusInfo(Struct, kw_only=True):
    """The brokers this API can see: every live broker of the bus when the
    routing plane is on Redis (``scope`` ``bus``; the one answering first), else
    the one answering (``broker``)."""

    scope: Literal["broker", "bus"]
    brokers: list[BrokerInfo]


class ChannelInfo(Struct, kw_only=True):
    """One open Channel (of another broker of the bus: its id and broker only)."""

    id: str
    #: The broker holding the Channel.
    broker: str
    transport: Literal["websocket", "http"] | None = None
    remote: str | None = None
    groups: list[str] | None = None
    #: Its Commands awaiting an answer.
    in_flight: int | None = None
    #: Bytes waiting for the User-Agent to read.
    outbox_bytes: int | None = None


class ChannelPage(Struct, kw_only=True):
    """A page of Channels, ordered by identifier."""

    items: list[ChannelInfo]
    total: int
    offset: int
    limit: int
    #: ``bus``: every broker's Channels (the plane is on Redis); ``broker``: this one's.
    scope: Literal["bus", "broker"] = "broker"
    #: Pass as ``after`` for the next page; null on the last page.
    next_after: str | None = None


class CloseChannel(Struct, kw_only=True):
    """Why the operator closes a Channel."""

    reason: Reason


class Closed(Struct, kw_only=True):
    """A Channel the operator closed, or had closed by the broker holding it."""

    id: str
    #: True: closed by the broker answering (200). False: handed to ``broker``,
    #: which closes it as soon as it reads the request (202).
    closed: bool
    #: The broker that holds (held) the Channel.
    broker: str


class TubeInfo(Struct, kw_only=True):
    """One Tube of an Application-Agent."""

    id: str
    remote: str
    #: The Command-Names it is a Respondent for.
    serves: list[str]
    in_flight: int
    outbox_bytes: int


class AgentInfo(Struct, kw_only=True):
    """An Application-Agent identity with open Tubes at one broker."""

    agent: str
    #: The broker holding these Tubes.
    broker: str
    #: Its Tubes at that broker (of another broker of the bus: empty, see tube_count).
    tubes: list[TubeInfo]
    tube_count: int


class AgentList(Struct, kw_only=True):
    """Every Application-Agent with open Tubes, by agent then broker."""

    items: list[AgentInfo]
    scope: Literal["bus", "broker"] = "broker"


class SubjectCount(Struct, kw_only=True):
    """Subjects signed in or signing in (at every broker of the bus, with ``scope: bus``)."""

    count: int
    scope: Literal["bus", "broker"] = "broker"


class SubjectEnded(Struct, kw_only=True):
    """A Subject the operator ended, or asked the other brokers of the bus to end."""

    id: str
    #: True: ended by the broker answering (200). False: not there, so handed
    #: to ``brokers``, every other live broker of the bus; the one where it
    #: lives ends it as soon as it reads the request (202).
    ended: bool
    #: Where it was ended (the broker answering), or the brokers it was handed to.
    brokers: list[str]


class TopicSubscription(Struct, kw_only=True):
    """A topic (or topic pattern) with subscribers at one broker."""

    name: str
    #: Whether ``name`` is a pattern (a subscription with ``pattern``).
    pattern: bool
    #: Channels and Tubes subscribed at that broker.
    subscribers: int
    #: The broker they are at.
    broker: str


class TopicList(Struct, kw_only=True):
    """Topic subscriptions by name then broker: this broker's all, and (with ``scope:
    bus``) each other broker's most subscribed, from its card."""

    items: list[TopicSubscription]
    scope: Literal["bus", "broker"] = "broker"
    #: Subscriptions on the bus (or at this broker) in all; ``items`` holds fewer when
    #: another broker has more than its card lists (gateway.plane.census.CARD_TOPICS).
    total: int = 0


class QueueInfo(Struct, kw_only=True):
    """One queue or virtual queue."""

    name: str
    #: Messages in it: ready, leased and delayed.
    depth: int
    #: Its consumers at this broker.
    consumers: int
    #: Seconds since the oldest message at the head of the queue was published
    #: (ready or leased); null when none is. How far behind its consumers are.
    oldest_age_seconds: float | None = None
    #: Messages delivered max_deliveries times and never acknowledged, kept
    #: aside (POST .../dead-letters/requeue moves them back).
    dead_letters: int = 0


class QueuePage(Struct, kw_only=True):
    """A page of queues, the deepest first."""

    items: list[QueueInfo]
    total: int
    offset: int
    limit: int


class QueuedMessageInfo(Struct, kw_only=True):
    """A message in a queue (or among its dead letters), as peeking shows it."""

    id: str
    priority: int
    #: Unix time it was published.
    published_at: float
    #: Unix time it expires.
    expires_at: float | None
    #: Deliveries so far (0: never delivered).
    deliveries: int
    #: Publisher metadata carried to consumers.
    headers: dict[str, str]
    #: The payload's size.
    payload_bytes: int
    #: The payload's first 1,024 bytes as UTF-8, undecodable bytes replaced.
    payload: str


class QueueMessages(Struct, kw_only=True):
    """Messages of a queue, leased by nobody for being looked at."""

    queue: str
    items: list[QueuedMessageInfo]


class RequeueDeadLetters(Struct, kw_only=True):
    """How many dead letters to move back, oldest first."""

    count: Annotated[int, Meta(ge=1, le=10_000)] = 10_000


class Requeued(Struct, kw_only=True):
    """What a move back did."""

    queue: str
    #: Dead letters moved back into the queue (expired ones are dropped instead;
    #: a full queue stops the move).
    moved: int


class Purged(Struct, kw_only=True):
    """What a purge removed."""

    queue: str
    #: Messages removed: the ones ready now (leased and delayed ones stay).
    removed: int


class AclCheck(Struct, kw_only=True):
    """A question for the access-control lists."""

    #: The Application-Agent-Identifier asking.
    identity: Annotated[str, Meta(min_length=1, max_length=256)]
    action: Literal["READ", "WRITE"]
    #: A topic, queue or virtual-queue name, or a Command-Name.
    destination: Annotated[str, Meta(min_length=1, max_length=1024)]
    type: Literal["TOPIC", "QUEUE", "VIRTUAL_QUEUE", "COMMAND"] = "COMMAND"


class AclDecision(Struct, kw_only=True):
    """What the access-control lists decide."""

    #: False when no ``[security]`` table is configured (everything is allowed).
    enabled: bool
    allowed: bool
    #: The policy that decided.
    policy: str | None
    #: The entry of that policy that decided; null when its default action did.
    entry_index: int | None


class AclPolicy(Struct, kw_only=True):
    """The security policy an Application-Agent identity is checked against."""

    enabled: bool
    identity: str
    #: Null when no access-control lists are configured.
    policy: str | None
    #: The file the lists came from.
    source: str | None


class AclReloaded(Struct, kw_only=True):
    """The access-control lists now in force, after a reload."""

    source: str
    policies: list[str]


class ConfigDocument(Struct, kw_only=True):
    """The running configuration, secrets masked."""

    config: dict[str, Any]


def to_json(value: object) -> bytes:
    """``value`` as JSON, as the API writes it."""
    return msgspec.json.encode(value)

"""The management API's operations: what each reads or changes in the Broker.

``GET /broker``, ``/channels``, ``/agents`` and ``/subjects`` cover every live
broker of the bus when the routing plane is on Redis (``scope: "bus"``, from
the plane's directory and the brokers' cards: gateway.plane.census), the
broker answering alone otherwise (``scope: "broker"``). Every Channel and
agent entry names the broker holding it; another broker's Channel shows its id
and broker only; closing it is handed to that broker over the routing plane
(an ``EnvelopeKind.CLOSE`` envelope, answered 202 once it is in that broker's
inbound stream), which closes it as its own API would. Topics are the answering broker's;
queues are the engine's, so shared on Redis.

Writes (closing a Channel, ending a Subject, purging a queue, moving dead
letters back) are logged at
WARNING with the caller's principal, the target and the reason.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from typing import Any, Final

from asbp import FaultCode
from gateway.acl import AccessContext, AclConfigError, DestinationType, Privilege
from gateway.api.declare import ApiError, Call, Operation, Param
from gateway.api.schemas import (
    AclCheck,
    AclDecision,
    AclPolicy,
    AclReloaded,
    AgentInfo,
    AgentList,
    BrokerInfo,
    BusInfo,
    ChannelInfo,
    ChannelPage,
    CloseChannel,
    Closed,
    ConfigDocument,
    Purged,
    QueuedMessageInfo,
    QueueInfo,
    QueueMessages,
    QueuePage,
    Requeued,
    RequeueDeadLetters,
    SubjectCount,
    SubjectEnded,
    TopicList,
    TopicSubscription,
    TubeInfo,
)
from gateway.broker import Broker, gateway_version
from gateway.config.rendering import config_to_dict
from gateway.connections.channels import Channel
from gateway.engines.base import MAX_DEAD_LETTERS, QueuedMessage
from gateway.errors import LocalError
from gateway.plane.base import ChannelListing, Envelope, EnvelopeKind, PlaneUnavailable
from gateway.plane.census import BrokerCard

__all__ = ["MAX_CHANNEL_OFFSET", "OPERATIONS", "version"]

#: Items per page at most.
MAX_PAGE: Final = 1000
#: Messages one purge removes at most per engine call.
_PURGE_BATCH: Final = 1000
#: The consumer name a purge fetches as.
_PURGER: Final = "asbp-management-purge"
#: Bytes of each payload a peek shows.
_PEEK_BYTES: Final = 1024

#: The largest ``offset`` of the Channels page: on a bus the page walks the
#: directory's sorted set from the start to the offset inside one Redis script,
#: so a huge one would hold Redis for every broker. ``after`` costs the page only.
MAX_CHANNEL_OFFSET: Final = 10_000

_OFFSET = Param("offset", "query", "integer", "Items to skip.", minimum=0, default=0)
_CHANNEL_OFFSET = Param(
    "offset", "query", "integer",
    f"Items to skip, at most {MAX_CHANNEL_OFFSET:,}: page further with `after`.",
    minimum=0, maximum=MAX_CHANNEL_OFFSET, default=0,
    beyond="; page with after=<next_after of the page before> instead",
)  # fmt: skip
_LIMIT = Param(
    "limit", "query", "integer", "Items per page.", minimum=1, maximum=MAX_PAGE, default=100
)
_AFTER = Param(
    "after", "query", "string",
    "A cursor: start after this Channel-Identifier (next_after of the page before).",
    max_length=128,
)  # fmt: skip
_CHANNEL_ID = Param("channel_id", "path", "string", "The Channel-Identifier.", max_length=128)
_QUEUE = Param("queue", "path", "string", "The queue's name.", max_length=1024, slashes=True)
_PEEK_LIMIT = Param(
    "limit", "query", "integer", "Messages at most.", minimum=1, maximum=MAX_PAGE, default=20
)
_IDENTITY = Param(
    "identity", "query", "string", "An Application-Agent-Identifier.", required=True,
    max_length=256,
)  # fmt: skip
_SUBJECT_ID = Param("subject_id", "path", "string", "The Subject-Identifier.", max_length=128)


def version() -> str:
    """The gateway's version."""
    return gateway_version()


def _broker(call: Call) -> Broker:
    broker: Broker = call.state["broker"]
    return broker


def _audit(call: Call, action: str, **fields: Any) -> None:
    """Log a write with who made it."""
    _broker(call).log.warning(
        "management.write", extra={"action": action, "principal": call.principal, **fields}
    )


def _broker_info(card: BrokerCard) -> BrokerInfo:
    return BrokerInfo(
        broker=card.broker,
        version=card.version,
        engine="redis" if card.engine == "redis" else "memory",
        server="uvicorn" if card.server == "uvicorn" else "hypercorn",
        started_at=card.started_at,
        uptime_seconds=max(0.0, time.time() - card.started_at),
        channels=card.channels,
        tubes=card.tubes,
        subjects=card.subjects,
        in_flight=card.in_flight,
    )


async def get_broker(call: Call) -> BusInfo:
    census = _broker(call).census
    try:
        cards = await census.brokers()
    except PlaneUnavailable as exc:
        raise ApiError(503, str(exc)) from exc
    return BusInfo(
        scope="bus" if census.spans_brokers else "broker",
        brokers=[_broker_info(card) for card in cards],
    )


def _channel_info(broker: Broker, channel: Channel) -> ChannelInfo:
    return ChannelInfo(
        id=channel.id,
        broker=broker.broker_id,
        transport="http" if channel.kind.value == "http" else "websocket",
        remote=channel.remote,
        groups=sorted(channel.groups),
        in_flight=len(channel.in_flight),
        outbox_bytes=channel.outbox.queued_bytes,
    )


def _remote_channel(channel_id: str, broker_id: str) -> ChannelInfo:
    return ChannelInfo(id=channel_id, broker=broker_id)


async def _bus_page(broker: Broker, after: str, offset: int, limit: int) -> ChannelListing:
    """A page of the bus's directory (one script over its sorted set of ids)."""
    plane = broker.plane
    try:
        # This broker's announcements are behind a batcher: once they are
        # written, a Channel opened here a moment ago is in the page.
        await plane.written()
        return await plane.channel_page(after, offset, limit)
    except PlaneUnavailable as exc:
        raise ApiError(503, str(exc)) from exc


async def list_channels(call: Call) -> ChannelPage:
    broker = _broker(call)
    offset, limit, after = call.params["offset"], call.params["limit"], call.params["after"]
    if broker.census.spans_brokers:
        # One more than the page, to know whether another follows.
        listing = await _bus_page(broker, after or "", offset, limit + 1)
        total, held = listing.total, listing.channels
    else:
        ids = sorted(channel.id for channel in broker.channels)
        if after is not None:
            # A cursor by identifier stays put while Channels open and close
            # before it, where an offset would shift.
            ids = ids[bisect.bisect_right(ids, after) :]
        total = len(broker.channels)
        held = tuple((c, broker.broker_id) for c in ids[offset : offset + limit + 1])
    more = len(held) > limit
    page = held[:limit]
    items = []
    for channel_id, holder in page:
        channel = broker.channels.get(channel_id) if holder == broker.broker_id else None
        items.append(
            _channel_info(broker, channel)
            if channel is not None
            else _remote_channel(channel_id, holder)
        )
    return ChannelPage(
        items=items,
        total=total,
        offset=offset,
        limit=limit,
        scope="bus" if broker.census.spans_brokers else "broker",
        next_after=page[-1][0] if more else None,
    )


async def _locate(call: Call) -> tuple[Channel | None, str]:
    """The Channel if here, else the live broker holding it; 404 if none does."""
    broker = _broker(call)
    channel_id = call.params["channel_id"]
    channel = broker.channels.get(channel_id)
    # An HTTP Channel's visitor copy is not the Channel: its home is (http_bus).
    if channel is not None and not channel.visitor:
        return channel, broker.broker_id
    try:
        holder = await broker.plane.locate_channel(channel_id)
    except PlaneUnavailable as exc:
        raise ApiError(503, str(exc)) from exc
    if holder is None or holder == broker.broker_id:
        raise ApiError(404, "no broker of the bus has an open Channel with this identifier")
    return None, holder


async def get_channel(call: Call) -> ChannelInfo:
    channel, holder = await _locate(call)
    if channel is None:
        return _remote_channel(call.params["channel_id"], holder)
    return _channel_info(_broker(call), channel)


async def close_channel(call: Call) -> Closed:
    channel, holder = await _locate(call)
    body: CloseChannel = call.body
    broker = _broker(call)
    if channel is None:
        return await _close_elsewhere(call, broker, holder, body.reason)
    _audit(call, "channel.close", channel=channel.id, reason=body.reason)
    # 2104: the Channel is gone; the reason is in the broker's log, with who asked.
    broker.close_channel(channel, FaultCode.UNKNOWN_CHANNEL)
    if broker.http_bus is not None:
        broker.http_bus.closed_by_operator(channel)  # bus-wide: its log goes too
    return Closed(id=channel.id, closed=True, broker=broker.broker_id)


async def _close_elsewhere(call: Call, broker: Broker, holder: str, reason: str) -> Closed:
    """Hand the close to ``holder`` over the routing plane: 202 once it is in
    that broker's inbound stream, which closes the Channel as its own API would
    (gateway.routing.remote), logging the reason, the principal and this broker."""
    channel_id: str = call.params["channel_id"]
    _audit(call, "channel.close", channel=channel_id, reason=reason, broker=holder)
    envelope = Envelope(
        EnvelopeKind.CLOSE,
        broker.broker_id,
        channel_id,
        reason.encode(),
        among=(call.principal,),
    )
    try:
        handed = await broker.plane.send_to(holder, envelope)
    except PlaneUnavailable as exc:
        raise ApiError(503, str(exc)) from exc
    if not handed:
        # Its broker left the bus between the lookup and the send: so did the Channel.
        raise ApiError(404, "no broker of the bus has an open Channel with this identifier")
    call.status = 202
    return Closed(id=channel_id, closed=False, broker=holder)


async def _cards(broker: Broker) -> list[BrokerCard]:
    try:
        return await broker.census.brokers()
    except PlaneUnavailable as exc:
        raise ApiError(503, str(exc)) from exc


async def list_agents(call: Call) -> AgentList:
    broker = _broker(call)
    items = [
        AgentInfo(
            agent=agent,
            broker=broker.broker_id,
            tubes=[
                TubeInfo(
                    id=tube.id,
                    remote=tube.remote,
                    serves=sorted(tube.serves),
                    in_flight=tube.in_flight,
                    outbox_bytes=tube.outbox.queued_bytes,
                )
                for tube in tubes
            ],
            tube_count=len(tubes),
        )
        for agent, tubes in broker.respondents.agents().items()
    ]
    if broker.census.spans_brokers:
        # Other brokers' Tubes from their cards (at most lease / 6 seconds old).
        for card in (await _cards(broker))[1:]:
            items.extend(
                AgentInfo(agent=agent, broker=card.broker, tubes=[], tube_count=count)
                for agent, count in card.agents.items()
            )
    items.sort(key=lambda item: (item.agent, item.broker))
    return AgentList(items=items, scope="bus" if broker.census.spans_brokers else "broker")


async def count_subjects(call: Call) -> SubjectCount:
    broker = _broker(call)
    if broker.census.spans_brokers:
        # The answering broker's card is fresh; the others' from the bus.
        return SubjectCount(count=sum(card.subjects for card in await _cards(broker)), scope="bus")
    auth = broker.router.auth
    return SubjectCount(count=len(auth.subjects) if auth is not None else 0)


async def end_subject(call: Call) -> SubjectEnded:
    broker = _broker(call)
    auth = broker.router.auth
    subject = auth.subjects.get(call.params["subject_id"]) if auth is not None else None
    if auth is not None and subject is not None:
        _audit(call, "subject.end", subject=subject.id)
        auth.end(subject, "ended by an operator")
        return SubjectEnded(id=subject.id, ended=True, brokers=[broker.broker_id])
    if auth is not None and broker.census.spans_brokers:
        return await _end_elsewhere(call, broker)
    raise ApiError(404, "no Subject has this identifier at this broker")


async def _end_elsewhere(call: Call, broker: Broker) -> SubjectEnded:
    """Hand the end to every other live broker: no directory says where a Subject
    lives (its User-Agent's broker), so each is asked and the one holding it ends it
    (gateway.routing.remote_subjects); 202 once the request is on their streams."""
    subject_id: str = call.params["subject_id"]
    others = [card.broker for card in (await _cards(broker))[1:]]
    envelope = Envelope(
        EnvelopeKind.END_SUBJECT, broker.broker_id, subject_id, b"", among=(call.principal,)
    )
    try:
        sent = await asyncio.gather(*(broker.plane.send_to(b, envelope) for b in others))
    except PlaneUnavailable as exc:
        raise ApiError(503, str(exc)) from exc
    handed = [b for b, ok in zip(others, sent, strict=True) if ok]
    if not handed:
        raise ApiError(404, "no Subject has this identifier, and no other broker is on the bus")
    _audit(call, "subject.end", subject=subject_id, brokers=handed)
    call.status = 202
    return SubjectEnded(id=subject_id, ended=False, brokers=handed)


async def list_topics(call: Call) -> TopicList:
    broker = _broker(call)
    here = broker.messaging.topic_subscriptions()
    items = [
        TopicSubscription(name=name, pattern=pattern, subscribers=members, broker=broker.broker_id)
        for name, pattern, members in here
    ]
    total = len(here)
    if broker.census.spans_brokers:
        # Other brokers' from their cards (at most lease / 6 seconds old, the most
        # subscribed CARD_TOPICS of each).
        for card in (await _cards(broker))[1:]:
            items.extend(
                TopicSubscription(
                    name=name, pattern=pattern, subscribers=members, broker=card.broker
                )
                for name, pattern, members in card.topics
            )
            total += card.topic_count
    items.sort(key=lambda item: (item.name, item.pattern, item.broker))
    if broker.census.spans_brokers:
        return TopicList(items=items, scope="bus", total=total)
    return TopicList(items=items, total=total)


async def _queue_info(broker: Broker, name: str) -> QueueInfo:
    stats = await broker.engine.queue_stats(name)
    return QueueInfo(
        name=name,
        depth=stats.depth,
        consumers=broker.messaging.queue_consumers(name),
        oldest_age_seconds=stats.oldest_age,
        dead_letters=stats.dead_letters,
    )


async def list_queues(call: Call) -> QueuePage:
    broker = _broker(call)
    offset, limit = call.params["offset"], call.params["limit"]
    depths = await broker.engine.depths()
    ordered = sorted(depths.items(), key=lambda item: (-item[1], item[0]))
    page = ordered[offset : offset + limit]
    # Concurrently: the redis engine sends them in one pipeline.
    items = await asyncio.gather(*(_queue_info(broker, name) for name, _ in page))
    return QueuePage(items=list(items), total=len(ordered), offset=offset, limit=limit)


async def _known_queue(broker: Broker, name: str) -> None:
    if name not in await broker.engine.queues():
        raise ApiError(404, "no queue has this name")


async def get_queue(call: Call) -> QueueInfo:
    broker = _broker(call)
    name = call.params["queue"]
    await _known_queue(broker, name)
    return await _queue_info(broker, name)


def _message_info(queued: QueuedMessage) -> QueuedMessageInfo:
    message = queued.message
    return QueuedMessageInfo(
        id=message.id,
        priority=message.priority,
        published_at=message.timestamp,
        expires_at=message.expiration,
        deliveries=queued.deliveries,
        headers=dict(message.headers),
        payload_bytes=len(message.payload),
        payload=message.payload[:_PEEK_BYTES].decode("utf-8", "replace"),
    )


async def peek_queue(call: Call) -> QueueMessages:
    broker = _broker(call)
    name = call.params["queue"]
    await _known_queue(broker, name)
    peeked = await broker.engine.peek(name, call.params["limit"])
    return QueueMessages(queue=name, items=[_message_info(queued) for queued in peeked])


async def list_dead_letters(call: Call) -> QueueMessages:
    broker = _broker(call)
    name = call.params["queue"]
    await _known_queue(broker, name)
    dead = await broker.engine.dead_letters(name, call.params["limit"])
    return QueueMessages(queue=name, items=[_message_info(queued) for queued in dead])


async def requeue_dead_letters(call: Call) -> Requeued:
    broker = _broker(call)
    name = call.params["queue"]
    await _known_queue(broker, name)
    body: RequeueDeadLetters = call.body
    _audit(call, "queue.requeue_dead_letters", queue=name, count=body.count)
    moved = await broker.engine.requeue_dead_letters(name, min(body.count, MAX_DEAD_LETTERS))
    return Requeued(queue=name, moved=moved)


async def purge_queue(call: Call) -> Purged:
    broker = _broker(call)
    name = call.params["queue"]
    await _known_queue(broker, name)
    _audit(call, "queue.purge", queue=name)
    # The engines have no purge of their own: what is ready now is fetched and
    # acknowledged, a batch at a time. Leased messages stay with their consumers
    # and delayed ones until their time, which is what an operator wants of a live
    # queue (a consumer's acknowledgement is never left pointing at nothing).
    removed = 0
    while True:
        deliveries = await broker.engine.fetch(name, _PURGER, count=_PURGE_BATCH, wait=0)
        if not deliveries:
            break
        removed += await broker.engine.ack(name, [d.receipt for d in deliveries])
    return Purged(queue=name, removed=removed)


async def check_acl(call: Call) -> AclDecision:
    acl = _broker(call).acl
    body: AclCheck = call.body
    if acl is None or not acl.enabled:
        return AclDecision(enabled=False, allowed=True, policy=None, entry_index=None)
    decision = acl.check(
        AccessContext(agent_id=body.identity),
        DestinationType(body.type),
        body.destination,
        Privilege(body.action),
    )
    return AclDecision(
        enabled=True,
        allowed=decision.allowed,
        policy=decision.policy,
        entry_index=decision.entry_index,
    )


async def acl_policy(call: Call) -> AclPolicy:
    acl = _broker(call).acl
    identity = call.params["identity"]
    if acl is None or not acl.enabled:
        return AclPolicy(enabled=False, identity=identity, policy=None, source=None)
    return AclPolicy(
        enabled=True,
        identity=identity,
        policy=acl.policy_for(AccessContext(agent_id=identity)),
        source=acl.source,
    )


async def reload_acl(call: Call) -> AclReloaded:
    broker = _broker(call)
    _audit(call, "acl.reload")
    try:
        acl = broker.reload_acl()
    except AclConfigError as exc:
        # With the file's name and line: "broker.toml:12: ...". The lists in force stay.
        raise ApiError(422, str(exc)) from exc
    except LocalError as exc:
        raise ApiError(409, str(exc)) from exc
    return AclReloaded(source=acl.source or "", policies=list(acl.policy_names))


async def get_config(call: Call) -> ConfigDocument:
    return ConfigDocument(config=config_to_dict(_broker(call).config))


_CLOSE_CHANNEL: Final = (
    "200 (closed: true): the Channel was at the broker answering, which closed it. "
    "202 (closed: false): it is at another broker of the bus (broker), to which the "
    "close was handed over the routing plane; that broker closes it as soon as it "
    "reads the request (milliseconds), with the same fault and log record (reason, "
    "principal) as a close asked of its own API. 404: no live broker holds it."
)

_END_SUBJECT: Final = (
    "200 (ended: true): the Subject lived at the broker answering, which ended it. "
    "202 (ended: false): it does not live here, and the routing plane spans brokers: "
    "the end was handed to every other live broker of the bus (brokers), and the one "
    "where it lives (its User-Agent's broker) ends it as soon as it reads the request, "
    "with the same notice to its agents and log record as its own API would; the "
    "others ignore it, so a 202 does not say the Subject exists. 404: not here, and no "
    "other broker to ask."
)

OPERATIONS: Final = (
    Operation("GET", "/broker", "getBroker", "The broker answering, and the bus it sees",
              "broker", "read", BusInfo, get_broker, errors=(503,)),
    Operation("GET", "/channels", "listChannels", "Open Channels, a page at a time",
              "channels", "read", ChannelPage, list_channels,
              params=(_CHANNEL_OFFSET, _LIMIT, _AFTER), errors=(400, 503)),
    Operation("GET", "/channels/{channel_id}", "getChannel", "One open Channel",
              "channels", "read", ChannelInfo, get_channel, params=(_CHANNEL_ID,),
              errors=(400, 404, 503)),
    Operation("POST", "/channels/{channel_id}/close", "closeChannel",
              "Close a Channel, with a reason for the log", "channels", "write", Closed,
              close_channel, params=(_CHANNEL_ID,), body=CloseChannel, errors=(400, 404, 503),
              successes=(202,), description=_CLOSE_CHANNEL),
    Operation("GET", "/agents", "listAgents",
              "Application-Agents with open Tubes, and what each Tube serves", "agents",
              "read", AgentList, list_agents, errors=(503,)),
    Operation("GET", "/subjects", "countSubjects", "How many Subjects there are",
              "subjects", "read", SubjectCount, count_subjects, errors=(503,)),
    Operation("DELETE", "/subjects/{subject_id}", "endSubject",
              "End a Subject (its agents are told)", "subjects", "write", SubjectEnded,
              end_subject, params=(_SUBJECT_ID,), errors=(400, 404, 503), successes=(202,),
              description=_END_SUBJECT),
    Operation("GET", "/topics", "listTopics", "Topic subscriptions (the bus's on Redis)",
              "topics", "read", TopicList, list_topics, errors=(503,)),
    Operation("GET", "/queues", "listQueues", "Queues, the deepest first", "queues", "read",
              QueuePage, list_queues, params=(_OFFSET, _LIMIT)),
    # Before getQueue: a queue name may hold "/", so its route would take these
    # paths too (a queue named ".../messages" is read through listQueues).
    Operation("GET", "/queues/{queue}/messages", "peekQueue",
              "The next messages of a queue, leasing none", "queues", "read",
              QueueMessages, peek_queue, params=(_QUEUE, _PEEK_LIMIT), errors=(400, 404)),
    Operation("GET", "/queues/{queue}/dead-letters", "listDeadLetters",
              "A queue's dead letters, oldest first", "queues", "read",
              QueueMessages, list_dead_letters, params=(_QUEUE, _PEEK_LIMIT),
              errors=(400, 404)),
    Operation("POST", "/queues/{queue}/dead-letters/requeue", "requeueDeadLetters",
              "Move a queue's dead letters back into it, oldest first", "queues", "write",
              Requeued, requeue_dead_letters, params=(_QUEUE,), body=RequeueDeadLetters,
              errors=(400, 404)),
    Operation("GET", "/queues/{queue}", "getQueue", "One queue", "queues", "read",
              QueueInfo, get_queue, params=(_QUEUE,), errors=(400, 404)),
    Operation("POST", "/queues/{queue}/purge", "purgeQueue",
              "Remove the messages ready in a queue", "queues", "write", Purged,
              purge_queue, params=(_QUEUE,), errors=(400, 404)),
    Operation("POST", "/acl/check", "checkAcl",
              "What the access-control lists decide for an identity", "acl", "read",
              AclDecision, check_acl, body=AclCheck),
    Operation("GET", "/acl/policy", "getAclPolicy",
              "The security policy an Application-Agent identity is checked against", "acl",
              "read", AclPolicy, acl_policy, params=(_IDENTITY,)),
    Operation("POST", "/acl/reload", "reloadAcl",
              "Read the access-control lists again from their file (a bad file is refused "
              "with its line, and the lists in force stay)", "acl", "write", AclReloaded,
              reload_acl, errors=(409, 422)),
    Operation("GET", "/config", "getConfig", "The running configuration, secrets masked",
              "config", "read", ConfigDocument, get_config, errors=()),
)  # fmt: skip

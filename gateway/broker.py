"""The Broker: the parts of one broker, wired together, and its housekeeping.

A Broker owns the Channel registry, the Respondent table, the router, the
topic and queue engine (``memory`` or ``redis``, from the configuration) and
the messaging built-ins on top of it, plus the duties no single transport can
do: expiring Commands whose Respondent never answers, expiring stateless HTTP
Channels nobody polls, forgetting queue leases that ran out and publishing
the ``/system/`` consumer counts. It also keeps the event log (one record per
routed Command, gateway.eventlog), whose store follows the engine. It holds no
sockets; transports hold those and call the router.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable
from importlib import metadata
from pathlib import Path
from typing import Final

from asbp import ApplicationAgentId, FaultCode
from gateway.acl import AccessContext, Acl, channel_properties, load_acl
from gateway.auth.credentials import AgentCredentials
from gateway.auth.trust import agent_trust
from gateway.config.model import GatewayConfig, chosen_server
from gateway.connections.addresses import AddressLimits
from gateway.connections.channel_secret import digest as secret_digest
from gateway.connections.channel_secret import new_secret
from gateway.connections.channels import Channel, ChannelKind, ChannelRegistry
from gateway.connections.log_mailbox import LogMailbox
from gateway.connections.outboxes import Mailbox, StreamOutbox
from gateway.connections.tubes import RespondentTable, Tube
from gateway.drain import drain, fence
from gateway.engines.base import Engine, EngineLimits
from gateway.errors import LocalError
from gateway.eventlog.files import FileStore
from gateway.eventlog.recorder import Recorder, Store
from gateway.eventlog.schema import FILES_DIRECTORY
from gateway.messaging import Messaging
from gateway.metrics.counts import RouterCounts
from gateway.plane.base import LogRetention, Plane
from gateway.plane.census import CARD_TOPICS, BrokerCard, Census, Describe, LocalCensus
from gateway.plane.memory import MemoryPlane
from gateway.routing.http_bus import HttpBus
from gateway.routing.router import Router
from gateway.tasks import cancel_and_wait
from gateway.types import CourseStats, Outlets

__all__ = [
    "Broker",
    "create_census",
    "create_engine",
    "create_event_log",
    "create_plane",
    "gateway_version",
    "log_retention",
]


def _access(
    address: str | None, tls: bool, *, channel_id: str, agent_id: str | None = None
) -> AccessContext:
    """What the ACL knows of a new Channel or Tube: its peer and its transport."""
    try:
        return AccessContext(
            address=address,
            channel_properties=channel_properties(tls=tls),
            agent_id=agent_id,
            channel_id=channel_id,
        )
    except ValueError:  # a peer address the server reports oddly (a UNIX socket)
        return AccessContext(
            channel_properties=channel_properties(tls=tls), agent_id=agent_id, channel_id=channel_id
        )


#: Seconds between housekeeping passes, at most.
_TICK: Final = 1.0
#: How long a stopping broker waits for its engine, routing plane, census and event
#: log to close, in all: well inside the servers' and Kubernetes' grace periods.
_STOP_BUDGET: Final = 10.0
#: What each step still gets once the budget is spent.
_STOP_LAST_TRY: Final = 1.0


def create_engine(config: GatewayConfig, *, broker_id: str) -> Engine:
    """The engine ``config.engine`` names, with the limits of ``[messaging]``."""
    messaging = config.messaging
    limits = EngineLimits(
        max_queues=messaging.max_queues,
        ack_timeout=messaging.ack_timeout,
        default_ttl=messaging.default_ttl,
        max_deliveries=messaging.max_deliveries,
        max_queue_depth=messaging.max_queue_depth,
    )
    if config.engine == "redis":
        # Imported here: a memory broker never loads the Redis client.
        from gateway.engines.redis.engine import RedisEngine

        return RedisEngine(config.redis_url, broker_id=broker_id, limits=limits)
    from gateway.engines.memory.engine import MemoryEngine

    return MemoryEngine(limits=limits)


def create_plane(config: GatewayConfig, *, broker_id: str) -> Plane:
    """The bus-wide routing plane, which follows the engine: Redis for ``redis``.

    A ``memory`` broker is alone on its bus, and its router never calls the plane.
    """
    if config.engine == "redis":
        # Imported here: a memory broker never loads the Redis client.
        from gateway.plane.redis.plane import RedisPlane

        return RedisPlane(
            config.redis_url,
            broker_id=broker_id,
            lease=config.bus_lease,
            balance=config.bus_balance,
            retention=log_retention(config),
        )
    return MemoryPlane(
        broker_id,
        lease=config.bus_lease,
        balance=config.bus_balance,
        retention=log_retention(config),
    )


def create_census(
    config: GatewayConfig, *, broker_id: str, describe: Describe, log: logging.Logger
) -> Census:
    """Who is on the bus (gateway.plane.census): the plane's brokers, with their cards."""
    if config.engine == "redis":
        from gateway.plane.census import RedisCensus
        from gateway.plane.redis.plane import PREFIX

        return RedisCensus(
            config.redis_url,
            broker_id=broker_id,
            describe=describe,
            lease=config.bus_lease,
            prefix=PREFIX,
            log=log,
        )
    return LocalCensus(describe)


def gateway_version() -> str:
    """The gateway's version (of the installed package; a checkout says so)."""
    try:
        return metadata.version("asbp-gateway")
    except metadata.PackageNotFoundError:
        return "0.0.0+checkout"


def log_retention(config: GatewayConfig) -> LogRetention:
    """What each Channel's log keeps, from ``[channels]``."""
    channels = config.channels
    return LogRetention(
        max_age=channels.log_max_age,
        max_frames=channels.log_max_frames,
        max_bytes=channels.log_max_bytes,
    )


def create_event_log(
    config: GatewayConfig, *, broker_id: str, log: logging.Logger
) -> Recorder | None:
    """The event log ``config.event_log`` asks for, in the store of ``config.engine``.

    ``None`` when it is off. Nothing is opened yet: files are created on the first
    write, and the Redis connection on the first batch.
    """
    settings = config.event_log
    if settings.mode == "off":
        return None
    store: Store
    if config.engine == "redis":
        # Imported here: a memory broker never loads the Redis client.
        from gateway.eventlog.stream import StreamStore

        store = StreamStore(config.redis_url, max_events=settings.max_events)
    else:
        store = FileStore(
            config.data_dir / FILES_DIRECTORY,
            max_file_bytes=settings.file_bytes,
            max_files=settings.files,
        )
    return Recorder(store, broker_id=broker_id, log=log, capacity=settings.buffer)


class Broker:
    """One broker: registries, router and housekeeping."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        broker_id: str,
        credentials: AgentCredentials | None,
        log: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.broker_id = broker_id
        self.credentials = credentials
        self.log = log or logging.getLogger("asbp.gateway")
        #: When the broker was made (Unix time): the uptime's origin.
        self.started_at = time.time()
        #: The gateway's version, read once (importlib.metadata searches sys.path).
        self.version = gateway_version()
        self.channels = ChannelRegistry()
        #: Open Channels and HTTP Channel opens per client address.
        self.address_limits = AddressLimits(
            self.channels,
            max_per_address=config.channels.max_per_address,
            http_opens_per_second=config.channels.http_opens_per_second,
        )
        self.respondents = RespondentTable()
        self.engine = create_engine(config, broker_id=broker_id)
        #: Where Channels and Respondents are across the bus, and forwarding.
        self.plane = create_plane(config, broker_id=broker_id)
        #: Every live broker of the bus, with its numbers (the management API's).
        self.census = create_census(config, broker_id=broker_id, describe=self.card, log=self.log)
        #: The event log; None when ``event_log.mode`` is off.
        self.event_log = create_event_log(config, broker_id=broker_id, log=self.log)
        # Built in order, each part handed what it calls: Messaging needs the
        # router's replies and the router needs Messaging, so the router builds it
        # (from _messaging) once its replies exist.
        self.messaging: Messaging
        self.router = Router(
            broker_id=broker_id,
            channels=self.channels,
            respondents=self.respondents,
            limits=config.limits,
            channel_limits=config.channels,
            tube_limits=config.tubes,
            log=self.log,
            authenticate_command=config.authenticate_command,
            acl=config.acl,
            may_serve=agent_trust(config).may_serve,
            messaging=self._messaging,
            recorder=self.event_log,
            counts=(
                RouterCounts(max_names=config.metrics.command_names)
                if config.metrics.enabled
                else None
            ),
            plane=self.plane,
        )
        self._acl = config.acl
        #: The Courses' counters for the metrics (set by gateway/app.py); None: none.
        self.courses: CourseStats | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        #: HTTP Channels' homes on a bus (gateway.routing.http_bus; set by
        #: gateway/app.py on a bus of many brokers); None: alone on its bus.
        self.http_bus: HttpBus | None = None
        self._stopped = False
        self.ready = False

    def _messaging(self, outlets: Outlets) -> Messaging:
        """The topics and queues of this broker, sending through ``outlets``."""
        self.messaging = Messaging(
            outlets,
            self.engine,
            broker_id=self.broker_id,
            limits=self.config.messaging,
            frame_limits=self.config.limits,
            acl=self.config.acl,
            log=self.log,
        )
        return self.messaging

    def card(self) -> BrokerCard:
        """This broker as the bus sees it (gateway.plane.census)."""
        auth = self.router.auth
        topics = self.messaging.topic_subscriptions()
        return BrokerCard(
            broker=self.broker_id,
            version=self.version,
            engine=self.config.engine,
            server=chosen_server(self.config),
            started_at=self.started_at,
            channels=len(self.channels),
            tubes=len(self.respondents.tubes()),
            subjects=len(auth.subjects) if auth is not None else 0,
            in_flight=self.router.in_flight,
            agents={agent: len(tubes) for agent, tubes in self.respondents.agents().items()},
            topics=heapq.nlargest(CARD_TOPICS, topics, key=lambda topic: (topic[2], topic[0])),
            topic_count=len(topics),
        )

    # -- life cycle ----------------------------------------------------------

    async def start(self) -> None:
        """Start the engine and housekeeping; call inside the serving event loop."""
        await self.engine.start()
        await self.plane.start(self.router.inbound, self._broker_lost)
        await self.census.start()
        self.messaging.start()
        if self.event_log is not None:
            self.event_log.start()
        self._housekeeping = asyncio.create_task(self._keep_house(), name="asbp-housekeeping")
        self.ready = True
        self.log.info("broker.start", extra={"broker": self.broker_id})

    def _broker_lost(self, broker_id: str) -> None:
        """The plane lost a broker: another (what it owed faults), or this one, which
        the bus took for dead while it ran and which fences itself (gateway.drain)."""
        if broker_id == self.broker_id:
            fence(self)
        else:
            self.router.broker_lost(broker_id)

    async def stop(self) -> None:
        """Stop accepting work and close every Channel and Tube (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self.ready = False
        if self.plane.spans_brokers:
            # On a bus, the others take this broker's work first (gateway.drain):
            # housekeeping still runs meanwhile (Respondent timeouts, leases).
            await self._drain()
        if self._housekeeping is not None:
            await cancel_and_wait(self._housekeeping)
        if self.http_bus is not None:
            # The HTTP Channels homed here keep their Subjects beside their logs for
            # the brokers that take them over: signed in, not signed out by a restart.
            handed = await self.http_bus.hand_over(_STOP_LAST_TRY)
            if handed:
                self.log.info("broker.subjects_handed_over", extra={"channels": handed})
        for tube in self.respondents.tubes():
            self.router.close_tube(tube)
        for channel in self.channels:
            self.router.close_channel(channel)
        # Each step may wait on Redis (a command timeout of its own, retries on a
        # cluster while slots move); together they must still end inside the
        # server's and the orchestrator's grace period, or a stopping broker is
        # killed half-way, or lingers. Past the budget each step gets a last try.
        deadline = asyncio.get_running_loop().time() + _STOP_BUDGET
        await self._stop_step("messaging", self.messaging.stop(), deadline)
        await self._stop_step("census", self.census.close(), deadline)
        await self._stop_step("plane", self.plane.close(), deadline)
        await self._stop_step("engine", self.engine.close(), deadline)
        if self.event_log is not None:
            # Last: everything routed until now is in the buffer, and gets written.
            await self._stop_step("event_log", self.event_log.stop(), deadline)
        self.log.info("broker.stop", extra={"broker": self.broker_id})

    async def _drain(self) -> None:
        """Hand Channels, Tubes and Commands in flight to the rest of the bus, bounded
        by ``drain_timeout`` (and a step of the stop budget past it, at most)."""
        task = asyncio.ensure_future(drain(self))
        await asyncio.wait([task], timeout=self.config.drain_timeout + _STOP_LAST_TRY + 1.0)
        if not task.done():
            self.log.warning("broker.stop_overran", extra={"step": "drain"})
            await cancel_and_wait(task, ignore=(Exception,))
        elif not task.cancelled() and task.exception() is not None:
            self.log.error("broker.stop_failed", extra={"step": "drain"}, exc_info=task.exception())
        else:
            drained = task.result()
            self.log.info(
                "broker.drained",
                extra={
                    "handed_over": drained.handed_over,
                    "closed": drained.closed,
                    "stranded": drained.stranded,
                    "seconds": drained.seconds,
                },
            )

    async def _stop_step(self, step: str, closing: Awaitable[None], deadline: float) -> None:
        """Await ``closing`` until ``deadline`` (or a last :data:`_STOP_LAST_TRY`).

        Run as a task of its own and waited on with ``asyncio.wait``: a timeout
        around it would rely on its cancellation arriving, which redis-py's
        ``wait_for`` can drop (gateway.tasks). Past the deadline the step is
        cancelled, given a last moment, then abandoned and logged: what it held
        ends with the process, and what it leased in the bus expires as a
        crashed broker's does. A step that fails is logged; the next still runs.
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = asyncio.ensure_future(closing)
        await asyncio.wait([task], timeout=max(deadline - started, _STOP_LAST_TRY))
        if not task.done():
            self.log.warning("broker.stop_overran", extra={"step": step})
            await cancel_and_wait(task, ignore=(Exception,), deadline=loop.time() + _STOP_LAST_TRY)
        elif not task.cancelled() and task.exception() is not None:
            self.log.error("broker.stop_failed", extra={"step": step}, exc_info=task.exception())
        seconds = round(loop.time() - started, 3)
        self.log.debug("broker.stop_step", extra={"step": step, "seconds": seconds})

    async def _keep_house(self) -> None:
        tick = min(_TICK, self.config.tubes.respondent_timeout / 4)
        while True:
            await asyncio.sleep(tick)
            self.router.expire()
            self.expire_idle_channels()
            self.messaging.tick()

    def expire_idle_channels(self) -> int:
        """Close HTTP Channels idle longer than the configured timeout."""
        limit = time.monotonic() - self.config.channels.http_idle_timeout
        idle = [c for c in self.channels if c.kind is ChannelKind.HTTP and c.last_seen < limit]
        closed = 0
        for channel in idle:
            if self.http_bus is not None and not channel.visitor:
                # Its home: the Channel may be in use at other brokers (its log says).
                self.http_bus.idle(channel)
                continue
            self.close_channel(channel, FaultCode.UNKNOWN_CHANNEL)
            closed += 1
        return closed

    # -- Channels ------------------------------------------------------------

    def open_websocket_channel(
        self,
        remote: str,
        *,
        address: str | None = None,
        tls: bool = False,
        address_key: str | None = None,
    ) -> tuple[Channel, StreamOutbox]:
        """Open a WebSocket Channel; its first Command tells the User-Agent its ``i``.

        ``address_key`` is what ``address_limits.admit`` returned, to count it under.
        Its secret is made by :meth:`channel_secret`, when the greeting is sent.
        """
        limits = self.config.channels
        outbox = StreamOutbox(limits.outbox_frames, limits.outbox_bytes)
        channel = self.channels.open(
            ChannelKind.WEBSOCKET, outbox, remote=remote, address_key=address_key
        )
        channel.access = _access(address, tls, channel_id=channel.id)
        self.router.channel_opened(channel)
        self.log.info("channel.open", extra={"channel": channel.id, "remote": remote})
        return channel, outbox

    @staticmethod
    def channel_secret(channel: Channel) -> str:
        """Issue ``channel``'s secret; only its digest is kept, the caller tells the client."""
        secret = new_secret()
        channel.secret_digest = secret_digest(secret)
        return secret

    def open_http_channel(
        self,
        remote: str,
        *,
        address: str | None = None,
        tls: bool = False,
        address_key: str | None = None,
    ) -> tuple[Channel, str]:
        """Open a stateless HTTP Channel; returns it and its secret (for its client only).

        On one broker its mailbox is a :class:`Mailbox`; on a bus of many, the
        Channel's log in the plane, so any broker answers its requests.
        ``address_key`` is what ``address_limits.admit`` returned, to count it under.
        """
        limits = self.config.channels
        bus_wide = self.plane.spans_brokers
        outbox: Mailbox | LogMailbox = (
            LogMailbox(self.plane.channel_log)
            if bus_wide
            else Mailbox(limits.outbox_frames, limits.outbox_bytes)
        )
        channel = self.channels.open(
            ChannelKind.HTTP, outbox, remote=remote, address_key=address_key
        )
        secret = self.channel_secret(channel)
        if isinstance(outbox, LogMailbox):
            outbox.channel_id = channel.id
            self.plane.channel_log.open(
                channel.id, digest=channel.secret_digest, idle=limits.http_idle_timeout
            )
        channel.access = _access(address, tls, channel_id=channel.id)
        self.router.channel_opened(channel)
        self.log.info(
            "channel.open", extra={"channel": channel.id, "remote": remote, "transport": "http"}
        )
        return channel, secret

    def adopt_http_channel(
        self, channel_id: str, digest: bytes, remote: str, *, address: str | None, tls: bool
    ) -> Channel:
        """Serve here an HTTP Channel another broker of the bus opened (its log is bus-wide).

        The caller checked the client's secret against ``digest``, the log's.
        """
        channel = self.channels.adopt(
            channel_id, ChannelKind.HTTP, LogMailbox(self.plane.channel_log, channel_id),
            remote=remote,
        )  # fmt: skip
        if not channel.secret_digest:
            channel.secret_digest = digest
            channel.access = _access(address, tls, channel_id=channel.id)
            # A visitor: the Channel's home (its opener) keeps its Subjects and
            # groups and its directory entry (gateway.routing.http_bus).
            channel.visitor = True
            self.log.info(
                "channel.adopt",
                extra={"channel": channel.id, "remote": remote, "transport": "http"},
            )
        return channel

    # -- access control ----------------------------------------------------------

    @property
    def acl(self) -> Acl | None:
        """The access-control lists in force (None: none configured)."""
        return self._acl

    def reload_acl(self) -> Acl:
        """Read the ``[security]`` table again from the file it came from, and check
        every Command, subscription and publication against it from now on.

        Raises:
            AclConfigError: the file cannot be read or holds a bad policy (with its
                line); the lists in force stay.
            LocalError: the broker has no lists from a file, or the file has no
                ``[security]`` table any more (turning access control off takes a
                restart: the router decided at start not to check at all).
        """
        current = self._acl
        if current is None or not current.enabled or current.source is None:
            raise LocalError("no access-control lists were loaded from a file at start")
        fresh = load_acl(Path(current.source))
        if not fresh.enabled:
            raise LocalError(
                f"{current.source} has no [security] table: restart to turn access control off"
            )
        self.router.acl = fresh
        self.messaging.replace_acl(fresh)
        self._acl = fresh
        self.log.warning(
            "acl.reloaded", extra={"source": fresh.source, "policies": list(fresh.policy_names)}
        )
        return fresh

    def close_channel(self, channel: Channel, fault: FaultCode | None = None) -> None:
        """Close ``channel``, recording ``fault`` as the reason."""
        if fault is not None and channel.fault is None:
            channel.fault = fault
        self.router.close_channel(channel)

    # -- Tubes ---------------------------------------------------------------

    def open_tube(
        self, agent_id: str, remote: str, *, address: str | None = None, tls: bool = False
    ) -> tuple[Tube, StreamOutbox]:
        """Open a Tube for a verified Application-Agent identity."""
        limits = self.config.tubes
        outbox = StreamOutbox(limits.outbox_frames, limits.outbox_bytes)
        tube = Tube(ApplicationAgentId(agent_id), outbox, remote)
        tube.gate.own = outbox
        tube.access = _access(address, tls, agent_id=agent_id, channel_id=tube.id)
        self.router.open_tube(tube)
        return tube, outbox

"""The routing plane on Redis: the directory in hashes, forwarding through one stream per broker.

Theory of operation
-------------------
*The directory.* ``<prefix>ch`` maps each Channel-Identifier to the broker
holding it (``<prefix>chz`` holds the same identifiers in a sorted set, every
score 0, written and forgotten with ``ch``: the management API pages the bus's
Channels with ZRANGEBYLEX from a cursor instead of reading the whole hash),
``<prefix>name:<n>`` holds the brokers with Tubes for a Command-Name;
``chs:<b>`` and ``names:<b>`` list what each broker announced, so that its
entries can be dropped in one go. No entry has a TTL of its own: a
broker's whole presence hangs on one key, ``alive:<b>``, set for ``lease / 2``
and renewed every ``lease / 6``. Every lookup checks it, so a broker that dies
drops out of every lookup within ``lease / 2``; each renewal also runs the
sweep script, which forgets the entries of every broker whose lease ran out.
A renewal that finds its own key gone (Redis lost the broker for longer than
the lease, or restarted) announces everything again from the local copy.

*Forwarding.* Each broker reads one inbound stream, ``in:<b>``, with XREAD
BLOCK on a connection of its own, and trims what it read. On one Redis a
forward is one script call (:mod:`gateway.plane.redis.scripts`) that finds a
live target and XADDs to its stream; on a Redis Cluster, where the directory
and each stream sit in different slots (:mod:`gateway.plane.redis.keys`), it is
two: a lookup in the directory, then a send that XADDs if the lease beside the
stream still holds. The calls are batched like the engine's
(:class:`gateway.engines.redis.batch.Batcher`, split by slot on a cluster):
under load, a hundred forwards share one pipeline. A stream rather than pub/sub because a stream
keeps what its reader has not read yet (a reader reconnecting after a blip
loses nothing) and an XADD to a broker whose lease is gone is refused, so a
forward to a dead broker faults instead of vanishing. The stream is capped
(``MAXLEN ~``) so that a broker that stops reading cannot fill Redis.

*Liveness of peers.* The brokers this one forwarded to are its peers; each
renewal reads their ``alive`` keys (one MGET) and reports the ones gone to the
router (``lost``), which faults the Commands they owed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from redis.asyncio.connection import AbstractConnection

from gateway.engines.base import EngineUnavailable
from gateway.engines.redis.batch import (
    CONNECTION_ERRORS,
    Batcher,
    Call,
    _pack_command,
    fail_future,
)
from gateway.engines.redis.calls import script_command
from gateway.engines.redis.cluster_url import is_cluster_url
from gateway.engines.redis.connection import Client, batcher, connect, node_connection, refresh
from gateway.engines.redis.resp import RespConnection, open_connection
from gateway.plane.base import (
    DEFAULT_LEASE,
    Balance,
    ChannelListing,
    ChannelLog,
    Envelope,
    EnvelopeKind,
    Inbound,
    LogRetention,
    Lost,
    PlaneUnavailable,
)
from gateway.plane.redis.batches import (
    BATCH_SCRIPTS,
    FRAMES,
    LIVE_VERSION,
    RECORDS,
    FrameBatch,
    RecordBatch,
    RequestBatch,
    unpack_answers,
    unpack_frames,
    unpack_records,
)
from gateway.plane.redis.claims import CLAIM_SCRIPTS, claim_command, claimed
from gateway.plane.redis.counted_barriers import COUNTED
from gateway.plane.redis.keys import directory_prefix, live_key, stream_key
from gateway.plane.redis.log import LOG_FORMAT, RedisChannelLog
from gateway.plane.redis.log_scripts import LOG_SCRIPTS
from gateway.plane.redis.scripts import (
    CHANNEL_CLOSED,
    CHANNEL_PAGE,
    DONE,
    FORWARD_CHANNEL,
    FORWARD_EACH,
    LEAVE,
    REPORT,
    SCRIPTS,
    SEND_TO,
    SWEEP,
)
from gateway.tasks import cancel_and_wait, end_within

__all__ = ["PREFIX", "SWEEP_BATCH", "RedisPlane"]

_log = logging.getLogger("asbp.plane")

#: Where the plane's keys live in Redis, beside the engine's.
PREFIX: Final = "asbp:plane:"
#: Entries an inbound stream keeps at most (approximately), read or not.
STREAM_MAX: Final = 100_000
#: Milliseconds one XREAD waits for an entry before it asks again (and the reader
#: sees whether the plane is stopping).
_BLOCK_MS: Final = 200
#: Seconds past a read's BLOCK that a stopping plane waits for its reader to notice.
_READER_GRACE: Final = 0.5
#: Seconds a closing plane waits to leave the directory, then for its last calls.
_CLOSE_TIMEOUT: Final = 4.0
#: Entries one XREAD returns at most.
_READ_COUNT: Final = 1024
_READER: Final = "asbp-plane-inbound"
#: Directory entries one sweep or leave script forgets at most: a broker that held
#: very many Channels is forgotten over several calls, each short enough that other
#: brokers' forwards are not held up behind it for long.
SWEEP_BATCH: Final = 1000
#: Between the ``among`` agents or groups of a stream entry: no header value, quoted
#: or not, can hold a line feed (draft §1.3.4.1), where a group name can hold ",".
_SEPARATOR: Final = "\n"
#: On a Redis Cluster, each send is followed by ``WAIT 1 <ms>`` on its primary: the
#: forward is reported sent once the primary's replica has it too (or this many
#: milliseconds passed), so a failover right after it does not lose it.
REPLICA_WAIT_MS: Final = 1000
#: Seconds to connect, and to wait for a reply, before the bus counts as unreachable.
_CONNECT_TIMEOUT: Final = 5.0
_COMMAND_TIMEOUT: Final = 10.0
_KINDS: Final = {kind.value.encode(): kind for kind in EnvelopeKind}
#: The ``k`` of a wake-up for a reader parked on a Channel log (gateway.plane.redis.log).
_WAKE: Final = b"w"


class _Future(Call):
    """One script call whose reply ``convert`` turns into the future's result.

    ``then``: commands written right after it whose replies are not the result
    (the WAIT after a send on a cluster).
    """

    __slots__ = ("_command", "_convert", "_then", "future")

    def __init__(
        self, command: tuple[Any, ...], convert: Any, then: tuple[tuple[Any, ...], ...] = ()
    ) -> None:
        self._command = command
        self._convert = convert
        self._then = then
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return (self._command, *self._then)

    def settle(self, replies: Sequence[Any]) -> None:
        reply = replies[0]
        if isinstance(reply, Exception):
            self.fail(reply)
        elif not self.future.done():
            self.future.set_result(self._convert(reply))

    def fail(self, error: BaseException) -> None:
        unavailable = PlaneUnavailable(f"the bus is unreachable: {error}")
        unavailable.__cause__ = error
        fail_future(self.future, unavailable)


class _Announcements(Call):
    """Directory writes nobody waits for: every one until the next pipeline, merged."""

    __slots__ = ("_commands",)
    merge_key = "plane-announcements"

    def __init__(self, commands: list[tuple[Any, ...]]) -> None:
        self._commands = commands

    def merge(self, other: Call) -> None:
        assert isinstance(other, _Announcements)
        self._commands.extend(other._commands)

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return self._commands

    def settle(self, replies: Sequence[Any]) -> None:
        errors = [reply for reply in replies if isinstance(reply, Exception)]
        if errors:
            _log.warning("plane.announce_failed", extra={"error": str(errors[0])})

    def fail(self, error: BaseException) -> None:
        # The next renewal that finds its lease gone announces everything again.
        _log.warning("plane.announce_failed", extra={"error": str(error)})


class _Reports(_Announcements):
    """The loads ``report_load`` reports, read when the pipeline is written."""

    __slots__ = ("_plane",)
    merge_key = "plane-reports"

    def __init__(self, plane: RedisPlane) -> None:
        super().__init__([])
        self._plane = plane

    def merge(self, other: Call) -> None:
        """Nothing to take over: the plane holds the reports until written."""

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return self._plane._take_reports()


class _Done(_Announcements):
    """The counts ``request_done`` lowers, taken when the pipeline is written."""

    __slots__ = ("_plane",)
    merge_key = "plane-done"

    def __init__(self, plane: RedisPlane) -> None:
        super().__init__([])
        self._plane = plane

    def merge(self, other: Call) -> None:
        """Nothing to take over: the plane holds the counts until written."""

    def commands(self) -> Sequence[tuple[Any, ...]]:
        return self._plane._take_done()


def _text(reply: Any) -> str | None:
    return reply.decode() if isinstance(reply, bytes) else None


def _names(reply: Any) -> tuple[str, ...]:
    return tuple(b.decode() for b in reply)


class RedisPlane:
    """The routing plane of the brokers sharing one Redis; see the module docstring.

    Args:
        url: the Redis (the engine's): one Redis, or a Redis Cluster
            (``redis+cluster://``, :mod:`gateway.engines.redis.connection`).
        broker_id: this broker's Broker-Identifier.
        lease: seconds within which a dead broker drops out of every lookup.
        prefix: the keys' prefix (tests use their own).
        sweep_batch: directory entries one script call forgets at most.
        balance: how ``forward_request`` picks among brokers (gateway.plane.base).
        retention: what each Channel's log keeps at most.
        clock: seconds since the epoch, for the Channel logs' times.
    """

    def __init__(
        self,
        url: str,
        *,
        broker_id: str,
        lease: float = DEFAULT_LEASE,
        prefix: str = PREFIX,
        sweep_batch: int = SWEEP_BATCH,
        balance: Balance = "in_flight",
        retention: LogRetention | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._balance = balance
        self._sweep_batch = sweep_batch
        #: Answered requests per (name, broker), for the next pipeline (request_done).
        self._done: dict[tuple[str, str], int] = {}
        #: Reports for the next pipeline: name -> its count, read then (report_load).
        self._reports: dict[str, Callable[[], int]] = {}
        #: Requests read per name served since it was announced (report_load).
        self._received: dict[str, int] = {}
        #: Made by the first broker to start on this Redis; kept there for good.
        self._bus_id = ""
        self._url = url
        self._broker_id = broker_id
        self._lease = lease
        # Directory keys share one hash tag; each broker's stream has its own
        # (gateway/plane/redis/keys.py).
        self._prefix = directory_prefix(prefix)
        self._stream_prefix = prefix
        self._stream = stream_key(prefix, broker_id)
        self._live = live_key(prefix, broker_id)
        self._client: Client | None = None
        self._after_send: tuple[tuple[Any, ...], ...] = ()
        self._cluster = is_cluster_url(url)
        self._batcher: Batcher | None = None
        #: Calls still taking envelopes (gateway.plane.redis.batches): the frames
        #: for each (broker, Channel), and the requests for one Command-Name.
        #: Sealed (forgotten) whenever another plane call is submitted.
        self._open_frames: dict[tuple[str, str], FrameBatch] = {}
        self._open_requests: RequestBatch | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        #: Abandoned (a crash, :meth:`abandon`): what a read brings back is not handed on.
        self._abandoned = False
        #: The last entry of the inbound stream handed to the router: a leaving
        #: broker trims through it before it salvages the rest (_leave).
        self._read_through: bytes | None = None
        self._inbound: Inbound | None = None
        self._lost: Lost | None = None
        #: Whether this broker has held a lease since it started: a renewal that then
        #: finds it gone means the bus took this broker for dead (_renew).
        self._present = False
        #: What this broker announced, to announce again after losing its lease.
        self._channels: set[str] = set()
        self._names: set[str] = set()
        self._groups: set[str] = set()
        self._addresses: set[str] = set()
        self._peers: set[str] = set()
        self._log = RedisChannelLog(
            self._submit,
            prefix=prefix,
            broker_id=broker_id,
            retention=retention or LogRetention(),
            stream_max=STREAM_MAX,
            clock=clock,
            cluster=self._cluster,
            lease=lease,
        )
        self._log.forward = self._forward_salvaged

    @property
    def broker_id(self) -> str:
        return self._broker_id

    @property
    def spans_brokers(self) -> bool:
        return True

    @property
    def bus_id(self) -> str:
        return self._bus_id

    @property
    def lease(self) -> float:
        return self._lease

    @property
    def channel_log(self) -> ChannelLog:
        return self._log

    # -- life cycle ------------------------------------------------------------

    async def start(self, inbound: Inbound, lost: Lost) -> None:
        self._inbound = inbound
        self._lost = lost
        self._client = connect(
            self._url, connect_timeout=_CONNECT_TIMEOUT, command_timeout=_COMMAND_TIMEOUT
        )
        # A cluster's primaries have replicas to wait for (ClusterBatcher sends the
        # WAIT to the primary of the command before it).
        self._cluster = is_cluster_url(self._url)
        self._after_send = (("WAIT", 1, REPLICA_WAIT_MS),) if self._cluster else ()
        self._batcher = batcher(
            self._client, (*SCRIPTS, *LOG_SCRIPTS, *BATCH_SCRIPTS, *CLAIM_SCRIPTS)
        )
        try:
            await self._batcher.load_scripts()
            key = f"{self._prefix}bus"
            await self._call(("SET", key, uuid.uuid4().hex, "NX"))
            self._bus_id = (await self._call(("GET", key))).decode()
            # A broker restarted with the same identifier starts clean: whatever
            # its previous life announced or was sent is gone with it.
            await self._leave()
            await self._renew()
        except (EngineUnavailable, PlaneUnavailable) as exc:
            await self.close()
            raise PlaneUnavailable(str(exc)) from exc
        self._tasks = [
            asyncio.create_task(self._keep_lease(), name="asbp-plane-lease"),
            asyncio.create_task(self._read(), name=_READER),
        ]

    async def close(self) -> None:
        await self._halt()
        if self._batcher is not None and self._client is not None:
            # Bounded: on a cluster a call may keep being sent again for up to
            # REDIRECT_DEADLINE (15 s) while slots move; a broker that cannot leave in
            # time is forgotten when its lease runs out, as a crashed one is.
            with contextlib.suppress(PlaneUnavailable, EngineUnavailable, TimeoutError):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await self._leave()
        await self._disconnect()

    async def abandon(self) -> None:
        """Stop renewing and reading without leaving, as a crashed broker does: a read
        under way when it is called hands nothing more on (nor trims it)."""
        self._abandoned = True
        await self._halt()
        await self._disconnect()

    async def _halt(self) -> None:
        tasks, self._tasks = self._tasks, []
        self._stopping = True
        # A read cancelled mid-reply can fail inside redis-py; nothing it did matters now.
        ignore = (AttributeError, *CONNECTION_ERRORS)
        for task in tasks:
            if task.get_name() == _READER:
                # It looks at _stopping between reads, each blocking at most _BLOCK_MS;
                # a read that Redis leaves unanswered (a stopped Redis) is cancelled.
                await end_within(task, _BLOCK_MS / 1000 + _READER_GRACE, ignore=ignore)
            else:
                await cancel_and_wait(task, ignore=ignore)
        self._inbound = None
        self._log.wake_all()

    async def _disconnect(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            # What is still being sent again after _CLOSE_TIMEOUT fails as the client
            # closes below (a Command in flight at a stopping broker faults anyway).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CLOSE_TIMEOUT):
                    await batcher.close()
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    # -- the lease -------------------------------------------------------------

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 6)
            # A cluster's release barrier whose counted frames never came (their sender
            # died between its two calls) is lifted after the lease.
            self._log.expire_barriers()
            try:
                await self._renew()
            except PlaneUnavailable as exc:
                _log.warning("plane.renew_failed", extra={"error": str(exc)})

    async def _renew(self) -> None:
        prefix = self._prefix
        alive = f"{prefix}alive:{self._broker_id}"
        # XX: a lease that ran out is not taken back in the same call, so that this
        # broker can fence itself (below) while the bus still counts it dead.
        # Its value says which Channel-log entries this broker reads (log.py, LOG_FORMAT).
        lease = int(self._lease * 500)
        previous = await self._call(("SET", alive, LOG_FORMAT, "PX", lease, "XX", "GET"))
        if previous is None:
            if self._present:
                # The bus took this running broker for dead (its loop stalled past
                # the lease, or Redis lost its key) and may have swept its entries.
                taken = await self._taken()
                _log.warning("plane.lease_lost", extra={"broker": self._broker_id, "taken": taken})
                if taken and self._lost is not None:
                    # Frames routed to its Channels meanwhile went into their logs,
                    # which their open connections never read: the broker fences
                    # before anything reaches it again (gateway.drain, ``fence``).
                    self._lost(self._broker_id)
            await self._call(("SET", alive, LOG_FORMAT, "PX", lease))
            self._present = True
        # The copy beside the stream, which sends check (another slot on a cluster);
        # its value says this broker reads packed entries (gateway.plane.redis.batches).
        await self._call(("SET", self._live, LIVE_VERSION, "PX", int(self._lease * 500)))
        if previous is None:
            self._announce_all()
        await self._call(("SADD", f"{prefix}brokers", self._broker_id))
        await self.sweep()
        await self.learn_log_format()
        peers = sorted(self._peers)
        if peers:
            alive = await self._call(("MGET", *[f"{prefix}alive:{peer}" for peer in peers]))
            for peer, flag in zip(peers, alive, strict=True):
                if flag is None:
                    self._peers.discard(peer)
                    if self._lost is not None:
                        self._lost(peer)

    async def _taken(self) -> int:
        """How many logs of the Channels this broker holds someone else wrote into
        or took while its lease was gone: a frame routed meanwhile clears the log's
        holder (log_scripts.py, ``holder``), a resume elsewhere replaces it."""
        me = self._broker_id.encode()
        channels = list(self._channels)
        replies = await asyncio.gather(
            *(self._call(("HMGET", self._log.meta_key(c), "h", "w")) for c in channels)
        )
        # No digest (``h``): no log (the Channel cannot resume), nothing to read back.
        return sum(1 for digest, holder in replies if digest is not None and holder != me)

    async def learn_log_format(self) -> None:
        """Whether every broker of the bus reads Channel-log entries of several frames:
        until then this broker's logs take one entry per frame (log.py, LOG_FORMAT).
        Asked at every renewal, so a rolling upgrade packs once its last older broker
        has gone."""
        prefix = self._prefix
        brokers = sorted(_names(await self._call(("SMEMBERS", f"{prefix}brokers"))))
        if not brokers:  # pragma: no cover - this broker is a member once renewed
            return
        leases = await self._call(("MGET", *[f"{prefix}alive:{b}" for b in brokers]))
        self._log.packs = all(lease in (None, LOG_FORMAT.encode()) for lease in leases)

    async def _leave(self) -> None:
        """Drop this broker's entries, a batch per script call, then its stream
        (in a slot of its own on a cluster, so not in the script).

        The leases go first, so that sends to this broker are refused (their
        senders follow the Channel instead: gateway.routing.remote); then what
        its stream still holds for the WebSocket Channels it held goes into their
        logs, or to the broker that resumed them (a rolling restart: the stream
        is not read any more), as for a broker that died.
        """
        read = self._read_through
        if read is not None:
            # What the reader handled goes first, while the lease still stands:
            # its trim may not have been sent when the reader stopped, and a frame
            # already delivered that this salvage, or another broker's sweep once
            # the lease is gone, saved again would be delivered twice.
            await self._call(("XTRIM", self._stream, "MINID", _after(read)))
        # Two calls: on a cluster the lease and its copy beside the stream are in
        # different slots.
        await self._call(("DEL", f"{self._prefix}alive:{self._broker_id}"))
        await self._call(("DEL", self._live))
        if self._cluster:
            await self._log.salvage_from(self._broker_id)
        else:
            await self._call(self._log.salvage(self._stream, self._broker_id))
        brokers = (f"{self._prefix}brokers",)
        args = (self._prefix, self._broker_id, self._sweep_batch)
        leave = script_command(LEAVE, brokers, args)
        while not await self._call(leave):
            pass
        await self._call(("DEL", self._stream, self._live))

    async def sweep(self) -> int:
        """Forget every broker whose lease ran out, a batch per script call.

        Returns:
            How many brokers were forgotten whole.
        """
        sweep = script_command(
            SWEEP, (f"{self._prefix}brokers",), (self._prefix, self._sweep_batch)
        )
        swept = 0
        while True:
            gone, more = await self._call(sweep)
            for broker_id in _names(gone):
                # Its stream and the lease beside it: another slot on a cluster.
                stream_prefix = self._stream_prefix
                if self._cluster:
                    # Another slot than the logs: taken out, then saved (log.py).
                    await self._log.salvage_from(broker_id)
                else:
                    # What it never read for the WebSocket Channels it held goes
                    # into their logs first (gateway.connections.resume).
                    await self._call(
                        self._log.salvage(stream_key(stream_prefix, broker_id), broker_id)
                    )
                await self._call(
                    (
                        "DEL",
                        stream_key(stream_prefix, broker_id),
                        live_key(stream_prefix, broker_id),
                    )
                )
            swept += len(gone)
            if not more:
                return swept

    def _forward_salvaged(self, channel_id: str, frame: bytes) -> None:
        """A frame saved from a dead broker's stream for a Channel held elsewhere now (a
        Redis Cluster): on to it, as any frame for it."""
        envelope = Envelope(EnvelopeKind.CHANNEL, self._broker_id, channel_id, frame)
        with contextlib.suppress(EngineUnavailable):
            self.forward_to_channel(channel_id, envelope)

    def _announce_all(self) -> None:
        commands: list[tuple[Any, ...]] = []
        for channel_id in self._channels:
            commands.extend(self._channel_commands(channel_id, opened=True))
        for name in self._names:
            commands.extend(self._name_commands(name, serving=True))
        for group in self._groups:
            commands.extend(self._held_commands("grp", group, held=True))
        for address in self._addresses:
            commands.extend(self._held_commands("addr", address, held=True))
        if commands:
            self._announce(commands)

    # -- the directory ---------------------------------------------------------

    def channel_opened(self, channel_id: str) -> None:
        self._channels.add(channel_id)
        self._announce(self._channel_commands(channel_id, opened=True))

    def channel_closed(self, channel_id: str) -> None:
        self._channels.discard(channel_id)
        self._announce(self._channel_commands(channel_id, opened=False))

    def claim_channel(self, channel_id: str) -> asyncio.Future[str]:
        def won(reply: Any) -> str:
            holder = claimed(reply)
            if holder == self._broker_id:
                self._channels.add(channel_id)  # announced again after a lost lease
            return holder

        return self._submit(claim_command(self._prefix, self._broker_id, channel_id), won)

    def serving(self, name: str) -> None:
        self._names.add(name)
        self._announce(self._name_commands(name, serving=True))

    def not_serving(self, name: str) -> None:
        self._names.discard(name)
        self._announce(self._name_commands(name, serving=False))

    def report_load(self, name: str, in_flight: Callable[[], int]) -> None:
        if self._batcher is None:
            return
        reports = self._reports
        if not reports:
            # One call per pipeline; the counts are read when it is written.
            try:
                self._batcher.submit(_Reports(self))
            except EngineUnavailable:
                return
        reports[name] = in_flight

    def _take_reports(self) -> list[tuple[Any, ...]]:
        reports, self._reports = self._reports, {}
        commands = []
        for name, in_flight in reports.items():
            # Only while serving: a report after not_serving would bring the name
            # back (the script checks too).
            if name in self._names:
                keys = (f"{self._prefix}name:{name}", f"{self._prefix}fwd:{name}")
                received = self._received.get(name, 0)
                commands.append(
                    script_command(REPORT, keys, (self._broker_id, in_flight(), received))
                )
        return commands

    def request_received(self, name: str) -> None:
        if name in self._names:
            self._received[name] = self._received.get(name, 0) + 1

    def request_done(self, name: str, broker_id: str) -> None:
        if self._balance != "in_flight" or self._batcher is None:
            return
        key = (name, broker_id)
        done = self._done
        if not done:
            # One call per pipeline, whatever was answered meanwhile: under load a
            # hundred answers cost one script call per (name, broker), not a hundred.
            try:
                self._batcher.submit(_Done(self))
            except EngineUnavailable:
                return  # closing: the counts go with the broker's entries
        done[key] = done.get(key, 0) + 1

    def _take_done(self) -> list[tuple[Any, ...]]:
        done, self._done = self._done, {}
        return [
            script_command(DONE, (f"{self._prefix}name:{name}",), (broker_id, count))
            for (name, broker_id), count in done.items()
        ]

    def group_joined(self, group: str) -> None:
        self._groups.add(group)
        self._announce(self._held_commands("grp", group, held=True))

    def group_left(self, group: str) -> None:
        self._groups.discard(group)
        self._announce(self._held_commands("grp", group, held=False))

    def address_held(self, address: str) -> None:
        self._addresses.add(address)
        self._announce(self._held_commands("addr", address, held=True))

    def address_released(self, address: str) -> None:
        self._addresses.discard(address)
        self._announce(self._held_commands("addr", address, held=False))

    def _held_commands(self, kind: str, name: str, *, held: bool) -> list[tuple[Any, ...]]:
        """Announce (or withdraw) that this broker holds ``name``: a group (``grp``)
        or a Conversation-Address (``addr``). A hash of brokers per name, and a set
        of names per broker for the sweep (scripts.py, forget), both in the
        directory's slot."""
        own = f"{self._prefix}{kind}s:{self._broker_id}"
        key = f"{self._prefix}{kind}:{name}"
        if held:
            return [("HSET", key, self._broker_id, "1"), ("SADD", own, name)]
        return [("HDEL", key, self._broker_id), ("SREM", own, name)]

    def _channel_commands(self, channel_id: str, *, opened: bool) -> list[tuple[Any, ...]]:
        own = f"{self._prefix}chs:{self._broker_id}"
        if opened:
            return [
                ("HSET", f"{self._prefix}ch", channel_id, self._broker_id),
                ("ZADD", f"{self._prefix}chz", 0, channel_id),
                ("SADD", own, channel_id),
            ]
        return [
            script_command(
                CHANNEL_CLOSED,
                (f"{self._prefix}ch", own, f"{self._prefix}chz"),
                (channel_id, self._broker_id),
            )
        ]

    def _name_commands(self, name: str, *, serving: bool) -> list[tuple[Any, ...]]:
        own = f"{self._prefix}names:{self._broker_id}"
        key = f"{self._prefix}name:{name}"
        forwarded = f"{self._prefix}fwd:{name}"
        # Both counts start again from zero with the entry (report_load).
        self._received.pop(name, None)
        if serving:
            return [
                ("HSET", key, self._broker_id, "0"),
                ("HSET", forwarded, self._broker_id, "0"),
                ("SADD", own, name),
            ]
        return [
            ("HDEL", key, self._broker_id),
            ("HDEL", forwarded, self._broker_id),
            ("SREM", own, name),
        ]

    def _announce(self, commands: list[tuple[Any, ...]]) -> None:
        batcher = self._batcher
        if batcher is None:
            return
        with contextlib.suppress(EngineUnavailable):  # closing: leaving drops it all anyway
            batcher.submit(_Announcements(commands))

    def written(self) -> asyncio.Future[None]:
        # The batcher sends calls in the order submitted, announcements included,
        # so a read answered after them means every announcement before it was
        # written. A directory key, not a PING: on a cluster the read goes to the
        # directory's primary, behind the announcements on the same connection.
        return self._submit(("EXISTS", f"{self._prefix}bus"), lambda reply: None)

    async def alive(self, broker_id: str) -> bool:
        return await self._alive(broker_id)

    async def locate_channel(self, channel_id: str) -> str | None:
        broker_id = _text(await self._call(("HGET", f"{self._prefix}ch", channel_id)))
        if broker_id is None or not await self._alive(broker_id):
            return None
        return broker_id

    async def channel_page(self, after: str, offset: int, limit: int) -> ChannelListing:
        prefix = self._prefix
        reply = await self._call(
            script_command(
                CHANNEL_PAGE,
                (f"{prefix}chz", f"{prefix}ch", f"{prefix}brokers"),
                (prefix, after, offset, limit),
            )
        )
        pairs = reply[1:]
        return ChannelListing(
            int(reply[0]),
            tuple(
                (_text(pairs[n]) or "", _text(pairs[n + 1]) or "") for n in range(0, len(pairs), 2)
            ),
        )

    async def respondents(self, name: str) -> frozenset[str]:
        brokers = [b.decode() for b in await self._call(("HKEYS", f"{self._prefix}name:{name}"))]
        alive = [b for b in brokers if await self._alive(b)]
        return frozenset(alive)

    async def group_brokers(self, group: str) -> frozenset[str]:
        brokers = [b.decode() for b in await self._call(("HKEYS", f"{self._prefix}grp:{group}"))]
        return frozenset([b for b in brokers if await self._alive(b)])

    async def address_brokers(self, address: str) -> frozenset[str]:
        brokers = [b.decode() for b in await self._call(("HKEYS", f"{self._prefix}addr:{address}"))]
        # The leases checked together: one pipeline (the Batcher), not a trip each.
        alive = await asyncio.gather(*(self._alive(b) for b in brokers))
        return frozenset(b for b, live in zip(brokers, alive, strict=True) if live)

    async def _alive(self, broker_id: str) -> bool:
        return bool(await self._call(("EXISTS", f"{self._prefix}alive:{broker_id}")))

    # -- forwarding ------------------------------------------------------------

    def forward_request(self, name: str, envelope: Envelope) -> asyncio.Future[str | None]:
        # One script finds the targets of the requests made meanwhile and, on one
        # Redis, sends them; on a cluster a call per target sends (batches.py).
        batch = self._open_requests
        if batch is not None and batch.name == name and not batch.full():
            return batch.add(envelope)
        self._seal()
        keys = (f"{self._prefix}name:{name}", f"{self._prefix}fwd:{name}")
        lookup = (self._prefix, self._broker_id, self._balance)
        if self._cluster:
            lookup_args = (*lookup, "", STREAM_MAX)
            batch = RequestBatch(keys, lookup_args, name, self._peers.add, self._send_records)
        else:
            lookup_args = (*lookup, self._stream_prefix, STREAM_MAX)
            batch = RequestBatch(keys, lookup_args, name, self._peers.add)
        placed = batch.add(envelope)
        if self._submit_batch(batch):
            self._open_requests = batch
        return placed

    def _send_records(
        self, target: str, records: list[bytes], futures: list[asyncio.Future[Any]]
    ) -> None:
        """On a cluster: the requests looked up for ``target``, sent in one call."""
        batch = RecordBatch(
            stream_key(self._stream_prefix, target),
            live_key(self._stream_prefix, target),
            self._broker_id,
            target,
            STREAM_MAX,
            self._after_send,
            self._peers.add,
        )
        batch.take(records, futures)
        self._submit_batch(batch)

    def forward_to_channel(self, channel_id: str, envelope: Envelope) -> asyncio.Future[str | None]:
        if envelope.kind is EnvelopeKind.CHANNEL and not self._cluster:
            # A Channel with a log (an HTTP Channel) takes it there, in the same call.
            command = self._log.log_or_forward(channel_id, envelope.frame, f"{self._prefix}ch")
            return self._submit(command, self._peer)
        if envelope.kind is EnvelopeKind.CHANNEL:
            # On a cluster the log, the directory and the target's stream are three
            # slots: the log first, then (no log) the lookup and the send.
            return self._log_then_forward(channel_id, envelope)
        keys = (f"{self._prefix}ch",)
        # The lookup writes a JOIN's groups into the directory too (scripts.py).
        lookup = (self._prefix, channel_id, envelope.kind.value, _SEPARATOR.join(envelope.among))
        if not self._cluster:
            args = (*lookup, self._stream_prefix, self._broker_id, envelope.frame, STREAM_MAX)
            return self._submit(script_command(FORWARD_CHANNEL, keys, args), self._peer)
        lookup_command = script_command(FORWARD_CHANNEL, keys, lookup)
        return self._forward(lookup_command, envelope, channel=channel_id)

    def _log_then_forward(self, channel_id: str, envelope: Envelope) -> asyncio.Future[str | None]:
        result: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        # The log's slot: into the log, or the holder, this frame counted as on its way
        # to it (gateway.plane.redis.counted_barriers: its release barrier waits for it).
        logged = self._log.append_or_holder(channel_id, envelope.frame)

        def settle(future: asyncio.Future[str | None]) -> None:
            if result.done():
                return
            if future.cancelled():
                result.cancel()
            elif (error := future.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(future.result())

        def sent(holder: str, future: asyncio.Future[bool]) -> None:
            if result.done():
                return
            if future.cancelled():
                result.cancel()
            elif (error := future.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(self._peer(holder.encode()) if future.result() else None)

        def appended(future: asyncio.Future[tuple[int, str]]) -> None:
            if result.done():
                return
            if future.cancelled():
                result.cancel()
                return
            if (error := future.exception()) is not None:
                result.set_exception(error)
                return
            number, holder = future.result()
            if number > 0:
                result.set_result(self._broker_id)  # into the Channel's log (as _peer says)
            elif holder:
                # Straight to the holder (no lookup: the log names it), marked counted.
                counted = Envelope(
                    envelope.kind, envelope.origin, channel_id, envelope.frame, (COUNTED,)
                )
                send = self._submit(self._send_command(holder, counted), bool, self._after_send)
                send.add_done_callback(functools.partial(sent, holder))
            else:
                lookup = (self._prefix, channel_id, envelope.kind.value, "")
                command = script_command(FORWARD_CHANNEL, (f"{self._prefix}ch",), lookup)
                self._forward(command, envelope, channel=channel_id).add_done_callback(settle)

        logged.add_done_callback(appended)
        return result

    def forward_to_servers(self, name: str, envelope: Envelope) -> asyncio.Future[tuple[str, ...]]:
        return self._forward_each((f"{self._prefix}name:{name}",), envelope)

    def forward_to_groups(self, envelope: Envelope) -> asyncio.Future[tuple[str, ...]]:
        keys = tuple(f"{self._prefix}grp:{group}" for group in envelope.among)
        return self._forward_each(keys, envelope)

    def _forward_each(
        self, keys: tuple[str, ...], envelope: Envelope
    ) -> asyncio.Future[tuple[str, ...]]:
        if not self._cluster:  # one script finds every target and sends to each
            args = (
                self._prefix,
                self._broker_id,
                self._stream_prefix,
                envelope.kind.value,
                envelope.channel,
                envelope.frame,
                STREAM_MAX,
                _SEPARATOR.join(envelope.among),
            )
            return self._submit(script_command(FORWARD_EACH, keys, args), self._targets)
        # On a cluster: the lookup (the directory's slot), then a send per target
        # (each stream's slot), submitted together as the lookup settles.
        result: asyncio.Future[tuple[str, ...]] = asyncio.get_running_loop().create_future()
        found = self._submit(
            script_command(FORWARD_EACH, keys, (self._prefix, self._broker_id)), _names
        )

        def looked_up(future: asyncio.Future[tuple[str, ...]]) -> None:
            if result.done():
                return
            if future.cancelled():
                result.cancel()
                return
            if (error := future.exception()) is not None:
                result.set_exception(error)
                return
            targets = future.result()
            if not targets:
                result.set_result(())
                return
            sends = [
                self._submit(self._send_command(target, envelope), bool, self._after_send)
                for target in targets
            ]
            gathered = asyncio.gather(*sends, return_exceptions=True)

            def sent(done: asyncio.Future[list[Any]]) -> None:
                if result.done():
                    return
                if done.cancelled():
                    result.cancel()
                    return
                replies = done.result()
                errors = [r for r in replies if isinstance(r, BaseException)]
                if errors:
                    result.set_exception(errors[0])
                    return
                reached = tuple(t for t, ok in zip(targets, replies, strict=True) if ok)
                self._peers.update(reached)
                result.set_result(reached)

            gathered.add_done_callback(sent)

        found.add_done_callback(looked_up)
        return result

    def _targets(self, reply: Any) -> tuple[str, ...]:
        targets = _names(reply)
        self._peers.update(targets)
        return targets

    def send_to(self, broker_id: str, envelope: Envelope) -> asyncio.Future[bool]:
        self._peers.add(broker_id)
        if envelope.kind is not EnvelopeKind.CHANNEL:
            return self._submit(self._send_command(broker_id, envelope), bool, self._after_send)
        # Answers for one Channel at one broker: one call, one entry (batches.py).
        key = (broker_id, envelope.channel)
        batch = self._open_frames.get(key)
        if batch is not None and not batch.full():
            return batch.add(envelope.frame, envelope.command_id)
        batch = FrameBatch(
            stream_key(self._stream_prefix, broker_id),
            live_key(self._stream_prefix, broker_id),
            self._broker_id,
            envelope.channel,
            STREAM_MAX,
            self._after_send,
        )
        sent = batch.add(envelope.frame, envelope.command_id)
        if self._submit_batch(batch):
            self._open_frames[key] = batch
        return sent

    def _submit_batch(self, batch: FrameBatch | RequestBatch | RecordBatch) -> bool:
        """Submit ``batch``; False (and the batch failed) when the plane cannot take it."""
        if self._batcher is None:
            batch.fail(EngineUnavailable("the plane is not started"))
            return False
        try:
            self._batcher.submit(batch)
        except EngineUnavailable as exc:
            batch.fail(exc)
            return False
        return True

    def _seal(self) -> None:
        """Envelopes handed over from now on go after every call submitted so far:
        the open batches take no more (so each broker gets envelopes in order)."""
        if self._open_frames:
            self._open_frames.clear()
        self._open_requests = None

    def _send_command(
        self, broker_id: str, envelope: Envelope, channel: str | None = None
    ) -> tuple[Any, ...]:
        return script_command(
            SEND_TO,
            (stream_key(self._stream_prefix, broker_id), live_key(self._stream_prefix, broker_id)),
            (
                self._broker_id,
                envelope.kind.value,
                envelope.channel if channel is None else channel,
                _SEPARATOR.join(envelope.among),
                envelope.frame,
                STREAM_MAX,
            ),
        )

    def _forward(
        self, lookup: tuple[Any, ...], envelope: Envelope, channel: str | None = None
    ) -> asyncio.Future[str | None]:
        """Look the target up (the directory's slot), then send to its stream (its slot).

        Two calls, chained by callbacks rather than a task: the send is submitted
        as the lookup settles, so forwards keep the order they were made in.
        """
        result: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        found = self._submit(lookup, _text)

        def sent(target: str, future: asyncio.Future[bool]) -> None:
            if result.done():
                return
            if future.cancelled():
                result.cancel()
            elif (error := future.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(self._peer(target.encode()) if future.result() else None)

        def looked_up(future: asyncio.Future[str | None]) -> None:
            if result.done():
                return
            if future.cancelled():
                result.cancel()
                return
            error = future.exception()
            target = None if error is not None else future.result()
            if error is not None:
                result.set_exception(error)
            elif target is None:
                result.set_result(None)
            else:
                send = self._submit(
                    self._send_command(target, envelope, channel), bool, self._after_send
                )
                send.add_done_callback(lambda done: sent(target, done))

        found.add_done_callback(looked_up)
        return result

    def _peer(self, reply: Any) -> str | None:
        broker_id = _text(reply)
        if broker_id == "":
            return self._broker_id  # into the Channel's log: no broker to watch
        if broker_id is not None:
            self._peers.add(broker_id)
        return broker_id

    def _submit(
        self, command: tuple[Any, ...], convert: Any, then: tuple[tuple[Any, ...], ...] = ()
    ) -> asyncio.Future[Any]:
        call = _Future(command, convert, then)
        self._seal()
        if self._batcher is None:
            call.fail(EngineUnavailable("the plane is not started"))
            return call.future
        try:
            self._batcher.submit(call)
        except EngineUnavailable as exc:
            call.fail(exc)
        return call.future

    async def _call(self, command: tuple[Any, ...]) -> Any:
        return await self._submit(command, lambda reply: reply)

    # -- the inbound stream ----------------------------------------------------

    async def _read(self) -> None:
        # A lean connection of its own (gateway.engines.redis.resp): XREAD BLOCK
        # holds it, each read costs one write and one wake-up, and cancelling a
        # read at close is prompt (the connection is closed, never reused).
        last: bytes = b"0-0"
        #: What was read and not trimmed yet: the trim goes before the next read.
        trim: bytes | None = None
        delay = 0.05
        connection: RespConnection | None = None
        try:
            while not self._stopping:
                try:
                    if connection is None or connection.closed:
                        connection = await open_connection(self._new_connection())
                    read = (
                        "XREAD", "COUNT", _READ_COUNT, "BLOCK", _BLOCK_MS,
                        "STREAMS", self._stream, last,
                    )  # fmt: skip
                    if trim is None:
                        (replies,) = await connection.execute(_pack_command(read), 1)
                    else:
                        # What was read is trimmed: the stream holds only what is on
                        # its way (MINID keeps its own ID: the one after the last
                        # read, so that what a broker leaves when it dies is exactly
                        # what it never read). In one write with the next read, on
                        # this connection: no pipeline of the Batcher's for it.
                        packed = _pack_command(("XTRIM", self._stream, "MINID", trim))
                        trimmed, replies = await connection.execute(packed + _pack_command(read), 2)
                        if isinstance(trimmed, Exception):
                            raise trimmed
                        trim = None
                    # An error reply (MOVED after a slot moved, say) is raised here.
                    if isinstance(replies, Exception):
                        raise replies
                except Exception as exc:  # the reader must never die
                    _log.warning("plane.read_failed", extra={"error": repr(exc)})
                    if connection is not None:
                        connection.close()
                        connection = None
                    # A cluster moved the stream's slot (MOVED) or lost its
                    # primary: learn the slot map again before reconnecting.
                    if self._client is not None:
                        with contextlib.suppress(Exception):
                            await refresh(self._client)
                    # Redis is away: try again, backing off up to a second.
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                delay = 0.05
                if not replies:
                    continue
                if self._abandoned:
                    break
                # RESP3 answers a map of streams, RESP2 a list of pairs.
                entries = (
                    next(iter(replies.values())) if isinstance(replies, dict) else replies[0][1]
                )
                for entry_id, flat in entries:
                    self._deliver(dict(zip(flat[::2], flat[1::2], strict=True)))
                    last = self._read_through = entry_id
                # Every forward those entries caused is submitted: release barriers
                # waiting for them are lifted behind those (release_barriers.py).
                self._log.handled(last)
                trim = _after(last)
        finally:
            if connection is not None:
                connection.close()

    def _new_connection(self) -> AbstractConnection:
        """An unconnected redis-py connection to where the stream lives, to connect like."""
        assert self._client is not None
        return node_connection(self._client, self._stream)

    def _deliver(self, fields: dict[bytes, bytes]) -> None:
        k = fields.get(b"k")
        if k == _WAKE:
            self._log.wake(fields.get(b"i", b"").decode())
            return
        if k in (FRAMES, RECORDS):
            self._deliver_packed(k, fields)
            return
        inbound = self._inbound
        kind = _KINDS.get(k or b"")
        if inbound is None or kind is None:
            return
        among = fields.get(b"g", b"").decode()
        if among == COUNTED:
            # Counted as on its way here (a Redis Cluster): once handed on, a release
            # barrier waiting for it may lift (gateway.plane.redis.counted_barriers).
            channel_id = fields.get(b"i", b"").decode()
            envelope = Envelope(
                kind, fields.get(b"o", b"").decode(), channel_id, fields.get(b"f", b"")
            )
            try:
                inbound(envelope)
            except Exception:  # one bad envelope must not stop the reader
                _log.exception("plane.inbound_failed")
            self._log.counted(channel_id)
            return
        envelope = Envelope(
            kind,
            fields.get(b"o", b"").decode(),
            fields.get(b"i", b"").decode(),
            fields.get(b"f", b""),
            tuple(among.split(_SEPARATOR)) if among else (),
        )
        try:
            inbound(envelope)
        except Exception:  # one bad envelope must not stop the reader
            _log.exception("plane.inbound_failed")

    def _deliver_packed(self, k: bytes, fields: dict[bytes, bytes]) -> None:
        """The envelopes of a packed entry (gateway.plane.redis.batches), in order."""
        origin = fields.get(b"o", b"").decode()
        blob = fields.get(b"f", b"")
        envelopes: Iterator[Envelope]
        if k == FRAMES:
            channel = fields.get(b"i", b"").decode()
            envelopes = _frames(origin, channel, blob, fields.get(b"m"))
        else:
            envelopes = unpack_records(origin, blob, fields.get(b"m"))
        try:
            for envelope in envelopes:
                inbound = self._inbound
                if inbound is None:
                    return
                try:
                    inbound(envelope)
                except Exception:  # one bad envelope must not stop the others
                    _log.exception("plane.inbound_failed")
        except (ValueError, struct.error) as exc:  # UnicodeDecodeError is a ValueError
            # Only another broker writes here, so this is a bug or a foreign writer:
            # what was whole is delivered, the rest is reported, the reader goes on.
            _log.warning("plane.bad_entry", extra={"error": repr(exc)})


def _frames(origin: str, channel: str, blob: bytes, meta: bytes | None) -> Iterator[Envelope]:
    """The envelopes of a ``d`` entry: its frames, each with the ``u`` its meta
    gives (a whole answer's: gateway.plane.redis.batches, "Beside the records").

    Raises:
        ValueError: the entry is not made of whole frames, or its meta is not numbers.
    """
    kind = EnvelopeKind.CHANNEL
    answers = unpack_answers(meta)
    covered = len(answers)
    for index, frame in enumerate(unpack_frames(blob)):
        command_id = answers[index] if index < covered else None
        yield Envelope(kind, origin, channel, frame, (), None, command_id)


def _after(entry_id: bytes) -> bytes:
    """The stream entry ID right after ``entry_id`` (``<ms>-<seq>``)."""
    ms, _, seq = entry_id.partition(b"-")
    return ms + b"-" + str(int(seq or b"0") + 1).encode()

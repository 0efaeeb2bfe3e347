"""The routing plane of brokers in one process: a directory of dicts, forwarding by call_soon.

A broker on the ``memory`` engine gets a :class:`MemoryPlane` of its own bus,
where it is alone: ``spans_brokers`` is False, so the router never calls it and
routing costs what it did before the plane existed. Brokers built in one
process on one shared :class:`MemoryBus` reach each other through it, with the
same leases as :mod:`gateway.plane.redis`: each plane renews its lease every
``lease / 6`` seconds, a lease lasts ``lease / 2``, and a plane that stops
renewing (:meth:`MemoryPlane.abandon`, what a crash looks like) drops out of
every lookup within ``lease``. That is what tests/conformance/plane/ runs
against both implementations.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

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
    pick_among,
    pick_least,
)
from gateway.plane.memory_log import LogStore, MemoryChannelLog
from gateway.tasks import cancel_and_wait

__all__ = ["MemoryBus", "MemoryPlane"]

T = TypeVar("T")


class MemoryBus:
    """The directory the planes of one process share.

    Args:
        clock: monotonic seconds, for the leases.
        log_clock: seconds for the Channel logs' retention and idle expiry
            (``clock`` by default).
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        log_clock: Callable[[], float] | None = None,
    ) -> None:
        self.clock = clock
        #: The bus's identifier (``Plane.bus_id``).
        self.identifier = uuid.uuid4().hex
        #: Broker-Identifier → the plane, while it has joined.
        self.planes: dict[str, MemoryPlane] = {}
        #: Broker-Identifier → when its lease ends.
        self.leases: dict[str, float] = {}
        #: Channel-Identifier → Broker-Identifier.
        self.channels: dict[str, str] = {}
        #: Command-Name → the brokers holding Tubes for it.
        self.names: dict[str, set[str]] = {}
        #: Command-Name → broker → its Commands in flight for it (reported, plus
        #: one for each forwarded since).
        self.loads: dict[str, dict[str, int]] = {}
        #: Group → the brokers holding members of it.
        self.groups: dict[str, set[str]] = {}
        #: Conversation-Address → the brokers holding Subjects with it.
        self.addresses: dict[str, set[str]] = {}
        #: Every Channel's log (gateway.plane.memory_log).
        self.logs = LogStore(log_clock or clock)

    def alive(self, broker_id: str) -> bool:
        """Whether ``broker_id`` holds a lease now."""
        return self.leases.get(broker_id, 0.0) > self.clock()

    def forget(self, broker_id: str) -> None:
        """Drop every entry of ``broker_id`` (it left, or its lease ran out)."""
        self.planes.pop(broker_id, None)
        self.leases.pop(broker_id, None)
        for channel_id in [c for c, b in self.channels.items() if b == broker_id]:
            del self.channels[channel_id]
        for loads in self.loads.values():
            loads.pop(broker_id, None)
        for table in (self.names, self.groups, self.addresses):
            for key in list(table):
                brokers = table[key]
                brokers.discard(broker_id)
                if not brokers:
                    del table[key]


class MemoryPlane:
    """One broker's view of a :class:`MemoryBus` (a bus of its own by default).

    Args:
        broker_id: this broker's Broker-Identifier.
        bus: the bus to share with other brokers of this process; None: a bus of
            its own, where this broker is alone.
        lease: seconds within which a broker that stops renewing drops out.
        balance: how ``forward_request`` picks among brokers (gateway.plane.base).
        retention: what each Channel's log keeps at most.
    """

    def __init__(
        self,
        broker_id: str,
        *,
        bus: MemoryBus | None = None,
        lease: float = DEFAULT_LEASE,
        balance: Balance = "in_flight",
        retention: LogRetention | None = None,
    ) -> None:
        self._balance = balance
        self._broker_id = broker_id
        self._shared = bus is not None
        self._bus = bus if bus is not None else MemoryBus()
        self._lease = lease
        self._inbound: Inbound | None = None
        self._lost: Lost | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._peers: set[str] = set()
        self._turns = itertools.count()
        self._log = MemoryChannelLog(self._bus.logs, retention or LogRetention(), broker_id)

    @property
    def broker_id(self) -> str:
        return self._broker_id

    @property
    def spans_brokers(self) -> bool:
        return self._shared

    @property
    def bus_id(self) -> str:
        return self._bus.identifier

    @property
    def lease(self) -> float:
        return self._lease

    @property
    def channel_log(self) -> ChannelLog:
        return self._log

    async def start(self, inbound: Inbound, lost: Lost) -> None:
        self._inbound = inbound
        self._lost = lost
        self._bus.planes[self._broker_id] = self
        self._renew()
        if self._shared:  # alone on its bus, a broker has nobody to renew a lease for
            self._renewal = asyncio.create_task(self._keep_lease(), name="asbp-plane-lease")

    async def close(self) -> None:
        await self._stop()
        if self._bus.planes.get(self._broker_id) is self:
            self._bus.forget(self._broker_id)

    async def abandon(self) -> None:
        """Stop renewing and reading without leaving, as a crashed broker does."""
        await self._stop()
        if self._bus.planes.get(self._broker_id) is self:
            del self._bus.planes[self._broker_id]

    async def _stop(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            await cancel_and_wait(renewal)
        self._inbound = None

    def _renew(self) -> None:
        self._bus.leases[self._broker_id] = self._bus.clock() + self._lease / 2

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 6)
            self._renew()
            bus = self._bus
            for broker_id in [b for b in bus.leases if not bus.alive(b)]:
                bus.forget(broker_id)
            for peer in [p for p in self._peers if not bus.alive(p)]:
                self._peers.discard(peer)
                if self._lost is not None:
                    self._lost(peer)

    # -- the directory ---------------------------------------------------------

    def channel_opened(self, channel_id: str) -> None:
        self._bus.channels[channel_id] = self._broker_id

    def channel_closed(self, channel_id: str) -> None:
        if self._bus.channels.get(channel_id) == self._broker_id:
            del self._bus.channels[channel_id]

    def claim_channel(self, channel_id: str) -> asyncio.Future[str]:
        bus = self._bus
        holder = bus.channels.get(channel_id)
        if holder is not None and holder != self._broker_id and bus.alive(holder):
            return _done(holder)
        # One event loop: nothing runs between the look and the write.
        bus.channels[channel_id] = self._broker_id
        return _done(self._broker_id)

    def serving(self, name: str) -> None:
        self._bus.names.setdefault(name, set()).add(self._broker_id)

    def not_serving(self, name: str) -> None:
        self._bus.loads.get(name, {}).pop(self._broker_id, None)
        brokers = self._bus.names.get(name)
        if brokers is not None:
            brokers.discard(self._broker_id)
            if not brokers:
                del self._bus.names[name]

    def report_load(self, name: str, in_flight: Callable[[], int]) -> None:
        if self._broker_id in self._bus.names.get(name, ()):
            self._bus.loads.setdefault(name, {})[self._broker_id] = in_flight()

    def request_received(self, name: str) -> None:
        """Nothing to count: a report and a forward never interleave in one process."""

    def request_done(self, name: str, broker_id: str) -> None:
        loads = self._bus.loads.get(name)
        if loads is not None and broker_id in loads:
            loads[broker_id] -= 1

    def group_joined(self, group: str) -> None:
        self._bus.groups.setdefault(group, set()).add(self._broker_id)

    def group_left(self, group: str) -> None:
        brokers = self._bus.groups.get(group)
        if brokers is not None:
            brokers.discard(self._broker_id)
            if not brokers:
                del self._bus.groups[group]

    def address_held(self, address: str) -> None:
        self._bus.addresses.setdefault(address, set()).add(self._broker_id)

    def address_released(self, address: str) -> None:
        brokers = self._bus.addresses.get(address)
        if brokers is not None:
            brokers.discard(self._broker_id)
            if not brokers:
                del self._bus.addresses[address]

    def written(self) -> asyncio.Future[None]:
        # Announcements go straight into the shared dicts.
        return _done(None)

    async def alive(self, broker_id: str) -> bool:
        return self._bus.alive(broker_id)

    async def locate_channel(self, channel_id: str) -> str | None:
        broker_id = self._bus.channels.get(channel_id)
        return broker_id if broker_id is not None and self._bus.alive(broker_id) else None

    async def channel_page(self, after: str, offset: int, limit: int) -> ChannelListing:
        # Brokers of one process (tests): a scan per page is cheap enough.
        bus = self._bus
        live = {c: b for c, b in bus.channels.items() if bus.alive(b)}
        wanted = heapq.nsmallest(offset + limit, (c for c in live if c > after))[offset:]
        return ChannelListing(len(live), tuple((c, live[c]) for c in wanted))

    async def respondents(self, name: str) -> frozenset[str]:
        bus = self._bus
        return frozenset(b for b in bus.names.get(name, ()) if bus.alive(b))

    async def group_brokers(self, group: str) -> frozenset[str]:
        bus = self._bus
        return frozenset(b for b in bus.groups.get(group, ()) if bus.alive(b))

    async def address_brokers(self, address: str) -> frozenset[str]:
        bus = self._bus
        return frozenset(b for b in bus.addresses.get(address, ()) if bus.alive(b))

    # -- forwarding ------------------------------------------------------------

    def forward_request(self, name: str, envelope: Envelope) -> asyncio.Future[str | None]:
        bus = self._bus
        others = [b for b in bus.names.get(name, ()) if b != self._broker_id and bus.alive(b)]
        target = None
        if others and self._balance == "in_flight":
            loads = bus.loads.setdefault(name, {})
            target = pick_least({b: loads.get(b, 0) for b in others}, next(self._turns))
            loads[target] = loads.get(target, 0) + 1
        elif others:
            target = pick_among(others, next(self._turns))
        if target is not None and not self._hand(target, envelope):
            target = None
        return _done(target)

    def forward_to_channel(self, channel_id: str, envelope: Envelope) -> asyncio.Future[str | None]:
        bus = self._bus
        if envelope.kind is EnvelopeKind.CHANNEL and self._logged(channel_id, envelope):
            return _done(self._broker_id)
        target = bus.channels.get(channel_id)
        if target is not None and not (bus.alive(target) and self._hand(target, envelope)):
            target = None
        if target is not None and envelope.kind is EnvelopeKind.JOIN:
            for group in envelope.among:
                bus.groups.setdefault(group, set()).add(target)
        return _done(target)

    def forward_to_servers(self, name: str, envelope: Envelope) -> asyncio.Future[tuple[str, ...]]:
        bus = self._bus
        targets = sorted(
            b for b in bus.names.get(name, ()) if b != self._broker_id and bus.alive(b)
        )
        return _done(tuple(b for b in targets if self._hand(b, envelope)))

    def forward_to_groups(self, envelope: Envelope) -> asyncio.Future[tuple[str, ...]]:
        bus = self._bus
        targets = {
            b
            for group in envelope.among
            for b in bus.groups.get(group, ())
            if b != self._broker_id and bus.alive(b)
        }
        return _done(tuple(b for b in sorted(targets) if self._hand(b, envelope)))

    def send_to(self, broker_id: str, envelope: Envelope) -> asyncio.Future[bool]:
        return _done(self._bus.alive(broker_id) and self._hand(broker_id, envelope))

    def _logged(self, channel_id: str, envelope: Envelope) -> bool:
        """A frame for a Channel with a log (an HTTP Channel on a bus) goes into it."""
        if self._inbound is None:
            raise PlaneUnavailable("the plane is not started")
        return self._log.append(channel_id, envelope.frame).result() > 0

    def _hand(self, broker_id: str, envelope: Envelope) -> bool:
        """Deliver on the next loop turn, as a stream read would: never re-entrantly."""
        if self._inbound is None:
            raise PlaneUnavailable("the plane is not started")
        plane = self._bus.planes.get(broker_id)
        inbound = plane._inbound if plane is not None else None
        if inbound is None:
            return False
        if broker_id != self._broker_id:
            self._peers.add(broker_id)
        asyncio.get_running_loop().call_soon(inbound, envelope)
        return True


def _done(result: T) -> asyncio.Future[T]:
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future

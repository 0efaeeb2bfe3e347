"""Channels: the broker's side of each User-Agent connection, and groups.

§2.1: "Upon creation of a Channel the Broker MUST assign a Broker unique
UUID to the Channel as it's Channel-Identifier." We use uuid4 as 32
lowercase hex digits, the form the codec accepts for ``i`` and ``d``.

§1.3.4.2 g: "A group is a collection of Channel-Identifiers that is specific
to a Broker." Groups live here beside the Channels so that closing a Channel
removes it from every group in one place; an empty group disappears.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from asbp import ChannelId, FaultCode
from gateway.acl import AccessContext
from gateway.connections.channel_secret import matches
from gateway.connections.flow import FlowGate
from gateway.connections.outboxes import Outbox

__all__ = ["UNCOUNTED_DELIVERIES", "Channel", "ChannelKind", "ChannelRegistry"]

#: Closed HTTP Channels remembered so that a late poll learns why (bounded).
TOMBSTONES = 10_000


class ChannelKind(enum.Enum):
    """How a User-Agent reaches the broker."""

    #: A WebSocket: one message, one Command, both ways.
    WEBSOCKET = "websocket"
    #: Stateless HTTP: POST a Command, long-poll for the answers.
    HTTP = "http"
    #: A Channel at another broker of the bus, stood for here while this broker
    #: serves it (gateway.routing.remote): its outbox forwards over the bus.
    REMOTE = "remote"


#: ``Channel.count`` of a client that does not count queue deliveries (``count=2``).
UNCOUNTED_DELIVERIES: Final = 2


@dataclass(eq=False, slots=True)
class Channel:
    """One User-Agent Channel."""

    #: The Channel-Identifier ``i``.
    id: ChannelId
    #: Its transport.
    kind: ChannelKind
    #: Where the router leaves Commands for the User-Agent.
    outbox: Outbox
    #: The peer's address, for logs and ACLs.
    remote: str = ""
    #: Groups this Channel belongs to.
    groups: set[str] = field(default_factory=set)
    #: ``u`` values of this Channel's Commands that await an answer.
    in_flight: set[int] = field(default_factory=set)
    #: Monotonic time of the last Command from the User-Agent (HTTP expiry).
    last_seen: float = field(default_factory=time.monotonic)
    #: Who is behind the Channel, for access control (no Subject's roles).
    access: AccessContext = field(default_factory=AccessContext)
    #: Whether the User-Agent last sent a text message (WebSocket): answers go
    #: back as text when they are valid UTF-8, so plain tools can show them.
    #: True until it sends anything: the greeting (ASCII) arrives as text, so a
    #: browser's ``onmessage`` sees a string, not a Blob (docs/protocol.md).
    prefers_text: bool = True
    #: Why the broker closed the Channel, if it did.
    fault: FaultCode | None = None
    #: Whether the Channel has been closed.
    closed: bool = False
    #: The client address it counts against (gateway.connections.addresses), if any.
    address_key: str | None = None
    #: Whether it may be read from now (flow control: gateway.connections.flow).
    gate: FlowGate = field(default_factory=FlowGate)
    #: The digest of the Channel's secret (gateway.connections.channel_secret);
    #: empty for a Channel with none (a proxy).
    secret_digest: bytes = b""
    #: How its client counts frames for a resume (``count`` of ``/asbp``, kept in the
    #: Channel's resume record): 1 every frame after the greeting; 2 all but queue
    #: deliveries, which its log then leaves out (docs/protocol.md, "Resuming a
    #: Channel"). Old clients declare nothing and get 1.
    count: int = 1
    #: An HTTP Channel on a bus served here while another broker is its *home*
    #: (where its Subjects and groups live: gateway.routing.http_bus): such a
    #: Channel object holds no state of its own.
    visitor: bool = False
    #: Monotonic time a visitor last asked the bus whether its home is alive.
    home_checked: float = 0.0
    #: The Subjects a stopping home kept beside the HTTP Channel's log for the
    #: broker that takes it over (gateway.routing.http_bus, ``hand_over``): they
    #: move with it, so its close here ends them without a word to their agents.
    handed_over: frozenset[str] = frozenset()


class ChannelRegistry:
    """Every open Channel at this broker, and every group."""

    __slots__ = (
        "_channels",
        "_groups",
        "_held",
        "_tombstones",
        "closed",
        "on_group_first",
        "on_group_last",
        "on_membership",
        "opened",
    )

    def __init__(self) -> None:
        #: Channels opened and closed since the broker started (the metrics'
        #: counters, which only go up; the open ones are ``len(self)``).
        self.opened = 0
        self.closed = 0
        self._channels: dict[ChannelId, Channel] = {}
        #: Open Channels per client address key (only keys holding one).
        self._held: dict[str, int] = {}
        self._groups: dict[str, set[ChannelId]] = {}
        #: Why each recently closed HTTP Channel closed, and its secret's digest:
        #: only its owner may learn it.
        self._tombstones: OrderedDict[ChannelId, tuple[FaultCode, bytes]] = OrderedDict()
        #: Called when a group gains its first member here, and loses its last: the
        #: bus-wide directory learns which brokers hold members (gateway.plane).
        self.on_group_first: Callable[[str], object] | None = None
        self.on_group_last: Callable[[str], object] | None = None
        #: Called with each open Channel whose groups ``join`` or ``leave`` changed
        #: (a resumable Channel keeps them with its log: gateway.connections.resume).
        #: Not called when a Channel closes: a resumed Channel gets them back.
        self.on_membership: Callable[[Channel], object] | None = None

    def __len__(self) -> int:
        return len(self._channels)

    def __iter__(self) -> Iterator[Channel]:
        return iter(list(self._channels.values()))

    def open(
        self, kind: ChannelKind, outbox: Outbox, *, remote: str = "", address_key: str | None = None
    ) -> Channel:
        """Create a Channel with a fresh Channel-Identifier, counted under ``address_key``."""
        while True:
            channel_id = ChannelId(uuid.uuid4().hex)
            # A collision is astronomically unlikely, but uniqueness at this
            # broker is a MUST, and checking costs one dict lookup.
            if channel_id not in self._channels:
                break
        channel = Channel(channel_id, kind, outbox, remote, address_key=address_key)
        channel.gate.own = outbox
        self._channels[channel_id] = channel
        self.opened += 1
        if address_key is not None:
            self._held[address_key] = self._held.get(address_key, 0) + 1
        return channel

    def adopt(
        self,
        channel_id: str,
        kind: ChannelKind,
        outbox: Outbox,
        *,
        remote: str = "",
        address_key: str | None = None,
    ) -> Channel:
        """Hold here a Channel another broker of the bus opened, under its own identifier.

        An HTTP Channel on a bus is served by whichever broker a request reaches
        (gateway.transports.http): each keeps a Channel for it over the same log.
        """
        key = ChannelId(channel_id)
        existing = self._channels.get(key)
        if existing is not None:
            return existing
        channel = Channel(key, kind, outbox, remote, address_key=address_key)
        channel.gate.own = outbox
        self._channels[key] = channel
        self.opened += 1
        if address_key is not None:
            self._held[address_key] = self._held.get(address_key, 0) + 1
        return channel

    def held_by(self, address_key: str) -> int:
        """How many open Channels count against ``address_key``."""
        return self._held.get(address_key, 0)

    def get(self, channel_id: str) -> Channel | None:
        """The open Channel with this identifier, or None."""
        return self._channels.get(ChannelId(channel_id))

    def close(self, channel: Channel) -> bool:
        """Close ``channel``: it leaves every group. False if already closed."""
        if channel.closed:
            return False
        channel.closed = True
        self.closed += 1
        self._channels.pop(channel.id, None)
        key = channel.address_key
        if key is not None:
            held = self._held[key] - 1
            if held:
                self._held[key] = held
            else:
                del self._held[key]
        for group in channel.groups:
            members = self._groups.get(group)
            if members is not None:
                members.discard(channel.id)
                if not members:
                    self._emptied(group)
        channel.groups.clear()
        channel.outbox.close()
        if channel.kind is ChannelKind.HTTP:
            self._tombstones[channel.id] = (
                channel.fault or FaultCode.UNKNOWN_CHANNEL,
                channel.secret_digest,
            )
            while len(self._tombstones) > TOMBSTONES:
                self._tombstones.popitem(last=False)
        return True

    def why_closed(self, channel_id: str, secret: str | None) -> FaultCode | None:
        """Why a recently closed HTTP Channel was closed, if it was and ``secret`` is its own."""
        tombstone = self._tombstones.get(ChannelId(channel_id))
        if tombstone is None or not matches(secret, tombstone[1]):
            return None
        return tombstone[0]

    def join(self, group: str, channels: Iterable[Channel]) -> None:
        """Add ``channels`` to ``group``."""
        members = self._groups.get(group)
        new = members is None
        if members is None:
            members = self._groups[group] = set()
        changed: list[Channel] = []
        for channel in channels:
            if not channel.closed:
                members.add(channel.id)
                if group not in channel.groups:
                    channel.groups.add(group)
                    changed.append(channel)
        if not members:
            del self._groups[group]
        elif new and self.on_group_first is not None:
            self.on_group_first(group)
        self._changed(changed)

    def _changed(self, channels: list[Channel]) -> None:
        hook = self.on_membership
        if hook is not None:
            for channel in channels:
                hook(channel)

    def leave(self, group: str, channels: Iterable[Channel]) -> None:
        """Remove ``channels`` from ``group``."""
        members = self._groups.get(group)
        changed: list[Channel] = []
        for channel in channels:
            if group in channel.groups:
                channel.groups.discard(group)
                changed.append(channel)
            if members is not None:
                members.discard(channel.id)
        if members is not None and not members:
            self._emptied(group)
        self._changed(changed)

    def _emptied(self, group: str) -> None:
        del self._groups[group]
        if self.on_group_last is not None:
            self.on_group_last(group)

    def members(self, groups: Iterable[str]) -> list[Channel]:
        """The Channels in any of ``groups``, each once."""
        seen: set[ChannelId] = set()
        result: list[Channel] = []
        channels = self._channels
        for group in groups:
            for channel_id in self._groups.get(group, ()):
                if channel_id not in seen:
                    seen.add(channel_id)
                    channel = channels.get(channel_id)
                    if channel is not None:
                        result.append(channel)
        return result

    def group_names(self) -> list[str]:
        """Every non-empty group."""
        return sorted(self._groups)

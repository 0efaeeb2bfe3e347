"""Which broker a Channel lives at, so a Command to it leaves on the right Tube.

A Channel-Identifier is unique at its broker (§2.1), and a group is "a
collection of Channel-Identifiers that is specific to a Broker" (§1.3.4.2 g).
An agent connected to several brokers (§3.1.1) therefore has to choose a
Tube for every Channel it addresses. It learns where each Channel lives from
the requests that Channel sends (``i`` arrives on one Tube), and remembers
the most recent :data:`DEFAULT_SIZE` of them.

A Channel it has never seen may be at any broker, so it is offered to all:
the brokers that do not know it answer fault 2104, which the agent logs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Final

from asbp import ChannelId, Command

__all__ = ["DEFAULT_SIZE", "ChannelMemory"]

#: Channels remembered by default.
DEFAULT_SIZE: Final = 65536


class ChannelMemory:
    """A bounded map from Channel-Identifier to the Broker-Identifier it was seen at."""

    __slots__ = ("_known", "_size")

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._known: OrderedDict[str, str] = OrderedDict()
        self._size = size

    def __len__(self) -> int:
        return len(self._known)

    def remember(self, channel_id: ChannelId, broker_id: str) -> None:
        """``channel_id`` was just seen at ``broker_id``."""
        known = self._known
        known[channel_id] = broker_id
        known.move_to_end(channel_id)
        if len(known) > self._size:
            known.popitem(last=False)

    def located(self, channels: Collection[str], broker_id: str) -> list[str]:
        """Those of ``channels`` that may be at ``broker_id``: seen there, or never seen."""
        known = self._known
        return [c for c in channels if known.get(c, broker_id) == broker_id]

    def outbound(self, command: Command, broker_id: str) -> Command | None:
        """What of ``command`` (with ``d`` and/or ``g``) the broker ``broker_id`` should get.

        Returns:
            ``command`` with ``d`` narrowed to the Channels that may be there,
            without ``d`` if none may but it has groups, or None if the broker
            gets nothing.
        """
        destinations = command.destinations
        if not destinations:
            return command
        here = self.located(destinations, broker_id)
        if len(here) == len(destinations):
            return command
        if here:
            return command.with_keys(d=here)
        if command.groups:
            return command.without_keys("d")
        return None

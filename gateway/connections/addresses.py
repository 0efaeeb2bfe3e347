"""What one client address may hold: open Channels, and HTTP Channels opened per second.

Theory of operation
-------------------
A Channel costs the broker an outbox (up to ``outbox_bytes``), a registry
entry and, for HTTP, a mailbox that lives until ``http_idle_timeout``. Nothing
else bounds how many one peer opens, so one address could hold the broker's
memory by opening Channels and never reading them. Two limits, counted per
client address as the Tube handshake throttle counts (gateway/auth/throttle.py:
IPv4 per address, IPv6 per /64, an IPv4-mapped address as the IPv4 one):

* **Open Channels**: at most ``max_per_address`` WebSocket and HTTP Channels
  together. :class:`~gateway.connections.channels.ChannelRegistry` counts them
  as they open and close, so the count is exact and costs a dict entry per
  address that holds a Channel, none for the others.
* **HTTP Channel opens per second**: a token bucket of
  ``http_opens_per_second`` tokens refilling at that many a second. A POST
  without ``i`` opens a Channel, and a client that forgets its ``i`` (or never
  reads its answers) would otherwise open one per request, each living for
  ``http_idle_timeout``. Only addresses with a bucket not yet full again are
  remembered, at most ``max_addresses`` of them (the least recently used is
  forgotten first), so memory stays bounded under a flood of addresses.

Past either, :meth:`AddressLimits.admit` raises :class:`TooManyChannels`
(fault 2108): a WebSocket Channel gets the fault and is closed with 1008; an
HTTP POST gets ``429`` (with ``Retry-After`` for the rate). A peer whose
address the server does not report (a Unix socket) is not limited.

Per process and not thread-safe, like the throttle: behind N workers or
replicas an address gets N budgets.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from asbp import FaultCode
from gateway.auth.throttle import address_key
from gateway.connections.channels import ChannelRegistry
from gateway.errors import GatewayError

__all__ = ["AddressLimits", "TooManyChannels"]

#: Addresses whose HTTP open budget is remembered at most.
MAX_ADDRESSES: Final = 100_000


class TooManyChannels(GatewayError):
    """The client address holds ``max_per_address`` Channels, or opens them too fast.

    Attributes:
        retry_after: whole seconds until the rate allows another open; None
            for the count of open Channels, which frees up only as they close.
    """

    code = FaultCode.TOO_MANY_CHANNELS

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AddressLimits:
    """Admits a new Channel for a client address, or refuses it (see the module doc).

    Args:
        channels: the registry that counts open Channels per address key.
        max_per_address: open Channels per address; 0 for no limit.
        http_opens_per_second: HTTP Channel opens per address and second; 0 for
            no limit.
        clock: seconds, monotonic; tests pass their own instead of sleeping.
        max_addresses: addresses whose open budget is remembered at most.
    """

    __slots__ = ("_buckets", "_channels", "_clock", "_rate", "max_addresses", "max_per_address")

    def __init__(
        self,
        channels: ChannelRegistry,
        *,
        max_per_address: int,
        http_opens_per_second: int,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self._channels = channels
        self.max_per_address = max_per_address
        self.max_addresses = max_addresses
        self._rate = float(http_opens_per_second)
        self._clock = clock
        #: key -> (tokens, when they were counted), least recently used first.
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def admit(self, address: str | None, *, http: bool) -> str | None:
        """The key to count a new Channel from ``address`` under, if it may open one.

        An HTTP Channel takes a token from the address's open budget.

        Raises:
            TooManyChannels: the address is over one of its limits.
        """
        if not address:
            return None
        key = address_key(address)
        limit = self.max_per_address
        if limit and self._channels.held_by(key) >= limit:
            raise TooManyChannels(
                f"this address holds {limit} open Channels, the most it may; close one first"
            )
        if http and self._rate:
            self._take(key)
        return key

    def __len__(self) -> int:
        """How many addresses' open budgets are remembered."""
        return len(self._buckets)

    def _take(self, key: str) -> None:
        now = self._clock()
        capacity = self._rate
        tokens, stamp = self._buckets.pop(key, (capacity, now))
        tokens = min(capacity, tokens + max(0.0, now - stamp) * self._rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            retry_after = max(1, math.ceil((1 - tokens) / self._rate - 1e-6))
            raise TooManyChannels(
                f"this address opens HTTP Channels faster than {self._rate:g} a second;"
                " reuse the 'i' you were given",
                retry_after=retry_after,
            )
        tokens -= 1
        if tokens < capacity:
            while len(self._buckets) >= self.max_addresses:
                self._buckets.popitem(last=False)
            self._buckets[key] = (tokens, now)

"""Handshake throttling: a budget of failed Tube handshakes per client address.

Theory of operation
-------------------
Every refused Tube credential costs the broker a parse, usually a signature
check, and a warning in its log. Guessing a signature is hopeless, so the
throttle is not what keeps credentials safe; it bounds what a peer that keeps
failing (an attacker probing with stolen, expired or replayed credentials, or
an agent with a wrong key or a skewed clock reconnecting in a tight loop) can
cost, and tells it, with HTTP 429 and ``Retry-After``, to back off.

Each client address has a token bucket of ``failures_per_minute`` tokens that
refills at ``failures_per_minute`` tokens a minute. A failed handshake takes a
token; while the bucket holds less than one, :meth:`HandshakeThrottle.allow`
says no and the broker refuses the handshake before it looks at the
credential. So an address may fail ``failures_per_minute`` times in a burst,
and then once every ``60 / failures_per_minute`` seconds. Successful
handshakes cost nothing, and :meth:`~HandshakeThrottle.succeeded` forgets the
address's failures. A refused (throttled) attempt costs nothing either: it was
not checked.

**Which address.** IPv4 peers are counted per address. IPv6 peers are counted
per /64 prefix: a /64 is the smallest network a site is given (RFC 6177, RFC
7421), and every host in it can pick any of its 2^64 addresses at will
(SLAAC privacy addresses), so counting IPv6 per address would let one host
fail without limit. An IPv4-mapped IPv6 address (``::ffff:192.0.2.7``, what a
dual-stack socket reports for an IPv4 peer) counts as the IPv4 address it
carries. Anything that is not an IP address (a Unix socket, an unknown peer)
is counted under its own text. The cost: peers behind one NAT, in one /64,
or behind one reverse proxy share one budget, so one of them failing can lock
out the others for a while.

**Bounded memory.** Only addresses with recent failures are remembered, in
LRU order, at most ``max_addresses`` of them: when a new address would go past
that, the one used least recently is forgotten (its budget starts full again).
A bucket that has refilled completely is forgotten when next looked at. So an
attacker with more than ``max_addresses`` distinct addresses (or /64s) can
cycle through them; the throttle then costs bounded memory instead of stopping
them, which is the right trade for a per-process, in-memory limiter.

The throttle is per process and not thread-safe: it lives in one event loop
(the app's lifespan state). Behind N workers or replicas an address gets N
budgets.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

__all__ = ["WINDOW", "HandshakeThrottle", "address_key"]

#: Seconds in which ``failures_per_minute`` failures refill.
WINDOW: Final = 60.0
_IPV6_PREFIX: Final = 64


def address_key(address: str) -> str:
    """The key an address is counted under: IPv4 as is, IPv6 by its /64.

    >>> address_key("2001:db8:1:2:aaaa::1"), address_key("::ffff:192.0.2.7")
    ('2001:db8:1:2::/64', '192.0.2.7')
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        shift = 128 - _IPV6_PREFIX
        return str(ipaddress.IPv6Network((int(ip) >> shift << shift, _IPV6_PREFIX)))
    return str(ip)


class _Bucket:
    __slots__ = ("refused", "stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        #: Failures still allowed; below 1, handshakes are refused.
        self.tokens = tokens
        #: When ``tokens`` was last brought up to date.
        self.stamp = stamp
        #: Handshakes refused since the last one allowed.
        self.refused = 0


class HandshakeThrottle:
    """A token bucket of failed handshakes per client address (see the module doc).

    Args:
        failures_per_minute: the burst, and the sustained rate per minute, of
            failed handshakes one address may make.
        clock: seconds, monotonic; tests pass their own instead of sleeping.
        max_addresses: how many addresses to remember at most.

    Raises:
        ValueError: a limit below 1.
    """

    __slots__ = ("_buckets", "_clock", "_rate", "capacity", "max_addresses", "refused")

    def __init__(
        self,
        failures_per_minute: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 100_000,
    ) -> None:
        if failures_per_minute < 1:
            raise ValueError(f"failures_per_minute must be at least 1, not {failures_per_minute}")
        if max_addresses < 1:
            raise ValueError(f"max_addresses must be at least 1, not {max_addresses}")
        #: Failures an address may make in a burst.
        self.capacity = float(failures_per_minute)
        self.max_addresses = max_addresses
        self._rate = failures_per_minute / WINDOW  # tokens per second
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        #: Handshakes refused since the throttle was made (the metrics' counter).
        self.refused = 0

    def __len__(self) -> int:
        """How many addresses are remembered."""
        return len(self._buckets)

    def allow(self, address: str) -> bool:
        """Whether a handshake from ``address`` may be checked now.

        False while the address is over its budget; each False is counted in
        :meth:`refusals`.
        """
        bucket = self._bucket(address_key(address))
        if bucket is None:
            return True
        if bucket.tokens >= 1:
            bucket.refused = 0
            return True
        bucket.refused += 1
        self.refused += 1
        return False

    def failed(self, address: str) -> None:
        """Count a failed handshake from ``address``."""
        key = address_key(address)
        bucket = self._bucket(key)
        if bucket is None:
            while len(self._buckets) >= self.max_addresses:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = _Bucket(self.capacity, self._clock())
        bucket.tokens = max(0.0, bucket.tokens - 1)

    def succeeded(self, address: str) -> None:
        """A handshake from ``address`` succeeded: forget its failures."""
        self._buckets.pop(address_key(address), None)

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try again; 0 if it may now."""
        bucket = self._bucket(address_key(address))
        if bucket is None or bucket.tokens >= 1:
            return 0.0
        return (1 - bucket.tokens) / self._rate

    def retry_after_header(self, address: str) -> int:
        """:meth:`retry_after` in whole seconds, rounded up, at least 1: ``Retry-After``."""
        # Less a microsecond: float error must not turn 20.000000000000004 into 21.
        return max(1, math.ceil(self.retry_after(address) - 1e-6))

    def refusals(self, address: str) -> int:
        """Handshakes from ``address`` refused since the last one allowed."""
        bucket = self._buckets.get(address_key(address))
        return 0 if bucket is None else bucket.refused

    def _bucket(self, key: str) -> _Bucket | None:
        """The bucket for ``key``, refilled to now and marked recently used; None if full."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return None
        now = self._clock()
        elapsed = max(0.0, now - bucket.stamp)
        bucket.tokens = min(self.capacity, bucket.tokens + elapsed * self._rate)
        bucket.stamp = now
        if bucket.tokens >= self.capacity:
            # Back to a full budget: nothing left to remember.
            del self._buckets[key]
            return None
        self._buckets.move_to_end(key)
        return bucket

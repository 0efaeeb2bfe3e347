"""Who is on the bus: every live broker with its numbers, for the management API.

Theory of operation
-------------------
The routing plane's directory already knows which brokers hold a lease and
which Channels each announced (gateway.plane.redis.plane: ``brokers``,
``alive:<b>``, ``chs:<b>``). What it does not hold is the rest of a broker's
picture (version, server, start time, Tubes, Subjects, Commands in flight), so
each broker also keeps a *card*, ``card:<b>``: one JSON string, written when
the census starts and then every ``lease / 6`` seconds, and expiring with the
same ``lease / 2`` as the broker's ``alive`` key. A broker that dies takes its
card with it within the lease, as it drops out of every lookup.

:meth:`RedisCensus.brokers` reads the ``brokers`` set, then, in one pipeline,
each one's lease, Channel count (``SCARD chs:<b>``, the directory itself) and
card. The broker answering is described fresh rather than from its card.
A card is at most ``lease / 6`` seconds old (1.7 s with the default lease);
that is the staleness of the bus-wide view of another broker's Tubes.

The bus-wide Channel list of the management API is the plane's
(``Plane.channel_page``: a page of the directory's sorted set of identifiers).
A card also carries the broker's Tubes per Application-Agent, for the bus-wide
agents list.

On the ``memory`` engine a broker is alone on its bus: :class:`LocalCensus`
lists it only. Nothing here is on a Command's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final, Protocol

import msgspec
from redis.exceptions import RedisError

from gateway.engines.redis.connection import Client, connect
from gateway.plane.base import PlaneUnavailable
from gateway.plane.redis.keys import directory_prefix
from gateway.tasks import cancel_and_wait

__all__ = ["BrokerCard", "Census", "Describe", "LocalCensus", "RedisCensus"]

_log = logging.getLogger("asbp.plane")

#: Seconds one census call to Redis may take (and to connect).
_TIMEOUT: Final = 5.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class BrokerCard(msgspec.Struct, frozen=True, kw_only=True):
    """One broker as the bus sees it."""

    broker: str
    version: str
    engine: str
    server: str
    #: Unix time the broker started.
    started_at: float
    channels: int
    tubes: int
    subjects: int
    in_flight: int
    #: Open Tubes per Application-Agent identity, for the bus-wide agents list.
    agents: dict[str, int] = msgspec.field(default_factory=dict)
    #: Topic subscriptions (name, whether a pattern, subscribers), the most
    #: subscribed first, at most CARD_TOPICS: for the bus-wide topics list.
    topics: list[tuple[str, bool, int]] = msgspec.field(default_factory=list)
    #: How many topic subscriptions this broker has in all (``topics`` may hold fewer).
    topic_count: int = 0


#: Topic subscriptions a card lists at most: a card is rewritten every sixth of the
#: lease, so its size stays bounded whatever the subscriptions.
CARD_TOPICS: Final = 100

#: Describes the broker this census runs in, now.
Describe = Callable[[], BrokerCard]


class Census(Protocol):
    """Every live broker of the bus; see the module docstring."""

    @property
    def spans_brokers(self) -> bool:
        """Whether other brokers can be on this bus."""
        ...

    async def start(self) -> None:
        """Put this broker's card on the bus, and keep it there."""
        ...

    async def close(self) -> None:
        """Stop keeping the card (it expires with the broker's lease)."""
        ...

    async def brokers(self) -> list[BrokerCard]:
        """Every live broker, this one first, then by Broker-Identifier.

        Raises:
            PlaneUnavailable: the bus cannot be asked.
        """
        ...


class LocalCensus:
    """A broker alone on its bus (the ``memory`` engine)."""

    def __init__(self, describe: Describe) -> None:
        self._describe = describe

    @property
    def spans_brokers(self) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def brokers(self) -> list[BrokerCard]:
        return [self._describe()]


class RedisCensus:
    """The brokers of a bus on Redis, from the plane's directory and their cards.

    Args:
        url: the plane's Redis: one Redis, or a Redis Cluster (``redis+cluster://``).
        broker_id: this broker's Broker-Identifier.
        describe: this broker's card, now.
        lease: the plane's lease (``bus_lease``).
        prefix: the plane's key prefix (gateway.plane.redis.plane.PREFIX); the
            census reads the directory under its hash tag, and keeps the cards
            there too (gateway.plane.redis.keys), so that on a Redis Cluster one
            pipeline to one primary reads them all.
        log: where a card that cannot be read, or written, is reported.
    """

    def __init__(
        self,
        url: str,
        *,
        broker_id: str,
        describe: Describe,
        lease: float,
        prefix: str,
        log: logging.Logger = _log,
    ) -> None:
        self._log = log
        self._url = url
        self._broker_id = broker_id
        self._describe = describe
        self._lease = lease
        self._prefix = directory_prefix(prefix)
        self._client: Client | None = None
        self._keeper: asyncio.Task[None] | None = None

    @property
    def spans_brokers(self) -> bool:
        return True

    async def start(self) -> None:
        self._client = connect(self._url, connect_timeout=_TIMEOUT, command_timeout=_TIMEOUT)
        try:
            await self._write_card()
        except PlaneUnavailable:
            await self.close()
            raise
        self._keeper = asyncio.create_task(self._keep_card(), name="asbp-census")

    async def close(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await cancel_and_wait(keeper)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RedisError):
                await client.delete(self._card_key(self._broker_id))
            await client.aclose()

    async def brokers(self) -> list[BrokerCard]:
        client = self._redis()
        prefix = self._prefix
        try:
            members = sorted(
                b.decode() if isinstance(b, bytes) else b
                for b in await client.smembers(f"{prefix}brokers")
            )
            others = [b for b in members if b != self._broker_id]
            async with client.pipeline(transaction=False) as pipe:
                for broker_id in others:
                    pipe.exists(f"{prefix}alive:{broker_id}")
                    pipe.scard(f"{prefix}chs:{broker_id}")
                    pipe.get(self._card_key(broker_id))
                replies = await pipe.execute()
        except RedisError as exc:
            raise PlaneUnavailable(f"the bus is unreachable: {exc}") from exc
        cards = [self._describe()]
        for n, broker_id in enumerate(others):
            alive, channels, card = replies[3 * n : 3 * n + 3]
            if not alive or card is None:
                continue  # gone, or joined a moment ago and not described yet
            try:
                seen = msgspec.json.decode(card, type=BrokerCard)
            except msgspec.DecodeError:
                self._log.warning("census.bad_card", extra={"peer": broker_id})
                continue
            # The directory's own count is the authority for Channels.
            cards.append(msgspec.structs.replace(seen, broker=broker_id, channels=int(channels)))
        return cards

    def _card_key(self, broker_id: str) -> str:
        return f"{self._prefix}card:{broker_id}"

    def _redis(self) -> Client:
        if self._client is None:
            raise PlaneUnavailable("the census is not started")
        return self._client

    async def _write_card(self) -> None:
        card = msgspec.json.encode(self._describe())
        try:
            await self._redis().set(
                self._card_key(self._broker_id), card, px=max(1, int(self._lease * 500))
            )
        except RedisError as exc:
            raise PlaneUnavailable(f"the bus is unreachable: {exc}") from exc

    async def _keep_card(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 6)
            try:
                await self._write_card()
            except PlaneUnavailable as exc:
                self._log.warning("census.write_failed", extra={"error": str(exc)})

"""End-to-end messaging helpers: a client's view (:class:`Messenger`), a private Redis.

The tests in tests/gateway/messaging/ run once per engine (:data:`ENGINES`) through
the ``engine``, ``redis`` and ``broker`` fixtures of tests/gateway/messaging/conftest.py,
which start brokers with :func:`start_broker`: ``memory``, ``redis`` (a private
``redis-server``) and ``redis-cluster`` (the ``redis`` engine on the session's
six-node Redis Cluster, so topics, queues and virtual queues are tested through
real brokers and WebSockets on a cluster too).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asbp import Command
from gateway.acl import acl_from_config
from tests.support import RedisServer, T
from tests.support.gateway import (
    Gateway,
    GatewayFactory,
    HttpChannel,
    Peer,
)
from tests.support.redis_cluster import RedisCluster

#: Both engines: every messaging test runs on each.
ENGINES = ("memory", "redis", "redis-cluster")


@dataclass(eq=False)
class Messenger:
    """A client's view of its Channel or Tube: send Commands, take what arrives.

    Commands that arrive while a test waits for another one are kept, in order, for
    later ``take`` calls, so replies and notifications may interleave freely.
    """

    send: Callable[[Command], Awaitable[object]]
    receive: Callable[[], Awaitable[list[Command]]]
    backlog: deque[Command] = field(default_factory=deque)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @classmethod
    def of(cls, peer: Peer) -> Messenger:
        async def receive() -> list[Command]:
            return [await peer.recv()]

        return cls(peer.send, receive)

    @classmethod
    def http(cls, channel: HttpChannel) -> Messenger:
        async def send(command: Command) -> None:
            status, reply = await channel.post(command.with_keys(i=channel.id))
            assert (status, reply.name) == (200, "asbp.accepted"), reply

        async def receive() -> list[Command]:
            while True:
                polled = await channel.poll(wait=5 * T)
                if polled:
                    return [command for _, command in polled]

        return cls(send, receive)

    async def take(self, match: Callable[[Command], bool] | str) -> Command:
        """The first Command (kept or arriving) that ``match`` accepts or is named so."""
        accept = (lambda c: c.name == match) if isinstance(match, str) else match
        for command in self.backlog:
            if accept(command):
                self.backlog.remove(command)
                return command

        async def arrive() -> Command:
            while True:
                for command in await self.receive():
                    self.backlog.append(command)
                for command in self.backlog:
                    if accept(command):
                        self.backlog.remove(command)
                        return command

        return await asyncio.wait_for(arrive(), 10 * T)

    async def call(self, name: str, body: bytes = b"", /, **keys: Any) -> Command:
        """Send ``name`` with a fresh ``u``; return its answer (accepted or a fault)."""
        command_id = next(self.ids) % 65536
        await self.send(Command({"c": name, "u": command_id, **keys}, body))
        return await self.take(
            lambda c: (
                c.get("u") == str(command_id)
                and c.name in ("asbp.accepted", "asbp.fault", "asbp.pong")
            )
        )

    async def ok(self, name: str, body: bytes = b"", /, **keys: Any) -> Command:
        """Like :meth:`call`, asserting an ``asbp.accepted`` with ``cause`` = ``name``."""
        reply = await self.call(name, body, **keys)
        assert (reply.name, reply.get("cause")) == ("asbp.accepted", name), reply
        return reply

    async def publish(self, destination: str, body: bytes = b"", **keys: Any) -> str:
        """Publish and return the message id from the acceptance."""
        reply = await self.ok("asbp.publish", body, destination=destination, **keys)
        message_id = reply.get("id")
        assert isinstance(message_id, str) and len(message_id) == 32, reply
        return message_id

    async def subscribe(self, destination: str, **keys: Any) -> None:
        await self.ok("asbp.subscribe", destination=destination, **keys)

    async def notification(self, subscription: str | None = None) -> Command:
        """The next notification (for ``subscription``, if given)."""
        return await self.take(
            lambda c: (
                c.name == "asbp.notification"
                and (subscription is None or c.get("subscription") == subscription)
            )
        )

    def pending(self, name: str = "asbp.notification") -> list[Command]:
        """Kept Commands named ``name`` (they arrived while waiting for others)."""
        return [c for c in self.backlog if c.name == name]


class RedisServers:
    """This test's private ``redis-server``, started on first use, stopped at teardown.

    Request its fixture before ``make_gateway``: fixtures are torn down in reverse, so
    the brokers stop before their Redis does.
    """

    def __init__(self, directory: Path, cluster: Callable[[], RedisCluster] | None = None) -> None:
        self.directory = directory
        self.server: RedisServer | None = None
        self._cluster = cluster

    async def cluster_url(self) -> str:
        """The session's Redis Cluster, emptied: for the ``redis-cluster`` engine."""
        assert self._cluster is not None, "this RedisServers was made without a cluster"
        cluster = self._cluster()
        await asyncio.to_thread(cluster.flush)
        return cluster.url

    async def url(self) -> str:
        if self.server is None:
            server = RedisServer(self.directory / "redis")
            await asyncio.to_thread(server.start)
            self.server = server
        return self.server.url

    async def stop(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)


async def start_broker(
    make_gateway: GatewayFactory, engine: str, redis: RedisServers, **overrides: Any
) -> Gateway:
    """A broker on ``engine``; for ``redis``, on the test's private ``redis-server``;
    for ``redis-cluster``, the ``redis`` engine on the session's Redis Cluster."""
    if engine == "redis-cluster":
        engine = "redis"
        overrides.setdefault("redis_url", await redis.cluster_url())
    if engine == "redis" and "redis_url" not in overrides:
        overrides["redis_url"] = await redis.url()
    return await make_gateway(engine=engine, **overrides)


def security(text: str) -> Any:
    """An Acl from the ``[security]`` TOML ``text``."""
    import tomllib

    return acl_from_config(tomllib.loads(text), text=text, source="test.toml")


async def user(broker: Gateway) -> Messenger:
    """A User-Agent on a new WebSocket Channel to ``broker``."""
    return Messenger.of(await broker.channel())

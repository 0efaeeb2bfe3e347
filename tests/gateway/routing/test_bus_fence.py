"""A broker the bus took for dead while it ran fences itself (gateway.drain, ``fence``).

Broker A holds a resumable Channel; the agent is on broker B. A is paused (SIGSTOP: a
real stall, as a long garbage collection or a starved CPU makes one) for longer than
its lease, so B's sweep forgets it, and the Commands sent meanwhile go straight into
the Channel's log: A's open connection never reads them. When A runs again its next
renewal finds its lease gone, and before taking it back A tells the Channel to resume
(1012, fault 2114), so the client gets those Commands from the log, in order, once.
Without the fence the connection stays open and they never reach it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import redis.asyncio
from websockets.exceptions import ConnectionClosed

from asbp import Command, decode
from gateway.plane.redis.plane import PREFIX
from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer, T
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import (
    flush,
    frame,
    holder_of,
    lease_gone,
    open_resumable,
    resume_at,
    until,
    until_in_directory,
    until_redis,
)

pytestmark = pytest.mark.anyio

#: Short, so the stall outlives it soon: A's presence key lives half of it.
LEASE = 2.0
#: Commands sent in each of the three parts.
PART = 10


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("bus-fence-redis")) as server:
        yield server


async def test_a_broker_swept_while_paused_tells_its_channels_to_resume(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_url = redis_server.url
    await flush(redis_url)
    credentials = make_credentials(tmp_path, "news")
    settings = (
        f"bus_lease = {LEASE}\ninsecure_dev_tubes = true\n"
        f"[agents.news]\npublic_key = {str(tmp_path / 'news.pem')!r}\n"
    )

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return broker_process(
            redis_url, tmp_path / name, ack_timeout=30, prefetch=8, settings=settings
        )

    async def send(first: int, last: int) -> None:
        for u in range(first, last + 1):
            await agent.send(Command({"c": "news", "d": channel_id, "u": u}, b"m%d" % u))

    async with start("a") as a, start("b") as b:
        agent = make_agent(credentials, [b.url.replace("/asbp", "/tube")])
        async with agent:
            await agent.wait_registered(5 * T)
            connection, channel_id, secret = await open_resumable(a.url)
            await until_in_directory(redis_url, "ch", channel_id)
            await send(1, PART)
            seen = [await frame(connection) for _ in range(PART)]
            a_id = await holder_of(redis_url, channel_id)
            log = f"{PREFIX}log:{{{channel_id}}}"
            client = redis.asyncio.Redis.from_url(redis_url)
            a.process.send_signal(signal.SIGSTOP)
            try:
                # B's renewal sweeps A once A's presence key is gone: the Channel
                # leaves the directory.
                await until(redis_url, f"alive:{a_id}", lambda c: lease_gone(c, a_id))
                await until_in_directory(redis_url, "ch", channel_id, present=False)
                await send(PART + 1, 2 * PART)

                async def logged(_: redis.asyncio.Redis) -> bool:
                    return int(await client.hget(log, "n") or 0) >= 2 * PART

                # Into the log, as for a broker that died: A's stream is gone.
                await until_redis(redis_url, log, logged)
            finally:
                a.process.send_signal(signal.SIGCONT)
                await client.aclose()
            # A's connection is closed for a resume; nothing of the second part on it.
            told: list[Command] = []
            with anyio.fail_after(10 * T), contextlib.suppress(ConnectionClosed):
                async for message in connection:
                    assert isinstance(message, bytes)
                    told.append(decode(message))
            assert told == []
            assert connection.close_code == 1012
            assert (connection.close_reason or "").startswith("2114 "), connection.close_reason
            resumed, answer = await resume_at(b.url, channel_id, secret, received=len(seen))
            assert (answer.name, answer.get("received")) == ("asbp.resumed", str(PART))
            rest = [await frame(resumed) for _ in range(PART)]
            await send(2 * PART + 1, 3 * PART)
            rest += [await frame(resumed) for _ in range(PART)]
            got = [c.command_id for c in seen + rest]
            assert got == list(range(1, 3 * PART + 1))
            # Nothing more comes (a Command delivered twice would): a marker is next.
            await agent.send(Command({"c": "news", "d": channel_id, "u": 999}, b"marker"))
            assert (await frame(resumed)).command_id == 999
            await resumed.close()

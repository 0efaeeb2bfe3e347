"""Redis fails and comes back: publishers get 2005, Channels stay open, nothing accepted is lost.

A broker on a private ``redis-server`` (AOF, ``appendfsync always``). A publisher
publishes to a queue while Redis is killed with SIGKILL and restarted from its
AOF, or while ``CLIENT KILL`` drops the broker's connections:

* while Redis is down each publication is answered, within the test's deadline
  (never a hang), with ``asbp.accepted`` or fault 2005 (engine unavailable),
  never anything else;
* the publisher's WebSocket Channel stays open, and what needs no engine is
  still routed: ``asbp.ping`` is answered, and a User-Agent's Command reaches an
  Application-Agent and its reply comes back;
* once Redis is back the broker recovers by itself: publications are accepted
  again, and a consumer gets every publication that was accepted, each once
  (counted: accepted versus delivered).

``/readyz`` answers 503 (``"engine": false``) while Redis is killed, and 200
again once it is back. SIGSTOP for ten seconds, then SIGCONT: a publication is
answered 2005 after the engine's command timeout, never left hanging.
``maxmemory`` reached: 2005 until memory is freed. A full disk (the AOF on a
small tmpfs): tests/gateway/engines/test_redis_full_disk.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from asbp import Command
from tests.support import T
from tests.support.gateway import Gateway, GatewayFactory, agent_answers, decode
from tests.support.messaging import Messenger, user
from tests.support.redis import RedisServer

pytestmark = pytest.mark.anyio

QUEUE = "/outage"
#: Publications attempted while Redis is down.
DURING = 5


async def publish(publisher: Messenger, n: int) -> Command:
    return await publisher.call("asbp.publish", b"%d" % n, destination=QUEUE, type="QUEUE")


async def publish_until_accepted(publisher: Messenger, n: int, accepted: set[int]) -> None:
    """Publish ``n`` until the broker accepts it (each try answered: 2005 or accepted)."""
    for _ in range(int(100 * T)):
        reply = await publish(publisher, n)
        if reply.name == "asbp.accepted":
            accepted.add(n)
            return
        assert reply.get("code") == "2005", reply
        # The answer itself paces the retries: no timer.
        assert (await publisher.call("asbp.ping")).name == "asbp.pong"
    raise AssertionError("the broker did not recover")


async def drain(gateway: Gateway, expected: set[int]) -> list[int]:
    """What a consumer of the queue gets until it has ``expected`` and the queue is empty."""
    consumer = await user(gateway)
    await consumer.subscribe(QUEUE, type="QUEUE")
    got: list[int] = []
    while not expected <= set(got):
        note = await consumer.notification()
        got.append(int(note.body))
        reply = await consumer.call(
            "asbp.ack", destination=QUEUE, type="QUEUE", receipt=[note.get("receipt")]
        )
        assert reply.name == "asbp.accepted", reply
    assert (await consumer.call("asbp.poll", destination=QUEUE, type="QUEUE")).get("count") == "0"
    return got


@pytest.mark.parametrize("failure", ["sigkill-and-restart", "client-kill"])
async def test_redis_fails_and_comes_back(
    make_gateway: GatewayFactory, tmp_path: Path, failure: str
) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True)
    await asyncio.to_thread(server.start)
    try:
        gateway = await make_gateway(engine="redis", redis_url=server.url)
        publisher = await user(gateway)
        agent = await gateway.tube(serves=("echo",))
        asking = await gateway.channel()
        accepted: set[int] = set()
        for n in range(10):
            await publish_until_accepted(publisher, n, accepted)

        if failure == "sigkill-and-restart":
            leaving = await gateway.channel()
            await asyncio.to_thread(server.kill)
            # A Channel that drops now cannot release its log: said in the log, once,
            # not left to asyncio as a future's exception nobody retrieved.
            plane_log = logging.getLogger("asbp.plane")  # the Channel log's own logger
            plane_log.addHandler(gateway.events)
            try:
                await leaving.ws.close()
                failed = await gateway.events.wait(
                    "channel.log_call_failed", call="release", channel=leaving.id
                )
            finally:
                plane_log.removeHandler(gateway.events)
            assert "Redis is unavailable" in vars(failed)["error"]
            client = await gateway.http_client()
            readyz = await client.get(f"{gateway.server.http_url}/readyz")
            assert (readyz.status_code, readyz.json()["engine"]) == (503, False)
            for n in range(10, 10 + DURING):
                reply = await publish(publisher, n)  # answered within take()'s deadline
                assert (reply.name, reply.get("code")) == ("asbp.fault", "2005"), reply
                assert (await publisher.call("asbp.ping")).name == "asbp.pong"
                await agent_answers(asking, agent, n)
            await asyncio.to_thread(server.start)
        else:
            client = aioredis.Redis.from_url(server.url)
            try:
                await client.client_kill_filter(_type="normal", skipme=True)
            finally:
                await client.aclose()
            for n in range(10, 10 + DURING):
                # Accepted (reconnected already) or 2005, nothing else.
                reply = await publish(publisher, n)
                if reply.name == "asbp.accepted":
                    accepted.add(n)
                else:
                    assert reply.get("code") == "2005", reply

        for n in range(100, 110):
            await publish_until_accepted(publisher, n, accepted)
        ready = await (await gateway.http_client()).get(f"{gateway.server.http_url}/readyz")
        assert (ready.status_code, ready.json()["ready"]) == (200, True)
        got = await drain(gateway, accepted)
        assert sorted(got) == sorted(accepted)  # every accepted one, each once
    finally:
        await asyncio.to_thread(server.stop)


async def test_redis_stopped_for_ten_seconds_then_continued(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    """SIGSTOP: Redis is there but silent. A publication waits for the engine's
    command timeout (10 s), then gets 2005; the Channel stays open meanwhile;
    after SIGCONT the broker recovers by itself and nothing accepted is lost (a
    publication answered 2005 may still have landed: 2005 means "may not")."""
    server = RedisServer(tmp_path / "redis", appendonly=True)
    await asyncio.to_thread(server.start)
    try:
        gateway = await make_gateway(engine="redis", redis_url=server.url)
        publisher = await gateway.channel()
        pinger = await gateway.channel()
        agent = await gateway.tube(serves=("echo",))
        accepted: set[int] = set()
        messenger = Messenger.of(publisher)
        for n in range(5):
            await publish_until_accepted(messenger, n, accepted)
        os.kill(server.pid, signal.SIGSTOP)
        try:
            await publisher.send(
                Command({"c": "asbp.publish", "destination": QUEUE, "type": "QUEUE", "u": 9}, b"9")
            )
            # Meanwhile everything that needs no engine is answered at once.
            assert (await pinger.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"
            await agent_answers(pinger, agent, 2)
            readyz = await (await gateway.http_client()).get(f"{gateway.server.http_url}/readyz")
            assert readyz.status_code == 503
            # Bounded by the engine's command timeout (10 s): never a hang.
            reply = decode(await asyncio.wait_for(publisher.ws.recv(), 20 * T))
            assert (reply.name, reply.get("code"), reply.get("u")) == ("asbp.fault", "2005", "9")
        finally:
            os.kill(server.pid, signal.SIGCONT)
        for n in range(100, 105):
            await publish_until_accepted(messenger, n, accepted)
        got = await drain(gateway, accepted)
        assert set(accepted) <= set(got)
        assert set(got) - set(accepted) <= {9}  # the one answered 2005 may have landed
        assert len(got) == len(set(got))
    finally:
        await asyncio.to_thread(server.stop)


async def test_redis_at_maxmemory_refuses_with_2005_and_recovers(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    """``maxmemory`` reached (``noeviction``): publications get 2005, not a 5xx or a
    hang; once memory is freed they are accepted again, and nothing accepted is lost."""
    server = RedisServer(tmp_path / "redis", appendonly=True)
    await asyncio.to_thread(server.start)
    admin = aioredis.Redis.from_url(server.url)
    try:
        gateway = await make_gateway(engine="redis", redis_url=server.url)
        publisher = await user(gateway)
        accepted: set[int] = set()
        await publish_until_accepted(publisher, 0, accepted)
        used = int((await admin.info("memory"))["used_memory"])
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", str(used + 2 * 1024 * 1024))
        refused = False
        for n in range(1, 200):
            reply = await publisher.call(
                "asbp.publish", b"%d;" % n + bytes(64 * 1024), destination=QUEUE, type="QUEUE"
            )
            if reply.name == "asbp.accepted":
                accepted.add(n)
                continue
            assert reply.get("code") == "2005", reply
            refused = True
            break
        assert refused, "maxmemory was never reached"
        await admin.config_set("maxmemory", "0")
        await publish_until_accepted(publisher, 500, accepted)
        consumer = await user(gateway)
        await consumer.subscribe(QUEUE, type="QUEUE")
        got: set[int] = set()
        while not accepted <= got:
            note = await consumer.notification()
            got.add(int(note.body.split(b";")[0]))
            await consumer.ok(
                "asbp.ack", destination=QUEUE, type="QUEUE", receipt=[note.get("receipt")]
            )
        assert got == accepted
    finally:
        await admin.aclose()
        await asyncio.to_thread(server.stop)

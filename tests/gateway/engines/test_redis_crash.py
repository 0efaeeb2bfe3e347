"""A broker killed with SIGKILL while consuming loses nothing it accepted.

The acceptance test of issue 5, at two levels: the engine's (a child process
with its own RedisEngine) and the broker's (a real ``python -m gateway
--engine redis`` process between WebSocket clients and Redis). Both publish
10,000 messages to a queue, acknowledge about half, are killed with SIGKILL
with leases outstanding, and hand the queue to a survivor on the same Redis;
optionally Redis is killed too (SIGKILL; AOF with ``appendfsync always``) and
restarted from its AOF before the survivor starts.

What counts
-----------
Only what the killed side reported back before the kill:

accepted
    ids whose publication was accepted: Redis had them, fsynced.
acknowledged (before the kill)
    ids whose ack was answered with every lease live: Redis had removed
    them, fsynced.
acks in flight (at the kill)
    ids whose ack was sent but not answered: the kill came while the ack was
    on its way, so Redis may or may not have applied it.
leased-unacknowledged (at the kill)
    ids delivered to the consumer, with their lease, and never sent an ack.
    The killed side may also hold leases it never reported (a fetch in
    flight; notifications the broker sent but the client had not read): they
    come back as redeliveries too, so *redelivered* counts every lease the
    killed side held.
left (at the kill)
    the queue's depth read from Redis after the kill (and after Redis's
    restart), before the survivor starts.

The claims
----------
1. every accepted message is delivered at least once overall: each one was
   acknowledged, or is delivered to the survivor, or had its ack in flight
   (the ack may have landed; then it is rightly gone);
2. a message is redelivered only if it was never acknowledged: no
   acknowledged id reaches the survivor, nor the killed consumer again;
3. the outstanding leases come back: every leased-unacknowledged id reaches
   the survivor as a redelivery (delivery count 2 or more); the rest arrive
   for the first time, but for at most one batch of unreported leases;
4. nothing else appears: the survivor gets only accepted ids, each once,
   exactly as many as were left, and the queue ends empty.

Engine level
------------
The child (tests/gateway/engines/_crash_consumer.py) publishes with ``enqueue``,
reporting each accepted id, then consumes, reporting what it was delivered,
which acks it sent and which of them returned. A new engine in this process
is the survivor; its fetch waits for the dead child's leases to run out (a
short ack_timeout), never sleeping.

Broker level
------------
Broker A (``ack_timeout`` short) serves eight publishing WebSockets (10,000
``asbp.publish`` of type QUEUE, each answered ``asbp.accepted`` with the
message id once Redis has it; 50 unanswered per WebSocket at most) and one
subscriber, which acknowledges its notifications' receipts 50 at a time.
Once half are acknowledged (the acceptance of an ``asbp.ack`` counts the live
receipts), the subscriber sends one more ack, for all but the last ten it
holds, and broker A is killed with SIGKILL at once
(tests/gateway/engines/_broker_process.py): one ack in flight, ten leases held.
Broker B then serves a new subscriber on the same Redis until the queue is
empty; it waits for broker A's leases to end by itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
from websockets.asyncio.client import ClientConnection

from asbp import Command, decode, encode
from gateway.engines.base import EngineLimits
from gateway.engines.redis.engine import RedisEngine
from tests.gateway.engines._broker_process import (
    BrokerProcess,
    abandon,
    broker_process,
    open_channel,
    receive,
)
from tests.support import RedisServer, T

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
QUEUE = "/queue/crash"
#: Messages published at both levels: the issue's figure.
MESSAGES = 10_000
#: The killed side's lease length: how long the survivor waits for its leases.
#: Short, so they come back soon; nothing waits for it to pass but the engine's
#: own fetch, which is told when the next lease ends.
KILLED_ACK_TIMEOUT = 1.0 * T
#: Leases the killed side may hold unreported: a fetch batch at the engine level,
#: the subscriber's prefetch at the broker level.
UNREPORTED_LEASES = 100
#: Ids held unacknowledged by the consumer at the kill, at least.
HELD_AT_KILL = 10


class Report:
    """What the killed side reported: the child process, or broker A's clients."""

    def __init__(self) -> None:
        self.accepted: list[str] = []
        self.delivered: set[str] = set()
        self.sent: set[str] = set()
        self.acknowledged: set[str] = set()
        #: Acknowledged ids delivered again before the kill: claim 2 says none.
        self.again: set[str] = set()
        self.published = False
        self.finished = False

    def deliver(self, ids: list[str]) -> None:
        self.again.update(message_id for message_id in ids if message_id in self.acknowledged)
        self.delivered.update(ids)

    def read(self, line: bytes) -> None:
        """One line of the child's (see tests/gateway/engines/_crash_consumer.py)."""
        kind, *ids = line.decode().split()
        if kind == "Q":
            self.accepted += ids
        elif kind == "P":
            self.published = True
        elif kind == "D":
            self.deliver(ids)
        elif kind == "S":
            self.sent.update(ids)
        elif kind == "K":
            self.acknowledged.update(ids)
        elif kind == "E":
            self.finished = True
        else:
            assert kind == "L", line  # leases ended before the ack: not acknowledged


def check_claims(report: Report, survivor: Counter[str], *, left: int) -> None:
    """The four claims of the module docstring.

    Args:
        report: what the killed side reported.
        survivor: the survivor's deliveries: the delivery count of each id.
        left: the queue's depth after the kill.
    """
    accepted = set(report.accepted)
    in_flight = report.sent - report.acknowledged
    held = report.delivered - report.sent  # leased by the consumer, no ack ever sent
    survived = set(survivor)
    redelivered = {message_id for message_id, count in survivor.items() if count > 1}
    summary = (
        f"accepted {len(accepted)}, acknowledged before the kill {len(report.acknowledged)}, "
        f"acks in flight at the kill {len(in_flight)}, "
        f"leased-unacknowledged at the kill {len(held)} held by the consumer "
        f"({len(redelivered)} leased in all), left at the kill {left}, "
        f"delivered after the restart {len(survived)}, redelivered {len(redelivered)}"
    )
    print(summary)

    assert report.published and not report.finished, f"the kill came too late: {summary}"
    assert len(report.accepted) == len(accepted) == MESSAGES, summary
    assert len(report.acknowledged) >= MESSAGES // 2, summary
    assert len(held) >= HELD_AT_KILL, f"too few leases held at the kill: {summary}"
    # 1. Every accepted message was acknowledged, survives, or had its ack in flight.
    lost = accepted - report.acknowledged - survived
    assert lost <= in_flight, f"{len(lost - in_flight)} accepted messages lost: {summary}"
    # 2. An acknowledged message never comes back.
    assert not report.again, f"{len(report.again)} delivered again after their ack: {summary}"
    back = survived & report.acknowledged
    assert not back, f"{len(back)} acknowledged messages redelivered: {summary}"
    # 3. The outstanding leases come back, as redeliveries; the unreported ones
    # (a fetch in flight, notifications not yet read) are one batch at most.
    assert held <= redelivered, f"{len(held - redelivered)} held leases lost: {summary}"
    unreported = redelivered - report.delivered
    assert len(unreported) <= UNREPORTED_LEASES, summary
    # 4. Only accepted ids, each once (the survivor checks), all that were left.
    assert survived <= accepted, f"{len(survived - accepted)} ids never accepted: {summary}"
    assert len(survived) == left, summary


async def depth(redis_url: str) -> int:
    """The queue's depth (leased or not), read by an engine of its own."""
    observer = RedisEngine(redis_url, broker_id="observer")
    await observer.start()
    try:
        return await observer.depth(QUEUE)
    finally:
        await observer.close()


# -- at the engine level -------------------------------------------------------------


async def run_child_until_half_acknowledged(url: str) -> Report:
    report = Report()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.gateway.engines._crash_consumer",
        url,
        QUEUE,
        str(MESSAGES),
        str(KILLED_ACK_TIMEOUT),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    try:
        with anyio.fail_after(60 * T):
            while len(report.acknowledged) < MESSAGES // 2:
                line = await child.stdout.readline()
                assert line.endswith(b"\n"), "the child exited early"
                report.read(line)
            child.send_signal(signal.SIGKILL)
            await child.wait()
            # What it printed before it died happened too; a cut last line did not.
            for line in (await child.stdout.read()).splitlines(keepends=True):
                if line.endswith(b"\n"):
                    report.read(line)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == -signal.SIGKILL
    return report


async def consume_everything(url: str) -> Counter[str]:
    """Delivery counts by id, for everything the survivor gets; asserts the queue ends empty."""
    seen: Counter[str] = Counter()
    redelivered: Counter[str] = Counter()
    survivor = RedisEngine(url, broker_id="survivor", limits=EngineLimits(ack_timeout=60.0))
    await survivor.start()
    try:
        with anyio.fail_after(60 * T):
            while await survivor.depth(QUEUE):
                # The dead child's leases end within KILLED_ACK_TIMEOUT; fetch
                # waits for that itself (the script tells it when).
                deliveries = await survivor.fetch(
                    QUEUE, "survivor", count=100, wait=5 * KILLED_ACK_TIMEOUT
                )
                assert deliveries, "messages are left that never become deliverable"
                for delivery in deliveries:
                    seen[delivery.message.id] += 1
                    redelivered[delivery.message.id] = delivery.delivery_count
                live = await survivor.ack(QUEUE, [delivery.receipt for delivery in deliveries])
                assert live == len(deliveries)
    finally:
        await survivor.close()
    assert max(seen.values(), default=1) == 1, "the survivor got a message twice"
    return redelivered


@pytest.mark.parametrize("redis_too", [False, True], ids=["broker-killed", "redis-killed-too"])
async def test_a_killed_consumer_loses_nothing_and_redelivers_only_the_unacknowledged(
    tmp_path: Path, redis_too: bool
) -> None:
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        report = await run_child_until_half_acknowledged(server.url)
        if redis_too:
            server.kill()
            server.start()
        left = await depth(server.url)
        survivor = await consume_everything(server.url)

    check_claims(report, survivor, left=left)


# -- at the broker level -------------------------------------------------------------

#: Publishing WebSockets: the broker carries out one Channel's Commands in order,
#: so several Channels are what lets it batch enqueues.
PUBLISHERS = 8
#: Publications one publisher keeps unanswered (pipelined, bounded).
WINDOW = 50
#: Receipts per asbp.ack.
ACK_BATCH = 50


async def subscribe(connection: ClientConnection) -> None:
    subscription = Command({"c": "asbp.subscribe", "destination": QUEUE, "type": "QUEUE", "u": 1})
    await connection.send(encode(subscription))
    accepted = decode(await receive(connection))
    assert accepted.name == "asbp.accepted", accepted


async def ack(connection: ClientConnection, receipts: list[str]) -> None:
    command = {"c": "asbp.ack", "destination": QUEUE, "type": "QUEUE", "receipt": receipts}
    await connection.send(encode(Command({**command, "u": 2})))


async def publish_all(url: str, report: Report) -> None:
    """MESSAGES publications over PUBLISHERS WebSockets; accepted ids into ``report``."""

    async def publisher(share: int) -> None:
        connection = await open_channel(url)
        try:
            window = asyncio.Semaphore(WINDOW)

            async def answers() -> None:
                for _ in range(share):
                    answer = decode(await receive(connection))
                    assert answer.name == "asbp.accepted", answer
                    report.accepted.append(str(answer.get("id")))
                    window.release()

            reading = asyncio.create_task(answers())
            publish = {"c": "asbp.publish", "destination": QUEUE, "type": "QUEUE"}
            for n in range(share):
                await window.acquire()
                await connection.send(encode(Command({**publish, "u": n % 65536}, b"m")))
            await reading
        finally:
            await connection.close()

    shares = [MESSAGES // PUBLISHERS] * PUBLISHERS
    shares[0] += MESSAGES - sum(shares)
    await asyncio.gather(*(publisher(share) for share in shares))
    report.published = True


async def consume_until_killed(broker: BrokerProcess, report: Report) -> None:
    """Subscribe and acknowledge through ``broker``; kill it once half are acknowledged."""
    connection = await open_channel(broker.url)
    try:
        await subscribe(connection)
        receipts: list[str] = []
        batches: list[list[str]] = []  # ids of the acks sent, oldest first
        batch: list[str] = []
        while len(report.acknowledged) < MESSAGES // 2 or len(receipts) < 2 * HELD_AT_KILL:
            command = decode(await receive(connection))
            if command.name == "asbp.notification":
                message_id = str(command.get("id"))
                report.deliver([message_id])
                batch.append(message_id)
                receipts.append(str(command.get("receipt")))
                if len(receipts) == ACK_BATCH:
                    report.sent.update(batch)
                    batches.append(batch)
                    await ack(connection, receipts)
                    receipts, batch = [], []
            else:
                assert command.name == "asbp.accepted", command
                done = batches.pop(0)  # one Channel's answers come in order
                if int(str(command.get("count"))) == len(done):
                    report.acknowledged.update(done)
        # Kill with an ack on its way (Redis may or may not apply it) and leases held.
        report.sent.update(batch[:-HELD_AT_KILL])
        await ack(connection, receipts[:-HELD_AT_KILL])
        await broker.kill()
    finally:
        if broker.process.returncode is None:
            await connection.close()
        else:
            abandon(connection)


async def consume_rest(url: str, redis_url: str) -> Counter[str]:
    """Everything left, through broker B: delivery counts by id."""
    seen: Counter[str] = Counter()
    deliveries: Counter[str] = Counter()
    observer = RedisEngine(redis_url, broker_id="observer")  # only to read the depth
    await observer.start()
    connection = await open_channel(url)
    try:
        await subscribe(connection)
        unanswered = 0
        left = await observer.depth(QUEUE)
        while left:
            # A message broker A leased comes back once its lease runs out: broker
            # B's fetch waits for that by itself.
            with anyio.fail_after(60 * T):
                command = decode(await receive(connection))
            if command.name == "asbp.notification":
                message_id = str(command.get("id"))
                seen[message_id] += 1
                deliveries[message_id] = int(str(command.get("deliveries")))
                await ack(connection, [str(command.get("receipt"))])  # at once, pipelined
                unanswered += 1
            else:
                assert command.name == "asbp.accepted", command
                assert command.get("count") == "1", command
                unanswered -= 1
                if not unanswered:  # caught up: is anything left?
                    left = await observer.depth(QUEUE)
    finally:
        await connection.close()
        await observer.close()
    assert max(seen.values(), default=1) == 1, "the survivor got a message twice"
    return deliveries


@pytest.mark.parametrize("redis_too", [False, True], ids=["broker-killed", "redis-killed-too"])
async def test_a_killed_broker_loses_nothing_and_redelivers_only_the_unacknowledged(
    tmp_path: Path, redis_too: bool
) -> None:
    report = Report()
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        async with broker_process(
            server.url, tmp_path / "a", ack_timeout=KILLED_ACK_TIMEOUT, prefetch=UNREPORTED_LEASES
        ) as a:
            with anyio.fail_after(120 * T):
                start = time.perf_counter()
                await publish_all(a.url, report)
                published = time.perf_counter() - start
                await consume_until_killed(a, report)
        if redis_too:
            server.kill()
            server.start()
        left = await depth(server.url)
        async with broker_process(
            server.url, tmp_path / "b", ack_timeout=60.0, prefetch=UNREPORTED_LEASES
        ) as b:
            survivor = await consume_rest(b.url, server.url)
    print(f"broker A accepted {MESSAGES} publications in {published:.2f} s")
    check_claims(report, survivor, left=left)

"""Redis's disk fills up: publishers get 2005, /readyz says not ready, Channels keep
routing what needs no engine, and once space is freed nothing accepted is lost.

A real ``redis-server`` keeps its AOF on a 4 MiB tmpfs mounted for the test
(``mount -t tmpfs``: the suite runs as root, here and in CI; a refused mount
fails the test, it never skips), nearly filled by a ballast file. A publisher
sends 16 KiB queue messages until Redis cannot append to its AOF:

* ``appendfsync everysec`` (what most deployments run): Redis stays up and
  refuses writes, and PING, with ``MISCONF Errors writing to the AOF file``;
  the broker answers each publication with fault 2005 and ``/readyz`` with 503.
  Once the ballast is deleted Redis appends again by itself (it retries every
  second) and the broker recovers with no help.
* ``appendfsync always``: Redis cannot keep a write it could not append, so it
  exits ("Can't recover from AOF write error"); the broker answers 2005 as for
  a crash. Space is freed and Redis started again on the same files, as a
  supervisor would, and the broker reconnects by itself.

Meanwhile the WebSocket Channel stays open: ``asbp.ping`` is answered and a
Command to an Application-Agent and its reply go through, neither needing the
engine. Afterwards a consumer gets every accepted publication, each once
(accepted versus delivered, counted); a publication answered 2005 was not
written (Redis refuses it before running it, or exits before answering).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from asbp import Command
from tests.support import T
from tests.support.gateway import Gateway, GatewayFactory, agent_answers
from tests.support.messaging import Messenger
from tests.support.redis import RedisServer

pytestmark = pytest.mark.anyio

QUEUE = "/full-disk"
DISK = "4m"
#: Room left on the disk once the ballast is written: some 60 publications.
ROOM = 1024 * 1024
BODY = 16 * 1024


@pytest.fixture
async def small_disk(tmp_path: Path) -> AsyncIterator[Path]:
    """A 4 MiB tmpfs of its own, unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0700", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    assert mount.returncode == 0, f"this test needs to mount a tmpfs (root): {mount.stderr}"
    try:
        yield disk
    finally:
        # Lazily: a Redis that is still being reaped must not keep the mount around.
        subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """Write a ballast file that leaves ``ROOM`` bytes free on ``disk``."""
    stat = os.statvfs(disk)
    ballast = disk / "ballast"
    with ballast.open("wb") as file:
        file.write(bytes(stat.f_bavail * stat.f_frsize - ROOM))
    return ballast


async def publish(publisher: Messenger, n: int) -> Command:
    body = b"%d;" % n + bytes(BODY)
    return await publisher.call("asbp.publish", body, destination=QUEUE, type="QUEUE")


async def ready(gateway: Gateway) -> tuple[int, bool]:
    answer = await (await gateway.http_client()).get(f"{gateway.server.http_url}/readyz")
    return answer.status_code, answer.json()["engine"]


@pytest.mark.parametrize("fsync", ["everysec", "always"])
async def test_a_full_disk_refuses_with_2005_and_the_broker_recovers_once_space_is_freed(
    make_gateway: GatewayFactory, small_disk: Path, fsync: str
) -> None:
    server = RedisServer(small_disk / "redis", appendonly=True, appendfsync=fsync)
    await asyncio.to_thread(server.start)
    try:
        ballast = fill(small_disk)
        gateway = await make_gateway(engine="redis", redis_url=server.url)
        agent = await gateway.tube(serves=("echo",))
        user = await gateway.channel()
        publisher = Messenger.of(await gateway.channel())
        accepted: set[int] = set()
        refused: set[int] = set()
        for n in range(4 * ROOM // BODY):
            reply = await publish(publisher, n)  # answered within the call's deadline
            if reply.name == "asbp.accepted":
                accepted.add(n)
                continue
            assert (reply.name, reply.get("code")) == ("asbp.fault", "2005"), reply
            refused.add(n)
            break
        assert refused, "the disk never filled up"
        assert len(accepted) >= ROOM // (2 * BODY)  # the disk filled, not something else

        # Full: refused, not ready, and the Channel still routes what needs no engine.
        assert await ready(gateway) == (503, False)
        for n in range(1000, 1003):
            reply = await publish(publisher, n)
            assert (reply.name, reply.get("code")) == ("asbp.fault", "2005"), reply
            refused.add(n)
            assert (await publisher.call("asbp.ping")).name == "asbp.pong"
            await agent_answers(user, agent, n)

        ballast.unlink()
        freed = time.monotonic()
        if fsync == "always":
            assert await asyncio.to_thread(server.wait) != 0  # it exited on the failed write
            await asyncio.to_thread(server.restart)  # as its supervisor would
        for n in range(2000, 2010):
            for _ in range(int(100 * T)):
                # Redis retries its AOF every second: each answer paces the next try.
                reply = await publish(publisher, n)
                if reply.name == "asbp.accepted":
                    accepted.add(n)
                    break
                assert reply.get("code") == "2005", reply
                refused.add(n)
                await agent_answers(user, agent, n)
            else:
                raise AssertionError("the broker did not recover")
        recovery = time.monotonic() - freed
        assert await ready(gateway) == (200, True)

        consumer = Messenger.of(await gateway.channel())
        await consumer.subscribe(QUEUE, type="QUEUE")
        got: list[int] = []
        while not accepted <= set(got):
            note = await consumer.notification()
            got.append(int(note.body.split(b";")[0]))
            await consumer.ok(
                "asbp.ack", destination=QUEUE, type="QUEUE", receipt=[note.get("receipt")]
            )
        count = await consumer.call("asbp.poll", destination=QUEUE, type="QUEUE")
        assert count.get("count") == "0"
        assert sorted(got) == sorted(accepted)  # every accepted one, each once; no refused one
        print(
            f"full disk, appendfsync {fsync}: accepted {len(accepted)}, delivered {len(got)},"
            f" refused with 2005 {len(refused)}, recovered {recovery:.2f} s after space was freed"
        )
    finally:
        await asyncio.to_thread(server.stop)

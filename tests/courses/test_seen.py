"""The ids a receiving bus accepted: claimed once, forgotten after the window."""

from __future__ import annotations

from pathlib import Path

import pytest

from courses.seen import MemorySeen, RedisSeen
from tests.support import RedisServer

pytestmark = pytest.mark.anyio


async def test_memory_claims_once_per_peer_and_forgets_after_the_window() -> None:
    now = [0.0]
    seen = MemorySeen(10.0, max_ids=3, clock=lambda: now[0])
    assert await seen.claim("a.test", "1")
    assert not await seen.claim("a.test", "1")
    assert await seen.claim("c.test", "1")  # ids are per peer
    now[0] = 11.0
    assert await seen.claim("a.test", "1")  # the window passed
    for n in range(5):
        await seen.claim("a.test", f"x{n}")
    assert len(seen) == 3  # bounded: the oldest go first
    await seen.close()
    assert len(seen) == 0


async def test_redis_claims_survive_a_new_client(tmp_path: Path) -> None:
    with RedisServer(tmp_path) as server:
        first = RedisSeen(server.url, 60.0)
        assert await first.claim("a.test", "1")
        await first.close()
        second = RedisSeen(server.url, 60.0)
        assert not await second.claim("a.test", "1")
        assert await second.claim("a.test", "2")
        await second.close()


async def test_memory_claims_a_batch_in_order_each_id_once() -> None:
    seen = MemorySeen(10.0)
    assert await seen.claim("a.test", "2")
    assert await seen.claim_many("a.test", ["1", "2", "3", "1"]) == [True, False, True, False]
    assert await seen.claim_many("c.test", ["1"]) == [True]  # ids are per peer
    assert not await seen.claim("a.test", "3")


async def test_redis_claims_a_batch_in_one_step_and_a_new_client_knows_them(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path) as server:
        first = RedisSeen(server.url, 60.0)
        assert await first.claim("a.test", "2")
        claims = await first.claim_many("a.test", ["1", "2", "3", "1"])
        assert claims == [True, False, True, False]
        assert await first.claim_many("a.test", ["4"]) == [True]
        await first.close()
        second = RedisSeen(server.url, 60.0)
        assert await second.claim_many("a.test", ["1", "3", "4", "5"]) == [
            False,
            False,
            False,
            True,
        ]
        assert await second.claim_many("c.test", ["1", "2"]) == [True, True]
        await second.close()

"""Paging the bus's Channels in the management API (issue 15): a page's cost with
0, 10,000 and 100,000 Channels on the bus.

A private ``redis-server`` holds the routing plane's directory; a second, live
"broker" (``bench-peer``: a lease key, a ``brokers`` entry, its Channels in
``ch``, ``chz`` and ``chs:<b>``, as its plane would write them) holds the
Channels. Per size, interleaved, ``--repeats`` times:

* **ours**: ``RedisPlane.channel_page`` (one script: ZRANGEBYLEX on ``chz``
  from the cursor, then the page's entries of ``ch``), asking the first page
  and one from the middle (``after``);
* **baseline**: what the API did before (``RedisCensus.channels`` on main): one
  ``HGETALL`` of ``ch``, the brokers' leases, a sort of every identifier, a
  bisect to the cursor and a slice;
* **API**: ``GET /api/v1/channels?limit=100`` over HTTP on a real broker
  (Hypercorn, in this process) on the same bus: what an operator waits for.

The table shows medians in milliseconds and the ratio baseline / ours (the
median of the per-repeat ratios).

    python bench/api.py [--sizes 0,10000,100000] [--repeats 15] [--limit 100]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.plane.redis.keys import directory_prefix
from gateway.plane.redis.plane import PREFIX, RedisPlane
from tests.support import RedisServer, serve_app

D = directory_prefix(PREFIX)
PEER = "bench-peer"


def _ignore(_: object) -> None:
    """Envelopes and lost peers do not matter here."""


async def fill(client: redis.asyncio.Redis, start: int, stop: int) -> None:
    """Channels ``start`` .. ``stop - 1`` at the peer, as its plane writes them."""
    for first in range(start, stop, 10_000):
        async with client.pipeline(transaction=False) as pipe:
            for n in range(first, min(stop, first + 10_000)):
                channel_id = f"{n * 7919 % 1_000_003:08x}{n:024x}"  # not in opening order
                pipe.hset(f"{D}ch", channel_id, PEER)
                pipe.zadd(f"{D}chz", {channel_id: 0})
                pipe.sadd(f"{D}chs:{PEER}", channel_id)
            await pipe.execute()


async def baseline_page(client: redis.asyncio.Redis, after: str, limit: int) -> list[str]:
    """The page as main read it: the whole ``ch`` hash, every lease, one sort."""
    held = {_text(k): _text(v) for k, v in (await client.hgetall(f"{D}ch")).items()}
    others = sorted(set(held.values()))
    async with client.pipeline(transaction=False) as pipe:
        for broker_id in others:
            pipe.exists(f"{D}alive:{broker_id}")
        alive = await pipe.execute()
    live = {b for b, up in zip(others, alive, strict=True) if up}
    ids = sorted(c for c, b in held.items() if b in live)
    if after:
        ids = ids[bisect.bisect_right(ids, after) :]
    return ids[: limit + 1]


def _text(value: object) -> str:
    """A reply of a client made without ``decode_responses``: bytes."""
    assert isinstance(value, bytes)
    return value.decode()


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


def timed_get(http: httpx.Client, url: str) -> float:
    started = time.perf_counter()
    response = http.get(url)
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, response.text
    return elapsed


async def run(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    with (
        tempfile.TemporaryDirectory(prefix="asbp-bench-api-") as tmp,
        RedisServer(Path(tmp) / "redis") as server,
    ):
        client = redis.asyncio.Redis.from_url(server.url)
        # The peer's lease never runs out during the run: no sweep forgets it.
        await client.set(f"{D}alive:{PEER}", "1")
        await client.sadd(f"{D}brokers", PEER)
        plane = RedisPlane(server.url, broker_id="bench-reader", lease=30)
        await plane.start(_ignore, _ignore)
        config = GatewayConfig(
            broker_id="bench-api", data_dir=Path(tmp) / "broker", engine="redis",
            redis_url=server.url, bus_lease=30,
        )  # fmt: skip
        app = create_app(config)
        rows = []
        try:
            with serve_app(app) as running, httpx.Client(timeout=60) as http:
                url = f"{running.http_url}/api/v1/channels?limit={args.limit}"
                for _ in range(5):  # warm: the connection, the broker's first calls
                    await asyncio.to_thread(timed_get, http, url)
                filled = 0
                for size in sizes:
                    await fill(client, filled, size)
                    filled = max(filled, size)
                    ids = sorted(_text(k) for k in await client.zrange(f"{D}chz", 0, -1))
                    middle = ids[len(ids) // 2] if ids else ""
                    listing = await plane.channel_page(middle, 0, args.limit + 1)
                    expected = await baseline_page(client, middle, args.limit)
                    assert [c for c, _ in listing.channels] == expected  # same page
                    samples: dict[str, list[float]] = {
                        k: [] for k in ("ours", "ours-mid", "base", "base-mid", "api")
                    }
                    ratios: list[float] = []
                    for _ in range(args.repeats):
                        ours = await timed(lambda: plane.channel_page("", 0, args.limit + 1))
                        base = await timed(lambda: baseline_page(client, "", args.limit))
                        samples["ours"].append(ours)
                        samples["base"].append(base)
                        samples["ours-mid"].append(
                            await timed(
                                functools.partial(plane.channel_page, middle, 0, args.limit + 1)
                            )
                        )
                        samples["base-mid"].append(
                            await timed(
                                functools.partial(baseline_page, client, middle, args.limit)
                            )
                        )
                        samples["api"].append(await asyncio.to_thread(timed_get, http, url))
                        ratios.append(base / ours)
                    medians = {k: statistics.median(v) for k, v in samples.items()}
                    rows.append((size, medians, statistics.median(ratios)))
                    print(
                        f"{size:>9,} Channels  ours {medians['ours']:7.2f} ms "
                        f"(mid {medians['ours-mid']:6.2f})  baseline {medians['base']:8.2f} ms "
                        f"(mid {medians['base-mid']:8.2f})  baseline/ours "
                        f"{statistics.median(ratios):7.1f}x  API {medians['api']:6.2f} ms",
                        flush=True,
                    )
        finally:
            await plane.close()
            await client.aclose()
    print(f"\nlimit {args.limit}, medians of {args.repeats} interleaved repeats")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0,10000,100000", help="Channels on the bus")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--limit", type=int, default=100, help="Channels a page")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

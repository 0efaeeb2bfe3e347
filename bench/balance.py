"""Balancing across the bus: a User-Agent on broker A, one Respondent fast (B), one slow (C).

    python bench/balance.py [--repeats N] [--requests N] [--window N] [--slow-ms MS]

Four brokers on one private ``redis-server``: B and C hold the Respondents (an
agent that answers at once, and one that takes ``--slow-ms`` per Command, one
at a time: a busy or smaller machine), and the User-Agent sends its Commands
at one of two front brokers, the same in all but how they pick:

=========  ===============================================================
turns      ``bus_balance = "turns"`` (the baseline: what the bus did before):
           B and C in turn, whatever each has on its plate
in_flight  ``bus_balance = "in_flight"`` (the default): the broker with the
           fewest Commands in flight for the name (reported every second,
           plus one per Command forwarded since)
=========  ===============================================================

Per mode and repeat: ``--requests`` Commands pipelined with ``--window``
outstanding; Commands/s, and the share the slow Respondent served. The ratio
in_flight / turns is computed within each repeat and the median printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from cluster import BusBroker, redis_server
from roundtrip import AGENT_ID, AUDIENCE, SERVERS, START_TIMEOUT, _open
from websockets.asyncio.client import ClientConnection

from agents.credentials import generate_agent_key, mint_agent_token


class FrontBroker(BusBroker):
    """A broker of the bus that picks Respondents with ``balance``."""

    def __init__(self, agent_key: Path, redis_url: str, balance: str) -> None:
        super().__init__(agent_key, redis_url)
        self.balance = balance

    async def start(self) -> None:
        assert self.agent_key is not None
        args = [sys.executable, str(SERVERS), "broker", "--server", "uvicorn"]
        args += ["--agent-id", AGENT_ID, "--agent-key", str(self.agent_key)]
        args += ["--broker-id", "bench-" + uuid.uuid4().hex[:8], "--redis-url", self.redis_url]
        args += ["--bus-balance", self.balance]
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        if not line.startswith(b"READY "):
            await self.stop()
            raise RuntimeError(f"broker did not start ({line!r})")
        self.port = int(line.split()[1])


async def serve(agent: ClientConnection, delay: float, served: list[int]) -> None:
    """Answer each ``work`` in order, ``delay`` seconds each; count them."""
    async for message in agent:
        assert isinstance(message, bytes)
        head, _, body = message.partition(b";")
        keys = dict(pair.split(b"=", 1) for pair in head.split(b",") if b"=" in pair)
        if keys.get(b"c") != b"work":
            continue
        if delay:
            await asyncio.sleep(delay)  # the slow Respondent's work, not synchronisation
        served[0] += 1
        await agent.send(b"c=work.reply,d=" + keys[b"i"] + b",u=" + keys[b"u"] + b";" + body)


@contextlib.asynccontextmanager
async def respondent(
    broker: BusBroker, private_pem: str, delay: float, served: list[int]
) -> AsyncIterator[None]:
    token = mint_agent_token(AGENT_ID, private_pem, audience=AUDIENCE)
    agent = await _open(broker.url("/tube"), {"Authorization": f"Bearer {token}"})
    await agent.recv()  # asbp.tube
    await agent.send(b"c=asbp.register,names=work,u=1;")
    accepted = await agent.recv()  # once the whole bus finds it
    if not (isinstance(accepted, bytes) and accepted.startswith(b"c=asbp.accepted")):
        raise RuntimeError(f"registering work failed: {accepted!r}")
    task = asyncio.create_task(serve(agent, delay, served))
    try:
        yield
    finally:
        await agent.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def pipelined(user: ClientConnection, count: int, window: int) -> float:
    slots = asyncio.Semaphore(window)

    async def send_all() -> None:
        for n in range(count):
            await slots.acquire()
            await user.send(b"c=work,u=%d;x" % (n % 60000))

    async def receive_all() -> None:
        for _ in range(count):
            reply = await user.recv()
            if not (isinstance(reply, bytes) and reply.startswith(b"c=work.reply")):
                raise RuntimeError(f"unexpected answer {reply!r:.120}")
            slots.release()

    began = time.perf_counter()
    await asyncio.gather(send_all(), receive_all())
    return time.perf_counter() - began


async def measure(
    front: FrontBroker, counts: tuple[list[int], list[int]], args: argparse.Namespace
) -> dict[str, float]:
    user = await _open(front.url("/asbp"))
    await user.recv()  # asbp.channel
    try:
        fast, slow = counts
        fast[0] = slow[0] = 0
        seconds = await pipelined(user, args.requests, args.window)
        share = slow[0] / max(1, fast[0] + slow[0])
    finally:
        await user.close()
    # Let B and C report that their plates are empty again (every second) before
    # the next run, so each mode starts from the same directory.
    await asyncio.sleep(2.5)
    return {"commands_per_s": args.requests / seconds, "slow_share": share}


async def run(args: argparse.Namespace) -> None:
    private_pem, public_pem = generate_agent_key()
    with tempfile.TemporaryDirectory(prefix="asbp-balance-") as tmp:
        key = Path(tmp) / "agent.pem"
        key.write_text(public_pem)
        with redis_server(Path(tmp)) as redis_url:
            fronts = {mode: FrontBroker(key, redis_url, mode) for mode in ("turns", "in_flight")}
            b, c = BusBroker(key, redis_url), BusBroker(key, redis_url)
            brokers = [*fronts.values(), b, c]
            for broker in brokers:
                await broker.start()
            fast: list[int] = [0]
            slow: list[int] = [0]
            rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in fronts}
            try:
                async with (
                    respondent(b, private_pem, 0.0, fast),
                    respondent(c, private_pem, args.slow_ms / 1000, slow),
                ):
                    await asyncio.sleep(2.5)  # the first load reports
                    for _ in range(args.repeats):
                        for mode, front in fronts.items():
                            rows[mode].append(await measure(front, (fast, slow), args))
            finally:
                for broker in brokers:
                    await broker.stop()
    print(f"{'mode':<10} {'Commands/s':>11} {'slow share':>11}")
    for mode, samples in rows.items():
        rate = statistics.median(s["commands_per_s"] for s in samples)
        share = statistics.median(s["slow_share"] for s in samples)
        print(f"{mode:<10} {rate:>11.0f} {share:>10.1%}")
    ratios = [
        ours["commands_per_s"] / base["commands_per_s"]
        for base, ours in zip(rows["turns"], rows["in_flight"], strict=True)
    ]
    print(f"\nin_flight / turns, pipelined Commands/s: {statistics.median(ratios):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (3)")
    parser.add_argument("--requests", type=int, default=4000, help="pipelined requests (4000)")
    parser.add_argument("--window", type=int, default=64, help="requests outstanding (64)")
    parser.add_argument("--slow-ms", type=float, default=2.0, help="the slow one's ms (2)")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("bench/balance.py needs redis-server on PATH")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

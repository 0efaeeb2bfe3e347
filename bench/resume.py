"""Resuming a WebSocket Channel on another broker of the bus, and what resume costs.

    python bench/resume.py [--quick] [--repeats N] [--commands N]

Two brokers (bench/_servers.py on Uvicorn, the ``redis`` engine) on one private
``redis-server`` without AOF, measured in one run, ``--repeats`` times:

**Replay** (issue 11's goal: >= 20,000 Commands/s). Per repeat a User-Agent
opens a Channel on broker A and drops it; an agent on A sends ``--commands``
Commands to it (``d=<i>``), which go into the Channel's log; once the log holds
them all:

* baseline: this process reads the same stream with redis-py, ``XRANGE`` in
  pages of 1,000 (the page a resume reads), from another connection: the
  floor for getting the frames out of Redis at all;
* resume: a new WebSocket to broker B sends ``asbp.resume`` with ``received=0``
  and the clock runs until the last Command has arrived: the secret's check,
  taking the Channel, and the replay, over the socket.

Commands/s of each and the ratio resume / XRANGE within each repeat; medians.

**Cost** (resume on against off): the round trip of bench/cluster.py's
``one-broker`` layout (the User-Agent and the agent's ``echo`` on one broker of
the ``redis`` engine) with ``[channels] resume = "off"`` and ``"on"``, the two
brokers interleaved: pipelined Commands/s and the sequential p50. With resume
on, each answer the broker queues for the Channel is also appended to its log:
one more script call per Command, batched with the others in flight and never
awaited; the ratios on / off say what that costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis.asyncio
from cluster import BusBroker, layout, redis_server
from roundtrip import (
    AGENT_ID,
    AUDIENCE,
    SERVERS,
    START_TIMEOUT,
    _open,
    _percentile,
    pipelined,
    sequential,
)

from agents.credentials import generate_agent_key, mint_agent_token

#: The Channel log's keys (gateway/plane/redis/log_scripts.py) under the plane's prefix.
PREFIX = "asbp:plane:"
PAGE = 1000


class ResumeBroker(BusBroker):
    """A bench/_servers.py broker on the redis engine, with ``[channels] resume`` set."""

    def __init__(self, agent_key: Path, redis_url: str, resume: str) -> None:
        super().__init__(agent_key, redis_url)
        self.resume = resume

    async def start(self) -> None:
        assert self.agent_key is not None
        args = [sys.executable, str(SERVERS), "broker", "--server", "uvicorn"]
        args += ["--agent-id", AGENT_ID, "--agent-key", str(self.agent_key)]
        args += ["--broker-id", "bench-" + uuid.uuid4().hex[:8], "--redis-url", self.redis_url]
        args += ["--resume", self.resume]
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        if not line.startswith(b"READY "):
            await self.stop()
            raise RuntimeError(f"broker did not start ({line!r})")
        self.port = int(line.split()[1])


def _field(frame: bytes, key: bytes) -> bytes:
    head = frame.split(b";", 1)[0]
    for pair in head.split(b","):
        name, _, value = pair.partition(b"=")
        if name == key:
            return value
    raise RuntimeError(f"no {key!r} in {frame[:200]!r}")


async def _logged(client: redis.asyncio.Redis, channel_id: str, count: int) -> None:
    """Wait until the Channel's log numbers ``count`` Commands (a benchmark may poll)."""
    deadline = time.monotonic() + 120
    while int(await client.hget(f"{PREFIX}log:{{{channel_id}}}", "n") or 0) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the log never filled")
        await asyncio.sleep(0.01)


async def replay_once(
    a: ResumeBroker, b: ResumeBroker, client: redis.asyncio.Redis, private_pem: str, count: int
) -> tuple[float, float]:
    """Seconds for XRANGE of the log, and for a resume at B to deliver it all."""
    user = await _open(a.url("/asbp"))
    greeting = await user.recv()
    assert isinstance(greeting, str | bytes)
    greeting_bytes = greeting.encode() if isinstance(greeting, str) else greeting
    channel_id = _field(greeting_bytes, b"i").decode()
    secret = _field(greeting_bytes, b"secret").decode()
    await user.close()
    token = mint_agent_token(AGENT_ID, private_pem, audience=AUDIENCE)
    agent = await _open(a.url("/tube"), {"Authorization": f"Bearer {token}"})
    await agent.recv()  # asbp.tube
    # Sent once its connection is gone: the broker puts each into the log.
    head = b"c=news,d=%s;" % channel_id.encode()
    for n in range(count):
        await agent.send(head + b"command %08d" % n)
    await _logged(client, channel_id, count)
    await agent.close()

    stream = f"{PREFIX}logs:{{{channel_id}}}"
    began = time.perf_counter()
    after, seen = "-", 0
    while True:
        entries = await client.xrange(stream, min=after, max="+", count=PAGE) or []
        seen += len(entries)
        if len(entries) < PAGE:
            break
        last = entries[-1][0]
        assert isinstance(last, bytes)  # a client without decode_responses
        last = last.decode()
        after = "(" + last
    xrange_s = time.perf_counter() - began
    if seen != count:
        raise RuntimeError(f"XRANGE read {seen} of {count}")

    resumed = await _open(b.url("/asbp") + "?resume=" + channel_id)
    began = time.perf_counter()
    await resumed.send(f"c=asbp.resume,i={channel_id},secret={secret},received=0;")
    answer = await resumed.recv()
    answer_bytes = answer.encode() if isinstance(answer, str) else answer
    if not answer_bytes.startswith(b"c=asbp.resumed"):
        raise RuntimeError(f"resume answered {answer_bytes[:200]!r}")
    for _ in range(count):
        await resumed.recv()
    resume_s = time.perf_counter() - began
    await resumed.close()
    return xrange_s, resume_s


async def cost_once(
    broker: ResumeBroker, private_pem: str, args: argparse.Namespace
) -> dict[str, float]:
    async with layout(broker, broker, private_pem) as user:
        prefix = b"c=echo.reply,"
        await sequential(user, prefix, args.warmup, 0)
        await pipelined(user, prefix, args.warmup * 5, args.window)
        latencies = sorted(await sequential(user, prefix, args.trips, args.warmup))
        seconds = await pipelined(user, prefix, args.requests, args.window)
    return {"p50_us": _percentile(latencies, 0.5) / 1000, "commands_per_s": args.requests / seconds}


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-bench-resume-") as tmp:
        directory = Path(tmp)
        private_pem, public_pem = generate_agent_key()
        (directory / "agent.pem").write_text(public_pem)
        (directory / "redis").mkdir()
        with redis_server(directory / "redis") as redis_url:
            client = redis.asyncio.Redis.from_url(redis_url)
            brokers = [
                ResumeBroker(directory / "agent.pem", redis_url, "on"),
                ResumeBroker(directory / "agent.pem", redis_url, "on"),
                ResumeBroker(directory / "agent.pem", redis_url, "off"),
            ]
            for broker in brokers:
                await broker.start()
            a, b, off = brokers
            try:
                replay_ratios, xrange_rates, resume_rates = [], [], []
                cost: dict[str, list[float]] = {"tput": [], "p50": []}
                on_rates, off_rates = [], []
                for repeat in range(args.repeats):
                    xrange_s, resume_s = await replay_once(a, b, client, private_pem, args.commands)
                    xrange_rates.append(args.commands / xrange_s)
                    resume_rates.append(args.commands / resume_s)
                    replay_ratios.append(xrange_s / resume_s)
                    # Interleaved, each first in turn: neither always runs warmer.
                    order = [(a, True), (off, False)]
                    if repeat % 2:
                        order.reverse()
                    measured = {flag: await cost_once(br, private_pem, args) for br, flag in order}
                    on_rates.append(measured[True]["commands_per_s"])
                    off_rates.append(measured[False]["commands_per_s"])
                    cost["tput"].append(
                        measured[True]["commands_per_s"] / measured[False]["commands_per_s"]
                    )
                    cost["p50"].append(measured[False]["p50_us"] / measured[True]["p50_us"])
                    print(
                        f"repeat {repeat + 1}: replay {args.commands / resume_s:,.0f}/s"
                        f" (XRANGE {args.commands / xrange_s:,.0f}/s);"
                        f" resume on {measured[True]['commands_per_s']:,.0f}/s"
                        f" p50 {measured[True]['p50_us']:.0f} us,"
                        f" off {measured[False]['commands_per_s']:,.0f}/s"
                        f" p50 {measured[False]['p50_us']:.0f} us",
                        file=sys.stderr,
                    )
            finally:
                for broker in brokers:
                    with contextlib.suppress(Exception):
                        await broker.stop()
                await client.aclose()
    median = statistics.median
    print(f"replay of {args.commands:,} Commands on another broker, medians of {args.repeats}:")
    print(f"  resume          {median(resume_rates):>12,.0f} Commands/s   (goal >= 20,000)")
    print(f"  XRANGE baseline {median(xrange_rates):>12,.0f} Commands/s")
    print(f"  ratio resume / XRANGE: {median(replay_ratios):.2f}")
    print("cost of resume on the round trip (one broker, redis engine), medians:")
    print(f"  resume on  {median(on_rates):>10,.0f} Commands/s")
    print(f"  resume off {median(off_rates):>10,.0f} Commands/s")
    print(f"  ratio on / off: throughput {median(cost['tput']):.2f}, p50 {median(cost['p50']):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="repeats (5)")
    parser.add_argument("--commands", type=int, default=10000, help="Commands replayed (10000)")
    parser.add_argument("--trips", type=int, default=1000, help="sequential round trips (1000)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up round trips (100)")
    parser.add_argument("--requests", type=int, default=10000, help="pipelined requests (10000)")
    parser.add_argument("--window", type=int, default=100, help="requests outstanding (100)")
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.commands = 2, 1000
        args.trips, args.warmup, args.requests = 100, 20, 1000
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

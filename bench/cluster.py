"""One bus across two brokers: a User-Agent on broker A, its Respondent on broker B.

    python bench/cluster.py [--repeats N] [--requests N] [--window N]

Three layouts, each in one run, interleaved ``--repeats`` times, on one private
``redis-server`` (both brokers on the ``redis`` engine, so the baseline pays
for Redis exactly as the bus does) and on a private six-node Redis Cluster
(three primaries, one replica each; tests/support/redis_cluster.py):

=============  ==========================================================
one-broker     the User-Agent and the agent on the same broker (baseline)
two-brokers    the User-Agent on broker A, the agent on broker B only: each
               Command goes A -> Redis stream -> B -> agent -> B -> Redis
               stream -> A
two-on-cluster the same on the Redis Cluster: each forward is a lookup in
               the directory's slot, then a send to the target's stream on
               its primary, followed by WAIT for its replica
=============  ==========================================================

The cluster ratio is two-on-cluster / two-brokers (the goal of issue 12: at
least 0.7 of one Redis; on one machine a cluster cannot be faster, so the
figure is its overhead). Neither Redis keeps an AOF here.

Per layout and repeat: sequential round trips (p50 and p99 in us) and
pipelined Commands/s with ``--window`` outstanding (bench/roundtrip.py's
clients). The ratio two-brokers / one-broker is computed within each repeat
and the median printed; the goal is >= 0.6 for throughput.

Where the added time goes: each forwarded Command costs two Redis round trips
(A's forward script, B's reply to A), each batched with everything else in
flight (gateway/engines/redis/batch.py), plus one XREAD on each side that
returns whatever arrived meanwhile; the CPU column shows the two brokers' CPU
per round trip against the one broker's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from roundtrip import (
    AGENT_ID,
    AUDIENCE,
    SERVERS,
    START_TIMEOUT,
    ServerProcess,
    Target,
    _agent_broker,
    _open,
    _percentile,
    pipelined,
    sequential,
)
from websockets.asyncio.client import ClientConnection

from agents.credentials import generate_agent_key, mint_agent_token

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.redis_cluster: the cluster the tests use
from tests.support.redis_cluster import RedisCluster  # noqa: E402  # after the path above

TARGET = Target("broker/uvicorn", "broker", "uvicorn")


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A private ``redis-server`` on a free port; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # the port answers once Redis listens
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait()


class BusBroker(ServerProcess):
    """A bench/_servers.py broker on the redis engine."""

    def __init__(self, agent_key: Path, redis_url: str) -> None:
        super().__init__(TARGET, agent_key=agent_key)
        self.redis_url = redis_url

    async def start(self) -> None:
        assert self.agent_key is not None
        args = [sys.executable, str(SERVERS), "broker", "--server", "uvicorn"]
        args += ["--agent-id", AGENT_ID, "--agent-key", str(self.agent_key)]
        args += ["--broker-id", "bench-" + uuid.uuid4().hex[:8], "--redis-url", self.redis_url]
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        if not line.startswith(b"READY "):
            await self.stop()
            raise RuntimeError(f"broker did not start ({line!r})")
        self.port = int(line.split()[1])


@contextlib.asynccontextmanager
async def layout(
    user_broker: BusBroker, agent_broker: BusBroker, private_pem: str
) -> AsyncIterator[ClientConnection]:
    """The agent registered on ``agent_broker``; a User-Agent on ``user_broker``."""
    token = mint_agent_token(AGENT_ID, private_pem, audience=AUDIENCE)
    agent = await _open(agent_broker.url("/tube"), {"Authorization": f"Bearer {token}"})
    await agent.recv()  # asbp.tube
    await agent.send(b"c=asbp.register,names=echo,u=1;")
    accepted = await agent.recv()
    if not (isinstance(accepted, bytes) and accepted.startswith(b"c=asbp.accepted")):
        raise RuntimeError(f"registering echo failed: {accepted!r}")
    responder = asyncio.create_task(_agent_broker(agent))
    user = await _open(user_broker.url("/asbp"))
    await user.recv()  # asbp.channel
    # The directory learns of the registration within a pipeline: ask until answered.
    deadline = time.monotonic() + 30
    probe = 0
    while True:
        probe += 1
        await user.send(b"c=echo,u=%d;probe" % (60000 + probe))
        with contextlib.suppress(TimeoutError):
            reply = await asyncio.wait_for(user.recv(), 2)
            if isinstance(reply, bytes) and reply.startswith(b"c=echo.reply"):
                break
            print(f"probe answered {reply!r:.120}", file=sys.stderr)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"echo never answered (user on :{user_broker.port}, agent on :{agent_broker.port})"
            )
        await asyncio.sleep(0.01)
    try:
        yield user
    finally:
        await user.close()
        await agent.close()
        responder.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await responder


async def measure(
    user_broker: BusBroker, agent_broker: BusBroker, private_pem: str, args: argparse.Namespace
) -> dict[str, float]:
    servers = {user_broker, agent_broker}
    async with layout(user_broker, agent_broker, private_pem) as user:
        prefix = b"c=echo.reply,"
        await sequential(user, prefix, args.warmup, 0)
        await pipelined(user, prefix, args.warmup * 5, args.window)
        latencies = sorted(await sequential(user, prefix, args.trips, args.warmup))
        cpu0 = sum(s.cpu_seconds() for s in servers)
        seconds = await pipelined(user, prefix, args.requests, args.window)
        cpu = sum(s.cpu_seconds() for s in servers) - cpu0
    return {
        "p50_us": _percentile(latencies, 0.5) / 1000,
        "p99_us": _percentile(latencies, 0.99) / 1000,
        "commands_per_s": args.requests / seconds,
        "server_cpu_us": cpu / args.requests * 1e6,
    }


async def run(args: argparse.Namespace) -> None:
    private_pem, public_pem = generate_agent_key()
    with tempfile.TemporaryDirectory(prefix="asbp-cluster-") as tmp:
        key = Path(tmp) / "agent.pem"
        key.write_text(public_pem)
        cluster = RedisCluster(Path(tmp) / "cluster", appendonly=False)
        with redis_server(Path(tmp)) as redis_url, cluster:
            a, b = BusBroker(key, redis_url), BusBroker(key, redis_url)
            ca, cb = BusBroker(key, cluster.url), BusBroker(key, cluster.url)
            for broker in (a, b, ca, cb):
                await broker.start()
            try:
                rows: dict[str, list[dict[str, float]]] = {
                    "one-broker": [],
                    "two-brokers": [],
                    "two-on-cluster": [],
                }
                for _ in range(args.repeats):
                    rows["one-broker"].append(await measure(a, a, private_pem, args))
                    rows["two-brokers"].append(await measure(a, b, private_pem, args))
                    rows["two-on-cluster"].append(await measure(ca, cb, private_pem, args))
            finally:
                for broker in (a, b, ca, cb):
                    await broker.stop()
    print(f"{'layout':<14} {'p50 us':>8} {'p99 us':>8} {'Commands/s':>11} {'CPU us/trip':>12}")
    for name, samples in rows.items():

        def med(field: str, samples: list[dict[str, float]] = samples) -> float:
            return statistics.median(s[field] for s in samples)

        print(
            f"{name:<14} {med('p50_us'):>8.0f} {med('p99_us'):>8.0f} "
            f"{med('commands_per_s'):>11.0f} {med('server_cpu_us'):>12.1f}"
        )
    ratios = [
        two["commands_per_s"] / one["commands_per_s"]
        for one, two in zip(rows["one-broker"], rows["two-brokers"], strict=True)
    ]
    latency = [
        one["p50_us"] / two["p50_us"]
        for one, two in zip(rows["one-broker"], rows["two-brokers"], strict=True)
    ]
    ratio = statistics.median(ratios)
    print(
        f"\ntwo-brokers / one-broker, pipelined Commands/s: {ratio:.2f} "
        f"(goal >= 0.60: {'met' if ratio >= 0.6 else 'NOT met'}); "
        f"p50 latency ratio (one/two): {statistics.median(latency):.2f}"
    )
    on_cluster = statistics.median(
        cluster["commands_per_s"] / one["commands_per_s"]
        for one, cluster in zip(rows["two-brokers"], rows["two-on-cluster"], strict=True)
    )
    print(
        f"two-on-cluster / two-brokers (one Redis), pipelined Commands/s: {on_cluster:.2f} "
        f"(goal >= 0.70: {'met' if on_cluster >= 0.7 else 'NOT met'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (3)")
    parser.add_argument("--trips", type=int, default=1000, help="sequential round trips (1000)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up round trips (100)")
    parser.add_argument("--requests", type=int, default=10000, help="pipelined requests (10000)")
    parser.add_argument("--window", type=int, default=100, help="requests outstanding (100)")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("bench/cluster.py needs redis-server on PATH")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

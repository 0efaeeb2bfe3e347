"""One bus across two brokers: a User-Agent on broker A, its Respondent on broker B.

    python bench/cluster.py [--repeats N] [--requests N] [--window N] [--http-only]
                            [--queue-messages N] [--no-queues | --queues-only]
                            [--no-http] [--no-cluster] [--hold SECONDS]

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

HTTP long-poll, the same way (``http-one`` against ``http-two``): one HTTP
Channel whose POSTs and long-polls all go to broker A, against the same
Channel with its requests alternating between A and B (its mailbox is its
Channel log in Redis, so any broker answers). ``asbp.ping`` each time (the
broker answers it, so only the Channel's path is measured): sequential
round trips (POST, then the long-poll that returns its pong; p50 and p99)
and Commands/s with one sender POSTing and one long-poll loop reading
concurrently. The added latency per Command is the median of p50(two) -
p50(one) within each repeat.

Queues and topics, the same way (``--queue-messages``, bench/cluster_queues.py's
cases, against the same ``redis-server`` and Redis Cluster in the same run):
queue publish -> deliver -> ack (one ``RedisEngine``, 100 enqueues outstanding,
``fetch(count=100)`` then ``ack``) and topic fan-out (published at one engine
into four virtual queues, received at another), messages per second on one
Redis and on the cluster, interleaved, the ratio cluster / one Redis within
each repeat and its median against issue 12's goal (>= 0.7).

``--hold SECONDS`` first runs two-brokers pipelined round trips for that long,
printing both brokers' process ids, for a profiler (``py-spy record --pid``)
to attach to; ``--cprofile DIR`` runs brokers A and B under cProfile instead
(DIR/a.pstats and b.pstats, written as they stop); ``--no-http`` and
``--no-cluster`` leave out the HTTP layouts and two-on-cluster (shorter runs
while working on the two-brokers path).

Where the added time goes: each forwarded Command crosses Redis twice (A's
request to B's inbound stream, B's answer to A's), each in a pipeline with
everything else in flight (gateway/engines/redis/batch.py), plus one XREAD on
each side that returns whatever arrived meanwhile. The forwards made while a
pipeline waits are packed (gateway/plane/redis/batches.py): A's requests for
one name are one script call and one stream entry per target, B's answers for
one Channel one call and one entry, so under load a Command's share of a
script call, an entry and a reply is a small fraction of one. The CPU columns
show, per round trip, the brokers' CPU (both, for two brokers) and Redis's
(``/proc/<pid>/task/*/schedstat`` of the ``redis-server``, or of the six
cluster nodes), against the one broker's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import httpx
from cluster_queues import measure as measure_queues  # bench/cluster_queues.py's cases
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
from _peer_servers import cpu_seconds  # noqa: E402  # per-thread schedstat, as the brokers' column

from tests.support.redis_cluster import RedisCluster  # noqa: E402  # after the path above

TARGET = Target("broker/uvicorn", "broker", "uvicorn")


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A private ``redis-server`` on a free port; its URL."""
    with redis_process(directory) as (url, _):
        yield url


@contextlib.contextmanager
def redis_process(directory: Path) -> Iterator[tuple[str, int]]:
    """A private ``redis-server`` on a free port; its URL and process id."""
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
        yield f"redis://127.0.0.1:{port}/0", process.pid
    finally:
        process.terminate()
        process.wait()


class BusBroker(ServerProcess):
    """A bench/_servers.py broker on the redis engine."""

    def __init__(
        self,
        agent_key: Path,
        redis_url: str,
        redis_pids: Sequence[int] = (),
        cprofile: Path | None = None,
    ) -> None:
        super().__init__(TARGET, agent_key=agent_key, cprofile=cprofile)
        self.redis_url = redis_url
        #: The Redis processes the broker's plane uses (their CPU is a column).
        self.redis_pids = list(redis_pids)

    async def start(self) -> None:
        assert self.agent_key is not None
        args = [sys.executable, str(SERVERS), "broker", "--server", "uvicorn"]
        args += ["--agent-id", AGENT_ID, "--agent-key", str(self.agent_key)]
        args += ["--broker-id", "bench-" + uuid.uuid4().hex[:8], "--redis-url", self.redis_url]
        if self.cprofile is not None:
            args += ["--cprofile", str(self.cprofile)]
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


async def hold(
    user_broker: BusBroker, agent_broker: BusBroker, private_pem: str, args: argparse.Namespace
) -> None:
    """Two-brokers pipelined round trips for ``args.hold`` seconds, for a profiler."""
    async with layout(user_broker, agent_broker, private_pem) as user:
        print(
            f"holding two-brokers for {args.hold:g} s: user's broker A pid {user_broker.pid}, "
            f"agent's broker B pid {agent_broker.pid}",
            flush=True,
        )
        began = time.perf_counter()
        held = 0
        while time.perf_counter() - began < args.hold:
            await pipelined(user, b"c=echo.reply,", 2000, args.window)
            held += 2000
        seconds = time.perf_counter() - began
        print(f"held: {held} round trips in {seconds:.1f} s ({held / seconds:.0f}/s)", flush=True)


async def measure(
    user_broker: BusBroker, agent_broker: BusBroker, private_pem: str, args: argparse.Namespace
) -> dict[str, float]:
    servers = {user_broker, agent_broker}
    async with layout(user_broker, agent_broker, private_pem) as user:
        prefix = b"c=echo.reply,"
        await sequential(user, prefix, args.warmup, 0)
        await pipelined(user, prefix, args.warmup * 5, args.window)
        latencies = sorted(await sequential(user, prefix, args.trips, args.warmup))
        redis_pids = user_broker.redis_pids
        cpu0 = sum(s.cpu_seconds() for s in servers)
        redis0 = cpu_seconds(redis_pids)
        seconds = await pipelined(user, prefix, args.requests, args.window)
        cpu = sum(s.cpu_seconds() for s in servers) - cpu0
        redis_cpu = cpu_seconds(redis_pids) - redis0
    return {
        "p50_us": _percentile(latencies, 0.5) / 1000,
        "p99_us": _percentile(latencies, 0.99) / 1000,
        "commands_per_s": args.requests / seconds,
        "server_cpu_us": cpu / args.requests * 1e6,
        "redis_cpu_us": redis_cpu / args.requests * 1e6,
    }


class HttpUser:
    """One HTTP Channel, its requests sent to ``urls`` in turn."""

    def __init__(self, client: httpx.AsyncClient, urls: list[str]) -> None:
        self.client = client
        self.urls = urls
        self.turn = 0
        self.channel_id = ""
        self.secret = ""
        self.after = 0

    def _next(self) -> str:
        self.turn += 1
        return self.urls[self.turn % len(self.urls)]

    async def open(self) -> None:
        response = await self.client.post(self.urls[0], content=b"c=asbp.channel;")
        self.secret = response.headers["asbp-secret"]
        accepted = response.content.split(b";", 1)[0]
        fields = dict(part.split(b"=", 1) for part in accepted.split(b","))
        self.channel_id = fields[b"i"].decode()

    async def post(self, u: int) -> None:
        frame = b"c=asbp.ping,i=%s,u=%d;" % (self.channel_id.encode(), u)
        response = await self.client.post(
            self._next(),
            content=frame,
            headers={"Content-Type": "application/asbp", "ASBP-Secret": self.secret},
        )
        if response.status_code != 200:
            raise RuntimeError(f"POST answered {response.status_code}: {response.content!r}")

    async def poll(self) -> int:
        """One long-poll; the number of Commands it returned."""
        response = await self.client.get(
            self._next(),
            params={"i": self.channel_id, "after": str(self.after), "wait": "5"},
            headers={"ASBP-Secret": self.secret},
        )
        if response.status_code == 204:
            return 0
        if response.status_code != 200:
            raise RuntimeError(f"long-poll answered {response.status_code}")
        seqs = [int(x) for x in re.findall(rb"ASBP-Seq: (\d+)", response.content)]
        fresh = [seq for seq in seqs if seq > self.after]
        if fresh:
            self.after = fresh[-1]
        return len(fresh)


async def measure_http(urls: list[str], args: argparse.Namespace) -> dict[str, float]:
    # A connection per request: a request on a kept-alive connection waits about
    # 44 ms on both servers here (the first on a connection about 4 ms), a stall
    # of the server stack (Nagle and delayed ACK, by the look of it) that would
    # drown what is measured; see the report of issue 11.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        user = HttpUser(client, urls)
        await user.open()
        latencies: list[int] = []
        for u in range(args.warmup + args.http_trips):
            started = time.perf_counter_ns()
            await user.post(u)
            while not await user.poll():
                pass
            if u >= args.warmup:
                latencies.append(time.perf_counter_ns() - started)
        latencies.sort()
        total = args.http_requests
        began = time.perf_counter()

        async def send() -> None:
            for u in range(total):
                await user.post(u)

        sender = asyncio.ensure_future(send())
        received = 0
        while received < total:
            received += await user.poll()
        await sender
        seconds = time.perf_counter() - began
    return {
        "p50_us": _percentile(latencies, 0.5) / 1000,
        "p99_us": _percentile(latencies, 0.99) / 1000,
        "commands_per_s": total / seconds,
    }


async def run(args: argparse.Namespace) -> None:
    private_pem, public_pem = generate_agent_key()
    with tempfile.TemporaryDirectory(prefix="asbp-cluster-") as tmp:
        key = Path(tmp) / "agent.pem"
        key.write_text(public_pem)
        cluster = RedisCluster(Path(tmp) / "cluster", appendonly=False)
        # --no-cluster: no Redis Cluster started at all (nor the queues, which use it).
        cluster_context = contextlib.nullcontext() if args.no_cluster else cluster
        with redis_process(Path(tmp)) as (redis_url, redis_pid), cluster_context:
            profiles = args.cprofile
            a = BusBroker(key, redis_url, [redis_pid], profiles and profiles / "a.pstats")
            b = BusBroker(key, redis_url, [redis_pid], profiles and profiles / "b.pstats")
            brokers = [a, b]
            if not args.no_cluster:
                nodes = [server.pid for server in cluster.servers]
                ca, cb = BusBroker(key, cluster.url, nodes), BusBroker(key, cluster.url, nodes)
                brokers += [ca, cb]
            for broker in brokers:
                await broker.start()
            if args.queues_only:
                for broker in brokers:
                    await broker.stop()
                await run_queues(args, redis_url, cluster.url)
                return
            try:
                rows: dict[str, list[dict[str, float]]] = {
                    "one-broker": [],
                    "two-brokers": [],
                    "two-on-cluster": [],
                }
                http: dict[str, list[dict[str, float]]] = {"http-one": [], "http-two": []}
                on_a = a.url("/asbp").replace("ws://", "http://")
                on_b = b.url("/asbp").replace("ws://", "http://")
                if args.hold:
                    await hold(a, b, private_pem, args)
                for _ in range(args.repeats):
                    if not args.http_only:
                        rows["one-broker"].append(await measure(a, a, private_pem, args))
                        rows["two-brokers"].append(await measure(a, b, private_pem, args))
                        if not args.no_cluster:
                            two = await measure(ca, cb, private_pem, args)
                            rows["two-on-cluster"].append(two)
                    if not args.no_http:
                        http["http-one"].append(await measure_http([on_a], args))
                        http["http-two"].append(await measure_http([on_a, on_b], args))
            finally:
                for broker in brokers:
                    await broker.stop()
            if not args.no_queues and not args.no_cluster:
                await run_queues(args, redis_url, cluster.url)
    if args.repeats == 0:
        # --repeats 0 --hold N: the hold alone, for a profile of the two-brokers layout
        # (--cprofile) or for tools watching it; no repeat to take a median of.
        print("--repeats 0: nothing measured to report")
        return
    if not args.no_http:
        report_http(http)
    if args.http_only:
        return
    if args.no_cluster:
        del rows["two-on-cluster"]
    print(
        f"{'layout':<14} {'p50 us':>8} {'p99 us':>8} {'Commands/s':>11} {'CPU us/trip':>12} "
        f"{'Redis us/trip':>14}"
    )
    for name, samples in rows.items():

        def med(field: str, samples: list[dict[str, float]] = samples) -> float:
            return statistics.median(s[field] for s in samples)

        print(
            f"{name:<14} {med('p50_us'):>8.0f} {med('p99_us'):>8.0f} "
            f"{med('commands_per_s'):>11.0f} {med('server_cpu_us'):>12.1f} "
            f"{med('redis_cpu_us'):>14.1f}"
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
    each = ", ".join(f"{r:.2f}" for r in ratios)
    cpu = ", ".join(f"{s['server_cpu_us']:.1f}" for s in rows["two-brokers"])
    print(f"  per repeat: ratio {each}; two-brokers broker CPU us/trip {cpu}")
    if args.no_cluster:
        return
    on_cluster = statistics.median(
        cluster["commands_per_s"] / one["commands_per_s"]
        for one, cluster in zip(rows["two-brokers"], rows["two-on-cluster"], strict=True)
    )
    print(
        f"two-on-cluster / two-brokers (one Redis), pipelined Commands/s: {on_cluster:.2f} "
        f"(goal >= 0.70: {'met' if on_cluster >= 0.7 else 'NOT met'})"
    )


async def run_queues(args: argparse.Namespace, redis_url: str, cluster_url: str) -> None:
    """Queue publish -> deliver -> ack and topic fan-out, one Redis against the cluster
    (bench/cluster_queues.py's cases and report, in this run)."""
    print("\nqueues and topics (messages/s; ratio cluster / one Redis):", flush=True)
    queue_args = argparse.Namespace(
        messages=args.queue_messages, repeats=args.repeats, payload=args.payload
    )
    await measure_queues(queue_args, redis_url, cluster_url)


def report_http(http: dict[str, list[dict[str, float]]]) -> None:
    print(f"{'HTTP layout':<12} {'p50 us':>8} {'p99 us':>8} {'Commands/s':>11}")
    for name, samples in http.items():
        print(
            f"{name:<12} {statistics.median(s['p50_us'] for s in samples):>8.0f} "
            f"{statistics.median(s['p99_us'] for s in samples):>8.0f} "
            f"{statistics.median(s['commands_per_s'] for s in samples):>11.0f}"
        )
    pairs = list(zip(http["http-one"], http["http-two"], strict=True))
    ratio = statistics.median(two["commands_per_s"] / one["commands_per_s"] for one, two in pairs)
    added = statistics.median(two["p50_us"] - one["p50_us"] for one, two in pairs)
    print(
        f"\nHTTP alternating between two brokers / on one broker, Commands/s: {ratio:.2f}; "
        f"added latency per Command (p50): {added:+.0f} us\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (3)")
    parser.add_argument("--trips", type=int, default=1000, help="sequential round trips (1000)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up round trips (100)")
    parser.add_argument("--requests", type=int, default=10000, help="pipelined requests (10000)")
    parser.add_argument("--window", type=int, default=100, help="requests outstanding (100)")
    parser.add_argument("--http-trips", type=int, default=300, help="HTTP round trips (300)")
    parser.add_argument("--http-requests", type=int, default=2000, help="HTTP Commands (2000)")
    parser.add_argument("--http-only", action="store_true", help="only the HTTP layouts")
    parser.add_argument(
        "--queue-messages", type=int, default=20_000, help="queue and topic messages (20000)"
    )
    parser.add_argument("--payload", type=int, default=100, help="queue message bytes (100)")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP layouts")
    parser.add_argument(
        "--cprofile",
        type=Path,
        metavar="DIR",
        help="run brokers A and B under cProfile, their pstats to DIR/a.pstats and b.pstats",
    )
    parser.add_argument(
        "--no-cluster",
        action="store_true",
        help="skip two-on-cluster (and the queues, which compare against the cluster)",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=0,
        help="first run two-brokers round trips this many seconds (printing the brokers' "
        "pids), to profile them",
    )
    queues = parser.add_mutually_exclusive_group()
    queues.add_argument("--no-queues", action="store_true", help="skip queues and topics")
    queues.add_argument("--queues-only", action="store_true", help="only queues and topics")
    args = parser.parse_args()
    if args.queues_only and args.no_cluster:
        parser.error("--queues-only compares against the cluster: not with --no-cluster")
    if shutil.which("redis-server") is None:
        sys.exit("bench/cluster.py needs redis-server on PATH")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

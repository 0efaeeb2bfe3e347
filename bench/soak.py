"""Many WebSocket Channels on one broker, with churn and traffic: errors, handshakes, memory.

    python bench/soak.py                       # 10,000 Channels, 1,000 connects/s for 60 s
    python bench/soak.py --quick               # 1,000 Channels, 200 connects/s for 5 s
    python bench/soak.py --server uvicorn --repeats 3

Two phases, each server in its own process (bench/_servers.py, as
bench/roundtrip.py starts them):

**Idle memory.** ``--channels`` WebSocket connections are opened and left idle
on the broker (``/asbp``: each gets its ``asbp.channel`` greeting) and, in the
same run, on a plain ``websockets`` server (``websockets.asyncio.server``, the
relay of bench/_servers.py), and the growth of each server's resident memory
(``VmRSS``, after a warm-up of a few hundred connections opened and closed) is
divided by the connections: KiB per idle Channel, and the ratio broker ÷ raw
``websockets`` (goal ≤ 2.5). With ``--repeats``, the servers run interleaved
and the table shows medians; the ratio is taken within each repeat.

**Soak.** ``--channels`` Channels are held open on the broker while, for
``--seconds``, ``--rate`` connections a second are closed and as many opened in
their place (in ticks of 100 ms), and traffic flows: ``--rate`` ``asbp.ping``
a second on random Channels, each answered by its ``asbp.pong``, and one topic
message every tick from a random Channel to ``/soak``, which ``--subscribers``
Channels (never churned) subscribe to and must each receive. Reported: errors
(goal 0: a handshake that fails or gives no greeting within 10 s, a Channel
closed by the broker, a ping without its pong within 10 s, any fault, a topic
message a subscriber did not get), the handshake time (TCP connect to greeting)
p50/p99, the connect rate reached, and the broker's memory before and after.

Connections come from 127.0.0.2 and on, one source address per 500 of them:
the broker limits open Channels per client address (``max_per_address``,
1,000 by default), and one address would run out of ports under churn (each
closed connection waits in TIME_WAIT). The open-file limit is raised to its
hard limit in this process and the servers it starts. The load generator is
one asyncio process; on a small machine it costs about as much CPU as the
broker, so the connect rate reached says as much about the machine as about
the broker (``connect rate`` is printed beside the target).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.credentials import generate_agent_key  # noqa: E402

SERVERS = ROOT / "bench" / "_servers.py"
#: Seconds a server has to print READY, a handshake to finish, a ping to be answered.
START_TIMEOUT, HANDSHAKE_TIMEOUT, ANSWER_TIMEOUT = 30.0, 10.0, 10.0
#: Connections per client source address (127.0.0.2, 127.0.0.3, ...).
PER_ADDRESS = 500
TICK = 0.1
TOPIC = "/soak"


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far (user and system, all threads)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rpartition(b")")[2].split()
    # Fields 14 and 15 of proc(5); the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def source_addresses() -> Iterator[str]:
    """127.0.0.2, ... each for PER_ADDRESS connections in turn (all of 127/8 is loopback)."""
    n = 0
    while True:
        host = n // PER_ADDRESS
        yield f"127.0.{host // 250}.{2 + host % 250}"
        n += 1


class Server:
    """A bench/_servers.py process; stopped by closing its stdin."""

    def __init__(self, kind: str, server: str | None, agent_key: Path) -> None:
        self.kind, self.server, self.agent_key = kind, server, agent_key
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    @property
    def label(self) -> str:
        return "raw-websockets" if self.kind == "raw" else f"broker/{self.server}"

    async def start(self) -> None:
        args = [sys.executable, str(SERVERS), self.kind]
        if self.kind == "broker":
            assert self.server is not None
            args += ["--server", self.server, "--agent-key", str(self.agent_key)]
            args += ["--broker-id", "soak-" + uuid.uuid4().hex[:8]]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
        env["PYTHONPATH"] = str(ROOT)
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        if not line.startswith(b"READY "):
            await self.stop()
            raise RuntimeError(f"{self.label}: the server did not start ({line!r})")
        self.port = int(line.split()[1])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/asbp"

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


@dataclass
class Tally:
    """What the clients saw."""

    handshakes: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    pings: int = 0
    #: The topic messages accepted (their numbers).
    published: set[int] = field(default_factory=set)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class Client:
    """One Channel: its connection, and a reader that answers what waits on it."""

    def __init__(self, ws: ClientConnection, tally: Tally, broker: bool) -> None:
        self.ws, self.tally, self.broker = ws, tally, broker
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.closing = False
        self.reader = asyncio.create_task(self._read()) if broker else None
        self.next_u = 0
        #: The topic messages this Channel was notified of (their numbers).
        self.notes: set[int] = set()

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                frame = message.encode() if isinstance(message, str) else message
                header = frame.partition(b";")[0].decode("utf-8", "replace")
                keys = dict(pair.partition("=")[::2] for pair in header.split(","))
                name = keys.get("c")
                if name == "asbp.notification":
                    self.notes.add(int(frame.partition(b";")[2]))
                elif name == "asbp.fault":
                    self.tally.error(f"fault {keys.get('code')}")
                future = self.waiting.pop(keys.get("u", ""), None)
                if future is not None and not future.done():
                    future.set_result(None)
        except Exception:
            pass
        if not self.closing:
            self.tally.error("closed by the broker")

    async def call(self, frame: bytes, u: str) -> None:
        future = asyncio.get_running_loop().create_future()
        self.waiting[u] = future
        await self.ws.send(frame)
        await asyncio.wait_for(future, ANSWER_TIMEOUT)

    async def ping(self) -> None:
        self.next_u = (self.next_u + 1) % 60000
        u = str(self.next_u)
        try:
            await self.call(b"c=asbp.ping,u=%s;" % u.encode(), u)
        except TimeoutError:
            self.tally.error("ping without a pong")
        else:
            self.tally.pings += 1

    async def close(self) -> None:
        self.closing = True
        for future in self.waiting.values():
            future.cancel()  # churned away while waiting: not an error
        await self.ws.close()
        if self.reader is not None:
            await self.reader


async def open_client(
    url: str, source: str, tally: Tally, *, broker: bool, record: bool = True
) -> Client | None:
    began = time.perf_counter()
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT):
            ws = await connect(
                url, compression=None, local_addr=(source, 0), open_timeout=None, max_size=None
            )
            if broker:
                greeting = await ws.recv()
                data = greeting if isinstance(greeting, bytes) else greeting.encode()
                if not data.startswith(b"c=asbp.channel"):
                    tally.error("no greeting")
                    await ws.close()
                    return None
    except Exception as exc:
        tally.error(f"handshake failed: {type(exc).__name__}")
        return None
    if record:
        tally.handshakes.append(time.perf_counter() - began)
    return Client(ws, tally, broker)


async def open_many(
    url: str, count: int, sources: Iterator[str], tally: Tally, *, broker: bool, rate: int
) -> list[Client]:
    """``count`` connections, at most ``rate`` a second started, 200 at a time at most."""
    gate = asyncio.Semaphore(200)
    began = time.perf_counter()

    async def one(n: int) -> Client | None:
        async with gate:
            # Paced: connection n may start n / rate seconds into the phase.
            ahead = began + n / rate - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
            return await open_client(url, next(sources), tally, broker=broker)

    opened = await asyncio.gather(*(one(n) for n in range(count)))
    return [client for client in opened if client is not None]


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- phase 1: idle memory -------------------------------------------------------------


async def idle_memory(server: Server, channels: int, rate: int) -> float:
    """KiB of server memory per idle connection."""
    sources = source_addresses()
    tally = Tally()
    broker = server.kind == "broker"
    warm = await open_many(server.url, 300, sources, tally, broker=broker, rate=10 * rate)
    await asyncio.gather(*(client.close() for client in warm))
    before = rss_kib(server.pid)
    held = await open_many(server.url, channels, sources, tally, broker=broker, rate=10 * rate)
    after = rss_kib(server.pid)
    if tally.errors or len(held) != channels:
        raise RuntimeError(f"{server.label}: {len(held)} of {channels} opened: {tally.errors}")
    await asyncio.gather(*(client.close() for client in held))
    return (after - before) / channels


# -- phase 2: soak --------------------------------------------------------------------


@dataclass
class SoakResult:
    tally: Tally
    connects: int
    seconds: float
    rss_start: int
    rss_end: int
    subscribers: int
    received: int
    #: CPU seconds the broker and this load generator spent during the churn.
    broker_cpu: float
    client_cpu: float


async def soak(server: Server, channels: int, rate: int, seconds: float, subs: int) -> SoakResult:
    sources = source_addresses()
    tally = Tally()
    held = await open_many(server.url, channels, sources, tally, broker=True, rate=rate)
    tally.handshakes.clear()  # the soak's handshakes are those made under churn
    subscribers, churned = held[:subs], held[subs:]
    for n, client in enumerate(subscribers):
        u = str(60001 + n % 5000)
        frame = b"c=asbp.subscribe,destination=%s,type=TOPIC,u=%s;" % (TOPIC.encode(), u.encode())
        await client.call(frame, u)
    rss_start = rss_kib(server.pid)
    cpu_start = cpu_seconds(server.pid), time.process_time()
    per_tick = max(1, round(rate * TICK))
    loop = asyncio.get_running_loop()
    began = loop.time()
    connects = 0
    work: set[asyncio.Task[None]] = set()

    async def replace(old: Client) -> None:
        nonlocal connects
        await old.close()
        new = await open_client(server.url, next(sources), tally, broker=True)
        if new is not None:
            connects += 1
            churned.append(new)

    async def publish(client: Client, n: int) -> None:
        u = str(50000 + n % 10000)
        frame = b"c=asbp.publish,destination=%s,type=TOPIC,u=%s;%d" % (
            TOPIC.encode(),
            u.encode(),
            n,
        )
        try:
            await client.call(frame, u)
        except TimeoutError:
            tally.error("publication not accepted")
        else:
            tally.published.add(n)

    tick = 0
    while loop.time() - began < seconds:
        tick += 1
        random.shuffle(churned)
        leaving, churned[:] = churned[:per_tick], churned[per_tick:]
        for client in leaving:
            task = asyncio.create_task(replace(client))
            work.add(task)
            task.add_done_callback(work.discard)
        for client in random.sample(churned, min(per_tick, len(churned))):
            task = asyncio.create_task(client.ping())
            work.add(task)
            task.add_done_callback(work.discard)
        task = asyncio.create_task(publish(random.choice(churned), tick))
        work.add(task)
        task.add_done_callback(work.discard)
        # Paced: the next tick starts TICK after this one was due, not after it ended.
        await asyncio.sleep(max(0.0, began + tick * TICK - loop.time()))
    elapsed = loop.time() - began
    cpu = cpu_seconds(server.pid) - cpu_start[0], time.process_time() - cpu_start[1]
    if work:
        await asyncio.wait(work, timeout=2 * ANSWER_TIMEOUT)
    # Every subscriber must get every publication accepted: the last ones may be
    # on their way still (a publication answered after its publisher was churned
    # away is delivered too, but not counted).
    deadline = loop.time() + ANSWER_TIMEOUT
    while loop.time() < deadline and any(tally.published - s.notes for s in subscribers):
        await asyncio.sleep(TICK)
    missing = sum(len(tally.published - s.notes) for s in subscribers)
    if missing:
        tally.errors["topic messages not received"] = missing
    received = sum(len(tally.published & s.notes) for s in subscribers)
    rss_end = rss_kib(server.pid)
    await asyncio.gather(*(client.close() for client in [*subscribers, *churned]))
    return SoakResult(
        tally, connects, elapsed, rss_start, rss_end, len(subscribers), received, *cpu
    )


async def memory_table(args: argparse.Namespace, key: Path) -> None:
    """Phase 1 for raw websockets and each broker, interleaved over the repeats."""
    targets = [Server("raw", None, key), *(Server("broker", s, key) for s in args.server)]
    per_target: dict[str, list[float]] = {t.label: [] for t in targets}
    ratios: dict[str, list[float]] = {t.label: [] for t in targets if t.kind == "broker"}
    for repeat in range(args.repeats):
        order = targets[repeat % len(targets) :] + targets[: repeat % len(targets)]
        kib: dict[str, float] = {}
        for target in order:
            await target.start()
            try:
                kib[target.label] = await idle_memory(target, args.channels, args.rate)
            finally:
                await target.stop()
            per_target[target.label].append(kib[target.label])
        for label in ratios:
            ratios[label].append(kib[label] / kib["raw-websockets"])
    print("\nidle memory (KiB per connection; medians)")
    for label, samples in per_target.items():
        spread = f"{min(samples):.1f}-{max(samples):.1f}" if len(samples) > 1 else ""
        print(f"  {label:<20} {statistics.median(samples):>7.1f}  {spread}")
    for label, samples in ratios.items():
        ratio = statistics.median(samples)
        verdict = "met" if ratio <= 2.5 else "missed"
        print(f"  ratio {label} / raw-websockets: {ratio:.2f} (goal <= 2.5: {verdict})")


# -- main ------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    limit = raise_open_files()
    print(
        f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}, open files: {limit};"
        f" {args.channels:,} Channels, {args.rate:,} connects/s for {args.seconds:g} s,"
        f" {args.subscribers} topic subscribers"
    )
    _, public_pem = generate_agent_key()
    failed = False
    with tempfile.TemporaryDirectory(prefix="asbp-soak-") as tmp:
        key = Path(tmp) / "agent.pub.pem"
        key.write_text(public_pem)
        if "memory" in args.phases:
            await memory_table(args, key)
        for name in args.server if "soak" in args.phases else ():
            server = Server("broker", name, key)
            await server.start()
            try:
                result = await soak(
                    server, args.channels, args.rate, args.seconds, args.subscribers
                )
            finally:
                await server.stop()
            tally = result.tally
            errors = sum(tally.errors.values())
            failed = failed or errors > 0
            shakes = tally.handshakes
            print(
                f"\nsoak broker/{name}: {args.channels:,} Channels held for {result.seconds:.1f} s"
            )
            print(
                f"  connects {result.connects:,} ({result.connects / result.seconds:,.0f}/s of"
                f" {args.rate:,}/s asked), pings answered {tally.pings:,},"
                f" topic messages {len(tally.published):,} x {result.subscribers} subscribers"
                f" ({result.received:,} received)"
            )
            print(
                f"  handshake p50 {1000 * percentile(shakes, 0.5):.1f} ms,"
                f" p99 {1000 * percentile(shakes, 0.99):.1f} ms (n={len(shakes):,})"
            )
            print(
                f"  broker RSS {result.rss_start / 1024:,.0f} MiB at the start of the churn,"
                f" {result.rss_end / 1024:,.0f} MiB at its end"
            )
            print(
                f"  CPU during the churn: broker {result.broker_cpu:.1f} s"
                f" ({100 * result.broker_cpu / result.seconds:.0f}% of a core),"
                f" load generator {result.client_cpu:.1f} s"
                f" ({100 * result.client_cpu / result.seconds:.0f}%)"
            )
            print(f"  errors: {errors}" + (f" {tally.errors}" if errors else ""))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=1_000, help="connects per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--server", nargs="+", choices=["hypercorn", "uvicorn"], default=["hypercorn"]
    )
    parser.add_argument(
        "--phases", nargs="+", choices=["memory", "soak"], default=["memory", "soak"]
    )
    parser.add_argument("--quick", action="store_true", help="1,000 Channels, 200/s for 5 s")
    args = parser.parse_args()
    if args.quick:
        args.channels, args.rate, args.seconds, args.subscribers = 1_000, 200, 5.0, 20
    return asyncio.run(run(args))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""Queue throughput: publish -> deliver -> acknowledge on the Redis engine, against raw redis-py.

    python bench/queues.py [--messages N] [--repeats R] [--payload BYTES] [--aof] [--quick]
                           [--targets broker broker-memory engine]

Starts its own ``redis-server`` (tests.support.RedisServer) on a free port and
measures, in the same run, interleaved, ``--repeats`` times:

``broker``
    The whole path: a broker process (``python -m gateway --engine redis``,
    that is ``asbp broker``, on Uvicorn, ``prefetch`` 100) and two WebSocket User-Agents. The
    publisher keeps 100 ``asbp.publish`` (type QUEUE, with ``u``) outstanding,
    each answered by ``asbp.accepted`` once Redis has the message; the
    subscriber (``asbp.subscribe`` type QUEUE) acknowledges the receipts of
    its notifications with one ``asbp.ack`` per 50. The publisher's frames are
    the codec's own header with ``u`` spliced in (checked against
    ``asbp.encode`` once), so the load generator, which shares the 2 cores,
    spends its CPU on WebSocket I/O rather than on building Commands.
``broker-memory``
    The same on the ``memory`` engine (no Redis in the path): what the broker
    costs by itself. Its ratio to ``raw`` has no goal; it shows how much of
    the gap is the broker rather than the Redis engine.
``engine``
    ``RedisEngine`` in this process: a producer task keeps a window of 100
    ``enqueue`` calls outstanding (each awaited, as the broker's connections
    do; the engine merges them into script calls), while a consumer task loops
    ``fetch(count=100, wait=...)`` then ``ack`` of the receipts it got.
``raw``
    redis-py doing the same work with no engine: the producer pipelines 100
    XADD per round trip, the consumer reads with XREADGROUP COUNT 100 and
    acknowledges each batch with one XACK of its ids.

Messages per second is N over the time from the first publication to the
last acknowledgement. The ratios broker/raw and engine/raw are computed within
each repeat (same minute, same load), and their medians printed against the
goal, >= 0.30. The machine has 2 cores and other work, and the broker path
runs three busy processes on them (this one, the broker, Redis): trust the
medians and the ratios, not one run. For the broker targets, the broker
process's CPU time per message is printed too (``/proc/<pid>/task/*/schedstat``),
with the time it was ready to run but waiting for a core: when that is large,
the 2 cores, not the broker alone, set the rate.

The raw baseline does less than the engine by design: no priorities, no
leases with deadlines, no expiry check, no XDEL of acknowledged entries, no
message header (the payload alone). The ratio is the price of those (and,
for ``broker``, of WebSocket, the ASBP codec and the broker's routing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis.asyncio import Redis  # noqa: E402  # after the sys.path line above

from asbp import Command, decode, encode  # noqa: E402
from gateway.engines.base import EngineLimits, Message  # noqa: E402
from gateway.engines.redis import RedisEngine  # noqa: E402
from tests.support import RedisServer  # noqa: E402

BATCH = 100
ACK_BATCH = 50
PREFETCH = 100
GOAL = 0.30
START_TIMEOUT = 60.0

Run = Callable[[int, bytes], Awaitable[float]]
#: The targets the goal applies to (broker-memory is there for comparison).
GOAL_TARGETS = ("broker", "engine")


@dataclass(frozen=True)
class BrokerProcess:
    """A running broker: where it listens, and its process id (for its CPU time)."""

    url: str
    pid: int


def schedstat(pid: int) -> tuple[int, int] | None:
    """Nanoseconds ``pid`` spent on a CPU and waiting for one, or None without /proc."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        on_cpu = waiting = 0
        for task in tasks:
            with open(f"/proc/{pid}/task/{task}/schedstat") as file:
                fields = file.read().split()
            on_cpu += int(fields[0])
            waiting += int(fields[1])
    except OSError:
        return None
    return on_cpu, waiting


# -- through the broker --------------------------------------------------------


@contextlib.asynccontextmanager
async def broker_process(redis_url: str | None, directory: Path) -> AsyncIterator[BrokerProcess]:
    """A broker in its own process, on Redis (or ``memory`` if None)."""
    config = directory / "bench.toml"
    config.write_text(f"[messaging]\nprefetch = {PREFETCH}\nmax_queue_depth = 1000000000\n")
    engine = (
        ["--engine", "memory"]
        if redis_url is None
        else ["--engine", "redis", "--redis-url", redis_url]
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",  # python -m gateway: asbp broker
        "--config", str(config),
        *engine,
        "--host", "127.0.0.1",
        "--port", "0",
        "--server", "uvicorn",
        "--data-dir", str(directory / ("broker" if redis_url else "broker-memory")),
        "--log-format", "json",
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert process.stderr is not None
    stderr = process.stderr
    drain: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(START_TIMEOUT):
            while True:
                line = await stderr.readline()
                if not line:
                    raise RuntimeError("the broker exited before listening")
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:  # not a log record (a warning, a traceback)
                    sys.stderr.write(f"broker: {line.decode(errors='replace')}")
                    continue
                if event.get("event") == "listening":
                    url = str(event["url"]).replace("http://", "ws://", 1)
                    break

        async def drain_stderr() -> None:  # keep the pipe from filling up
            while await stderr.readline():
                pass

        drain = asyncio.create_task(drain_stderr())
        yield BrokerProcess(url, process.pid)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            await process.wait()
        if drain is not None:
            await drain


async def run_broker(url: str, messages: int, payload: bytes) -> float:
    """Messages per second through the broker, over two WebSockets."""
    queue = f"/queue/bench-{uuid.uuid4().hex[:8]}"
    async with (
        connect(f"{url}/asbp", compression=None, max_size=None) as producer,
        connect(f"{url}/asbp", compression=None, max_size=None) as consumer,
    ):
        for connection in (producer, consumer):  # the broker's greeting comes first
            greeting = decode(await recv(connection))
            assert greeting.name == "asbp.channel", greeting
        await consumer.send(
            encode(Command({"c": "asbp.subscribe", "destination": queue, "type": "QUEUE", "u": 1}))
        )
        subscribed = decode(await recv(consumer))
        assert subscribed.name == "asbp.accepted", subscribed

        # The publications differ only in ``u``: the frame is the codec's own header
        # with ``,u=<n>`` spliced in (checked once against encode), so the load
        # generator spends its CPU on the WebSocket rather than on re-encoding.
        publish = {"c": "asbp.publish", "destination": queue, "type": "QUEUE"}
        head = encode(Command(publish))[:-1]  # without the ";" that ends the header

        def frame(n: int) -> bytes:
            return b"%s,u=%d;%s" % (head, n % 65536, payload)

        assert decode(frame(70000)) == Command({**publish, "u": 70000 % 65536}, payload)

        async def produce() -> None:
            window = asyncio.Semaphore(BATCH)

            async def accepted() -> None:
                for _ in range(messages):
                    reply = decode(await recv(producer))
                    assert reply.name == "asbp.accepted", reply
                    window.release()

            replies = asyncio.create_task(accepted())
            for n in range(messages):
                await window.acquire()
                await producer.send(frame(n))
            await replies

        async def consume() -> None:
            delivered = acknowledged = 0
            receipts: list[str] = []
            while acknowledged < messages:
                command = decode(await recv(consumer))
                if command.name == "asbp.notification":
                    delivered += 1
                    receipts.append(str(command.get("receipt")))
                    if len(receipts) >= ACK_BATCH or delivered == messages:
                        ack = {"c": "asbp.ack", "destination": queue, "type": "QUEUE"}
                        await consumer.send(encode(Command({**ack, "receipt": receipts, "u": 2})))
                        receipts = []
                elif command.name == "asbp.accepted":
                    acknowledged += int(str(command.get("count")))
                else:
                    raise RuntimeError(f"unexpected {command!r}")

        started = time.perf_counter()
        await asyncio.gather(produce(), consume())
        return messages / (time.perf_counter() - started)


async def recv(connection: ClientConnection) -> bytes:
    frame = await connection.recv()
    return frame.encode() if isinstance(frame, str) else frame


# -- through the engine --------------------------------------------------------


async def run_engine(url: str, messages: int, payload: bytes) -> float:
    """Messages per second through RedisEngine."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    engine = RedisEngine(url, broker_id="bench", limits=EngineLimits(max_queue_depth=10**9))
    await engine.start()
    try:

        async def produce() -> None:
            now = time.time()
            for start in range(0, messages, BATCH):
                batch = [
                    Message(id=uuid.uuid4().hex, destination=queue, payload=payload, timestamp=now)
                    for _ in range(min(BATCH, messages - start))
                ]
                await asyncio.gather(*(engine.enqueue(message) for message in batch))

        async def consume() -> None:
            acknowledged = 0
            while acknowledged < messages:
                deliveries = await engine.fetch(queue, "bench", count=BATCH, wait=5.0)
                if not deliveries:
                    raise RuntimeError("the consumer starved: messages lost?")
                acknowledged += await engine.ack(queue, [d.receipt for d in deliveries])

        started = time.perf_counter()
        await asyncio.gather(produce(), consume())
        elapsed = time.perf_counter() - started
        if await engine.depth(queue):
            raise RuntimeError("messages left in the queue")
        return messages / elapsed
    finally:
        await engine.close()


# -- raw redis-py ----------------------------------------------------------------


async def run_raw(url: str, messages: int, payload: bytes) -> float:
    """Messages per second through redis-py alone: XADD, XREADGROUP, XACK."""
    stream = f"bench-raw-{uuid.uuid4().hex[:8]}"
    client = Redis.from_url(url)
    try:
        await client.xgroup_create(stream, "g", id="0", mkstream=True)

        async def produce() -> None:
            for start in range(0, messages, BATCH):
                async with client.pipeline(transaction=False) as pipe:
                    for _ in range(min(BATCH, messages - start)):
                        pipe.xadd(stream, {"p": payload})
                    await pipe.execute()

        async def consume() -> None:
            acknowledged = 0
            while acknowledged < messages:
                read: Any = await client.xreadgroup(
                    "g", "c", {stream: ">"}, count=BATCH, block=5000
                )
                if not read:
                    raise RuntimeError("the raw consumer starved")
                ids = [entry_id for entry_id, _ in read[0][1]]
                acknowledged += await client.xack(stream, "g", *ids)

        started = time.perf_counter()
        await asyncio.gather(produce(), consume())
        elapsed = time.perf_counter() - started
        await client.delete(stream)
        return messages / elapsed
    finally:
        await client.aclose()


# -- the run -----------------------------------------------------------------------


async def measure(
    args: argparse.Namespace, redis_url: str, directory: Path
) -> tuple[list[dict[str, float]], dict[str, list[tuple[float, float]]]]:
    """The rates of every repeat, and each broker's CPU per message (on it, waiting for it)."""
    payload = b"x" * args.payload
    cpu: dict[str, list[tuple[float, float]]] = {}

    def through(name: str, broker: BrokerProcess) -> Run:
        async def run(messages: int, payload: bytes) -> float:
            before = schedstat(broker.pid)
            rate = await run_broker(broker.url, messages, payload)
            after = schedstat(broker.pid)
            if before is not None and after is not None:
                cpu.setdefault(name, []).append(
                    (
                        (after[0] - before[0]) / 1e3 / messages,
                        (after[1] - before[1]) / 1e3 / messages,
                    )
                )
            return rate

        return run

    async with contextlib.AsyncExitStack() as stack:
        runs: dict[str, Run] = {}
        if "broker" in args.targets:
            broker = await stack.enter_async_context(broker_process(redis_url, directory))
            runs["broker"] = through("broker", broker)
        if "broker-memory" in args.targets:
            memory = await stack.enter_async_context(broker_process(None, directory))
            runs["broker-memory"] = through("broker-memory", memory)
        if "engine" in args.targets:
            runs["engine"] = lambda n, p: run_engine(redis_url, n, p)
        runs["raw"] = lambda n, p: run_raw(redis_url, n, p)
        for run in runs.values():  # warm up: connections, script cache, allocator
            await run(min(args.messages, 2000), payload)
        cpu.clear()
        samples: list[dict[str, float]] = []
        for repeat in range(args.repeats):
            order = list(runs)[repeat % len(runs) :] + list(runs)[: repeat % len(runs)]
            rates = {name: await runs[name](args.messages, payload) for name in order}
            samples.append(rates)
            print(
                f"  repeat {repeat + 1}: "
                + "   ".join(f"{name} {rates[name]:9,.0f} msg/s" for name in runs)
                + "".join(
                    f"   {name}/raw {rates[name] / rates['raw']:.2f}"
                    for name in runs
                    if name != "raw"
                ),
                flush=True,
            )
            for name, seen in cpu.items():
                on_cpu, waiting = seen[-1]
                print(
                    f"    {name} process: {on_cpu:.0f} us of CPU per message "
                    f"(and {waiting:.0f} us waiting for a core)",
                    flush=True,
                )
        return samples, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--aof", action="store_true", help="appendonly, appendfsync always")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 5,000: rough numbers")
    parser.add_argument(
        "--targets",
        nargs="+",
        choices=("broker", "broker-memory", "engine"),
        default=["broker", "engine"],
    )
    args = parser.parse_args()
    if args.quick:
        args.messages, args.repeats = 5_000, 1
    with (
        tempfile.TemporaryDirectory() as directory,
        RedisServer(Path(directory) / "redis", appendonly=args.aof) as server,
    ):
        print(
            f"{args.messages:,} messages of {args.payload} bytes, {args.repeats} repeats, "
            f"AOF {'on (fsync always)' if args.aof else 'off'}",
            flush=True,
        )
        samples, cpu = asyncio.run(measure(args, server.url, Path(directory)))
    names = list(samples[0])
    print(
        "median: "
        + ", ".join(f"{n} {statistics.median(s[n] for s in samples):,.0f} msg/s" for n in names)
    )
    for name, seen in cpu.items():
        on_cpu = statistics.median(c for c, _ in seen)
        waiting = statistics.median(w for _, w in seen)
        print(f"{name} process: median {on_cpu:.0f} us of CPU per message (+{waiting:.0f} waiting)")
    for name in names:
        if name == "raw":
            continue
        ratios = [sample[name] / sample["raw"] for sample in samples]
        ratio = statistics.median(ratios)
        verdict = ""
        if name in GOAL_TARGETS:
            verdict = f"; goal >= {GOAL:.2f}: {'met' if ratio >= GOAL else 'NOT met'}"
        print(
            f"ratio {name}/raw: median {ratio:.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"
            + verdict
        )


if __name__ == "__main__":
    main()

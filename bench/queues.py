"""Queue throughput: publish -> deliver -> acknowledge on the Redis engine, against raw redis-py.

    python bench/queues.py [--messages N] [--repeats R] [--payload BYTES] [--aof] [--quick]
                           [--targets broker broker-noresume broker-memory engine]

Starts its own ``redis-server`` (tests.support.RedisServer) on a free port and
measures, in the same run, interleaved, ``--repeats`` times:

``broker``
    The whole path: a broker process (``python -m gateway --engine redis``,
    that is ``asbp broker``, on Uvicorn, ``prefetch`` 100, its event log off:
    ``--event-log`` keeps it on, bench/eventlog.py measures it) and two
    WebSocket User-Agents. The publisher keeps 100 ``asbp.publish`` (type
    QUEUE, with ``u``) outstanding, each answered by ``asbp.accepted`` once
    Redis has the message; the subscriber (``asbp.subscribe`` type QUEUE)
    acknowledges the receipts of its notifications with one ``asbp.ack`` per
    50. The load generator shares the 2 cores with the broker and Redis, so it
    spends as little CPU per message as it can, as the raw baseline's does:
    its WebSocket client (:class:`BenchSocket`) handles every frame one read
    brought in one callback and writes what it sends in reply in one system
    call (what ``websockets`` does per message instead, a task wake-up and two
    system calls, cost about 30 µs of the 2 cores per message); the
    publisher's frames are the codec's own header with ``u`` spliced in
    (checked against ``asbp.encode`` once); the subscriber reads the receipt
    off the frame with a regular expression (checked against ``asbp.decode``
    once per run). The frames are the ones any client sends: one Command per
    WebSocket message, each masked.
``broker-noresume``
    The same with ``[channels] resume = "off"``. On the ``redis`` engine
    ``resume = "auto"`` turns resume on, so every frame the broker sends a
    WebSocket Channel is also appended to that Channel's log in Redis
    (gateway/plane/redis/log.py): each ``asbp.accepted``, one append per queued
    message that raw redis-py does not make. Queue deliveries are not logged:
    both sockets open ``/asbp?count=2``, as the SDK and the TypeScript client
    do (they do not count queue deliveries for a resume, so the queue is their
    log: docs/protocol.md, "Resuming a Channel"); a client that declares
    nothing gets them logged too, a second append per message. Its ratios to
    ``raw`` have no goal; beside ``broker`` they show Redis's share of the
    Channel log (issue 17, point 2).
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

Messages per second is N over the time from the first publication to the last
acknowledgement. The ratios broker/raw and engine/raw are computed within each
repeat (same minute, same load), and their medians printed against the goal,
>= 0.50 (issue 17; it was 0.30); so is redis-server's CPU per message on each
path over raw's, against the goal <= 2.0. The machine has 2 cores and other
work, and the broker path runs three busy processes on them (this one, the
broker, Redis): trust the medians and the ratios, not one run. For the broker
targets, the broker process's CPU time per message is printed too
(``/proc/<pid>/task/*/schedstat``), with the time it was ready to run but
waiting for a core (when that is large, the 2 cores, not the broker alone, set
the rate), and the load generator's (this process's) CPU time per message;
and, for every target, redis-server's CPU time per message (the scripts' share
of the 2 cores).

The raw baseline does less than the engine by design: no priorities, no
leases with deadlines, no expiry check, no XDEL of acknowledged entries, no
message header (the payload alone). The ratio is the price of those (and,
for ``broker``, of WebSocket, the ASBP codec and the broker's routing).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson
from websockets.speedups import apply_mask

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redis.asyncio import Redis  # noqa: E402  # after the sys.path line above

from asbp import Command, decode, encode  # noqa: E402
from gateway.engines.base import EngineLimits, Message  # noqa: E402
from gateway.engines.redis.engine import RedisEngine  # noqa: E402
from tests.support import RedisServer  # noqa: E402

BATCH = 100
ACK_BATCH = 50
PREFETCH = 100
#: broker/raw and engine/raw throughput (issue 17: >= 0.5; it was 0.30).
GOAL = 0.50
#: Redis's CPU per message on the broker's (and the engine's) path over raw's (issue 17).
REDIS_GOAL = 2.0
START_TIMEOUT = 60.0
#: Seconds a run of the broker target may take before it counts as failed.
RUN_TIMEOUT = 600.0

Run = Callable[[int, bytes], Awaitable[float]]
#: The targets the goal applies to (broker-noresume and broker-memory are there for comparison).
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


# -- a lean WebSocket client for the load generator ------------------------------


_WS_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_ACCEPTED: Final = b"c=asbp.accepted,"
_NOTIFICATION: Final = b"c=asbp.notification,"
_RECEIPT: Final = re.compile(rb",receipt=('[^']*'|[^,;]*)")
_COUNT: Final = re.compile(rb",count=(\d+)")


class BenchSocket(asyncio.Protocol):
    """A minimal WebSocket client (RFC 6455) that spends as little CPU as it can.

    The load generator shares the 2 cores with the broker and Redis, so every
    microsecond it spends per message is one the broker does not get. The
    ``websockets`` client costs about 30 µs per message here (a task wake-up
    per ``recv``, a system call per ``send`` and one more for its mask). This one
    hands every frame a read completed to ``on_frames`` in one call, and writes
    what a call of :meth:`send` is given in one system call: the same batching
    the raw baseline's pipelines get. The frames themselves are what any
    client sends: one ASBP Command per binary message, each masked with its
    own key (from a pool of random bytes).
    """

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._key = base64.b64encode(os.urandom(16))
        self._masks = b""
        self._open = False
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._inbox: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        #: Called with the frames each read completed, in order; None: queue them for recv().
        self.on_frames: Callable[[list[bytes]], None] | None = None

    @classmethod
    async def connect(cls, url: str) -> BenchSocket:
        """Open a WebSocket to ``ws://host:port/path``."""
        address, _, path = url.removeprefix("ws://").partition("/")
        host, _, port = address.rpartition(":")
        _, socket = await asyncio.get_running_loop().create_connection(cls, host, int(port))
        socket.handshake(address, "/" + path)
        async with asyncio.timeout(START_TIMEOUT):
            await socket.opened
        return socket

    def handshake(self, address: str, path: str) -> None:
        assert self._transport is not None
        self._transport.write(
            f"GET {path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {self._key.decode()}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.opened, self.closed):
            if not future.done():
                future.set_exception(ConnectionError("the broker closed the WebSocket"))
        self._wake()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if not self._open:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            response = bytes(buffer[:end])
            del buffer[: end + 4]
            expected = base64.b64encode(hashlib.sha1(self._key + _WS_GUID).digest())
            if not response.startswith(b"HTTP/1.1 101 ") or expected not in response:
                self.opened.set_exception(RuntimeError(f"handshake refused: {response!r}"))
                return
            self._open = True
            self.opened.set_result(None)
        frames: list[bytes] = []
        start, size = 0, len(buffer)
        while size - start >= 2:
            first, length = buffer[start], buffer[start + 1] & 0x7F
            head = 2
            if length == 126:
                if size - start < 4:
                    break
                length, head = int.from_bytes(buffer[start + 2 : start + 4], "big"), 4
            elif length == 127:
                if size - start < 10:
                    break
                length, head = int.from_bytes(buffer[start + 2 : start + 10], "big"), 10
            if size - start < head + length:
                break
            payload = bytes(buffer[start + head : start + head + length])
            start += head + length
            opcode = first & 0x0F
            if not first & 0x80:
                raise RuntimeError("the broker fragmented a message")
            if opcode in (1, 2):
                frames.append(payload)
            elif opcode == 9:  # ping
                self._write(10, payload)
            elif opcode == 8 and not self.closed.done():
                self.closed.set_result(None)
        del buffer[:start]
        if frames:
            if self.on_frames is not None:
                self.on_frames(frames)
            else:
                self._inbox.extend(frames)
                self._wake()

    def send(self, frames: list[bytes]) -> None:
        """Write ``frames``, each as one binary message, in one system call."""
        self._write(2, *frames)

    def _write(self, opcode: int, *payloads: bytes) -> None:
        if len(self._masks) < 4 * len(payloads):
            self._masks = os.urandom(4 * max(1024, len(payloads)))
        masks, out = self._masks, []
        for i, payload in enumerate(payloads):
            mask = masks[4 * i : 4 * i + 4]
            length = len(payload)
            if length < 126:
                out.append(bytes((0x80 | opcode, 0x80 | length)))
            elif length < 65536:
                out.append(bytes((0x80 | opcode, 0x80 | 126)) + length.to_bytes(2, "big"))
            else:
                out.append(bytes((0x80 | opcode, 0x80 | 127)) + length.to_bytes(8, "big"))
            out += (mask, apply_mask(payload, mask))
        self._masks = masks[4 * len(payloads) :]
        assert self._transport is not None
        self._transport.write(b"".join(out))

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def recv(self) -> bytes:
        """The next message (outside the timed part: one wake-up each)."""
        async with asyncio.timeout(START_TIMEOUT):
            while not self._inbox:
                if self.closed.done():
                    raise ConnectionError("the WebSocket closed")
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
        return self._inbox.popleft()

    async def close(self) -> None:
        """Close the WebSocket (code 1000) and wait for the broker's close."""
        if self._transport is None or self._transport.is_closing():
            return
        self._write(8, (1000).to_bytes(2, "big"))
        try:
            async with asyncio.timeout(START_TIMEOUT):
                await asyncio.wait([self.closed])
        finally:
            self._transport.close()


# -- through the broker --------------------------------------------------------


@contextlib.asynccontextmanager
async def broker_process(
    redis_url: str | None,
    directory: Path,
    *,
    event_log: bool = False,
    resume: bool = True,
    name: str = "",
) -> AsyncIterator[BrokerProcess]:
    """A broker in its own process, on Redis (or ``memory`` if None), event log on or off,
    Channel resume as configured by default (``auto``) or off."""
    name = name or ("broker" if redis_url else "broker-memory")
    config = directory / f"{name}.toml"
    config.write_text(
        f"[messaging]\nprefetch = {PREFETCH}\nmax_queue_depth = 1000000000\n"
        f'[event_log]\nmode = "{"on" if event_log else "off"}"\n'
        + ("" if resume else '[channels]\nresume = "off"\n')
    )
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
        "--data-dir", str(directory / name),
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
    # As the SDK and the TypeScript client open theirs (see the module docstring).
    producer = await BenchSocket.connect(f"{url}/asbp?count=2")
    consumer = await BenchSocket.connect(f"{url}/asbp?count=2")
    try:
        for connection in (producer, consumer):  # the broker's greeting comes first
            greeting = decode(await connection.recv())
            assert greeting.name == "asbp.channel", greeting
        subscribe = Command({"c": "asbp.subscribe", "destination": queue, "type": "QUEUE", "u": 1})
        consumer.send([encode(subscribe)])
        subscribed = decode(await consumer.recv())
        assert subscribed.name == "asbp.accepted", subscribed

        # The publications differ only in ``u``: the frame is the codec's own header
        # with ``,u=<n>`` spliced in (checked once against encode), so the load
        # generator spends its CPU on the WebSocket rather than on re-encoding.
        publish = {"c": "asbp.publish", "destination": queue, "type": "QUEUE"}
        head = encode(Command(publish))[:-1]  # without the ";" that ends the header

        def frame(n: int) -> bytes:
            return b"%s,u=%d;%s" % (head, n % 65536, payload)

        assert decode(frame(70000)) == Command({**publish, "u": 70000 % 65536}, payload)
        ack_head: dict[str, str | int | list[str]] = {
            "c": "asbp.ack",
            "destination": queue,
            "type": "QUEUE",
            "u": 2,
        }

        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        sent = delivered = acknowledged = 0
        receipts: list[bytes] = []
        checked = False

        def fail(reason: str) -> None:
            if not done.done():
                done.set_exception(RuntimeError(reason))

        def replies(frames: list[bytes]) -> None:
            # Keep BATCH publications outstanding: one more for each asbp.accepted.
            nonlocal sent
            for reply in frames:
                if not reply.startswith(_ACCEPTED):
                    fail(f"unexpected reply to a publication: {reply!r}")
                    return
            more = min(len(frames), messages - sent)
            if more:
                producer.send([frame(n) for n in range(sent, sent + more)])
                sent += more

        def deliveries(frames: list[bytes]) -> None:
            # Acknowledge every ACK_BATCH receipts in one asbp.ack, as a client would.
            nonlocal delivered, acknowledged, receipts, checked
            acks: list[bytes] = []
            for received in frames:
                if received.startswith(_NOTIFICATION):
                    found = _RECEIPT.search(received)
                    if found is None:
                        fail(f"a notification without a receipt: {received!r}")
                        return
                    receipt = found.group(1).strip(b"'")
                    if not checked:  # the cheap reading agrees with the codec's
                        assert decode(received).get("receipt") == receipt.decode()
                        checked = True
                    receipts.append(receipt)
                    delivered += 1
                    if len(receipts) >= ACK_BATCH or delivered == messages:
                        listed = [r.decode() for r in receipts]
                        acks.append(encode(Command({**ack_head, "receipt": listed})))
                        receipts = []
                elif received.startswith(_ACCEPTED):
                    count = _COUNT.search(received)
                    if count is None:
                        fail(f"an acceptance without a count: {received!r}")
                        return
                    acknowledged += int(count.group(1))
                else:
                    fail(f"unexpected {received!r}")
                    return
            if acks:
                consumer.send(acks)
            if acknowledged >= messages and not done.done():
                done.set_result(None)

        producer.on_frames = replies
        consumer.on_frames = deliveries
        started = time.perf_counter()
        sent = min(BATCH, messages)
        producer.send([frame(n) for n in range(sent)])
        async with asyncio.timeout(RUN_TIMEOUT):  # a lost message fails the run, never hangs it
            await done
        return messages / (time.perf_counter() - started)
    finally:
        await asyncio.gather(producer.close(), consumer.close())


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
    args: argparse.Namespace, redis_url: str, redis_pid: int, directory: Path
) -> tuple[
    list[dict[str, float]], dict[str, list[tuple[float, float, float]]], dict[str, list[float]]
]:
    """The rates of every repeat; CPU per message of each broker (on it, waiting for
    it) and of the load generator (this process); and Redis's CPU per message, per target."""
    payload = b"x" * args.payload
    cpu: dict[str, list[tuple[float, float, float]]] = {}
    redis_cpu: dict[str, list[float]] = {}

    def through(name: str, broker: BrokerProcess) -> Run:
        async def run(messages: int, payload: bytes) -> float:
            before, client = schedstat(broker.pid), time.process_time()
            rate = await run_broker(broker.url, messages, payload)
            after, client = schedstat(broker.pid), time.process_time() - client
            if before is not None and after is not None:
                cpu.setdefault(name, []).append(
                    (
                        (after[0] - before[0]) / 1e3 / messages,
                        (after[1] - before[1]) / 1e3 / messages,
                        client * 1e6 / messages,
                    )
                )
            return rate

        return run

    def watching_redis(name: str, run: Run) -> Run:
        async def watched(messages: int, payload: bytes) -> float:
            before = schedstat(redis_pid)
            rate = await run(messages, payload)
            after = schedstat(redis_pid)
            if before is not None and after is not None:
                redis_cpu.setdefault(name, []).append((after[0] - before[0]) / 1e3 / messages)
            return rate

        return watched

    async with contextlib.AsyncExitStack() as stack:
        runs: dict[str, Run] = {}
        if "broker" in args.targets:
            broker = await stack.enter_async_context(
                broker_process(redis_url, directory, event_log=args.event_log)
            )
            runs["broker"] = through("broker", broker)
        if "broker-noresume" in args.targets:
            noresume = await stack.enter_async_context(
                broker_process(
                    redis_url,
                    directory,
                    event_log=args.event_log,
                    resume=False,
                    name="broker-noresume",
                )
            )
            runs["broker-noresume"] = through("broker-noresume", noresume)
        if "broker-memory" in args.targets:
            memory = await stack.enter_async_context(
                broker_process(None, directory, event_log=args.event_log)
            )
            runs["broker-memory"] = through("broker-memory", memory)
        if "engine" in args.targets:
            runs["engine"] = lambda n, p: run_engine(redis_url, n, p)
        runs["raw"] = lambda n, p: run_raw(redis_url, n, p)
        runs = {name: watching_redis(name, run) for name, run in runs.items()}
        for run in runs.values():  # warm up: connections, script cache, allocator
            await run(min(args.messages, 2000), payload)
        cpu.clear()
        redis_cpu.clear()
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
                on_cpu, waiting, client = seen[-1]
                print(
                    f"    {name} process: {on_cpu:.0f} us of CPU per message "
                    f"(and {waiting:.0f} us waiting for a core); load generator {client:.0f} us",
                    flush=True,
                )
            if redis_cpu:
                print(
                    "    redis-server: "
                    + ", ".join(f"{name} {seen[-1]:.1f} us" for name, seen in redis_cpu.items())
                    + " of CPU per message",
                    flush=True,
                )
        return samples, cpu, redis_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--payload", type=int, default=100, help="payload bytes")
    parser.add_argument("--aof", action="store_true", help="appendonly, appendfsync always")
    parser.add_argument(
        "--event-log",
        action="store_true",
        help="keep the brokers' event log on (bench/eventlog.py)",
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat of 5,000: rough numbers")
    parser.add_argument(
        "--targets",
        nargs="+",
        choices=("broker", "broker-noresume", "broker-memory", "engine"),
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
        samples, cpu, redis_cpu = asyncio.run(
            measure(args, server.url, server.pid, Path(directory))
        )
    names = list(samples[0])
    print(
        "median: "
        + ", ".join(f"{n} {statistics.median(s[n] for s in samples):,.0f} msg/s" for n in names)
    )
    for name, seen in cpu.items():
        on_cpu = statistics.median(c for c, _, _ in seen)
        waiting = statistics.median(w for _, w, _ in seen)
        client = statistics.median(g for _, _, g in seen)
        print(
            f"{name} process: median {on_cpu:.0f} us of CPU per message (+{waiting:.0f} waiting); "
            f"load generator {client:.0f} us"
        )
    if redis_cpu:
        print(
            "redis-server: median "
            + ", ".join(f"{n} {statistics.median(per):.1f} us" for n, per in redis_cpu.items())
            + " of CPU per message"
        )
        raw_cpu = redis_cpu.get("raw", [])
        for name, per_message in redis_cpu.items():
            if name == "raw" or len(per_message) != len(raw_cpu):
                continue
            # Within each repeat, as the throughput ratios are: the same minute, the same load.
            ratios = [ours / raw for ours, raw in zip(per_message, raw_cpu, strict=True) if raw > 0]
            if not ratios:
                continue
            ratio = statistics.median(ratios)
            verdict = ""
            if name in GOAL_TARGETS:
                met = "met" if ratio <= REDIS_GOAL else "NOT met"
                verdict = f"; goal <= {REDIS_GOAL:.1f}: {met}"
            print(
                f"redis-server CPU per message, {name}/raw: median {ratio:.2f} "
                f"(range {min(ratios):.2f}-{max(ratios):.2f})" + verdict
            )
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

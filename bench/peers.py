"""The broker beside NATS and RabbitMQ, in one run: request/reply, durable queues, fan-out.

    python bench/peers.py [--quick] [--repeats N] [--cases rr queues fanout] [--install-only]

Each case runs our broker and its peers in the same run, interleaved (the
order rotated each repeat), ``--repeats`` times; tables show medians, and
each ratio is the median of the per-repeat ratios (same minute, same load).
The peers run with their stock settings on 127.0.0.1, on ports the kernel
picks, started here and stopped by PID (bench/_peer_servers.py); what is
missing is installed first (apt-get: ``nats-server``, ``rabbitmq-server``;
pip: ``nats-py``, ``aio-pika``). Clients are Python on both sides.

``rr``: request/reply
    A User-Agent's Command to an Application-Agent and its reply, through the
    broker (bench/roundtrip.py's servers, clients and measurement, on Uvicorn,
    which the default ``server = "auto"`` runs without TLS, and on Hypercorn,
    which it runs with TLS), against NATS core request/reply through
    ``nats-server`` (nats-py: one requester connection using ``request()``,
    one responder connection answering with ``msg.respond()``). Sequential
    p50/p99, then pipelined with the same window (100).
``queues``: durable queues
    Publish with confirmation, consume, acknowledge, prefetch/window 100:
    ours is bench/queues.py's broker path on the Redis engine with
    ``appendfsync always`` (``asbp.publish`` answered by ``asbp.accepted``,
    one ``asbp.ack`` per 50 receipts); RabbitMQ is a quorum queue, publisher
    confirms, aio-pika, ``basic.ack`` with ``multiple`` per 50; JetStream is a
    file-storage work-queue stream, nats-py ``js.publish`` (awaits the
    PubAck), a pull consumer (``fetch(100)``) acknowledging each message (a
    work-queue stream takes explicit acknowledgements only). Server CPU
    counts every server process: the broker and redis-server; the Erlang VM
    (beam.smp) and its children; nats-server.
``fanout``: one topic message to N subscribers (1,000)
    bench/fanout.py's broker targets and subscribers against NATS core: N
    connections with one subscription each on one subject, and a nats-py
    publisher. The NATS subscribers are as lean as fanout.py's WebSocket ones
    (:class:`NatsSubscriber`: the protocol's text lines parsed as they arrive,
    no task per message), so the server, not the client, is measured.

Throughput swings with whatever else runs on the machine; server CPU per
operation (from /proc, every thread) is the stable figure, and its ratio is
what the throughput ratio would be if the servers alone were the bottleneck.
The goals of issue 17 are printed as met/missed lines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
sys.path.insert(0, str(ROOT))  # gateway, agents, tests.support for the modules below
sys.path.insert(0, str(HERE))  # roundtrip, queues, fanout: this directory's benchmarks

import fanout  # noqa: E402
import queues  # noqa: E402
import roundtrip  # noqa: E402
from _peer_servers import (  # noqa: E402
    NatsServer,
    RabbitNode,
    install_peers,
    jetstream_available,
    versions,
)

from agents.credentials import generate_agent_key  # noqa: E402
from tests.support import RedisServer  # noqa: E402

SUBJECT: Final = "bench.echo"
FANOUT_SUBJECT: Final = "bench.fanout"
QUEUE_WINDOW: Final = queues.BATCH  # publications outstanding: 100, as queues.py
ACK_EVERY: Final = queues.ACK_BATCH  # one acknowledgement per 50 messages
PAYLOAD: Final = b"x" * 100
TIMEOUT: Final = 300.0


def median(values: list[float]) -> float:
    return float(statistics.median(values))


@dataclass
class Ratio:
    """A ratio and, if the issue sets one, its goal: ``>= goal`` or ``<= goal``."""

    name: str
    per_repeat: list[float]
    goal: tuple[str, float] | None = None
    #: Said after the verdict: what else the reader must know to judge it.
    note: str = ""

    @property
    def value(self) -> float:
        return median(self.per_repeat)

    def line(self) -> str:
        spread = (
            f"[{min(self.per_repeat):.2f}-{max(self.per_repeat):.2f}]"
            if len(self.per_repeat) > 1
            else ""
        )
        return f"  ratio {self.name:<66}{self.value:>6.2f} {spread}"

    def verdict(self) -> str | None:
        if self.goal is None:
            return None
        sense, bound = self.goal
        met = self.value >= bound if sense == ">=" else self.value <= bound
        verdict = "met" if met else "missed"
        note = f" ({self.note})" if self.note else ""
        return f"  goal {self.name} {sense} {bound:.1f}: {self.value:.2f}, {verdict}{note}"


def report(ratios: list[Ratio]) -> None:
    for ratio in ratios:
        print(ratio.line())
    verdicts = [v for v in (r.verdict() for r in ratios) if v]
    if verdicts:
        print()
        for verdict in verdicts:
            print(verdict)


async def windowed(count: int, window: int, operation: Callable[[int], Awaitable[None]]) -> None:
    """Run ``operation(0..count-1)`` with at most ``window`` of them outstanding."""
    slots = asyncio.Semaphore(window)
    errors: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int) -> None:
        try:
            await operation(n)
        except Exception as exc:  # raised below, once the others are done
            errors.append(exc)
        finally:
            slots.release()

    for n in range(count):
        await slots.acquire()
        if errors:
            break
        task = asyncio.create_task(one(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    if errors:
        raise errors[0]


# == request/reply ======================================================================

BROKER_UV: Final = roundtrip.Target("broker/uvicorn", "broker", "uvicorn")
BROKER_HC: Final = roundtrip.Target("broker/hypercorn", "broker", "hypercorn")
NATS_RR: Final = "nats-core"
#: Requests tried before NATS request/reply is measured, at most, until one is answered.
_READY_TRIES: Final = 20


async def nats_sequential(requester: Any, count: int) -> list[int]:
    latencies = []
    clock = time.perf_counter_ns
    for _ in range(count):
        began = clock()
        reply = await requester.request(SUBJECT, roundtrip.BODY, timeout=TIMEOUT)
        latencies.append(clock() - began)
        if reply.data != roundtrip.BODY:
            raise RuntimeError(f"unexpected NATS reply {reply.data!r:.200}")
    return latencies


async def nats_pipelined(requester: Any, count: int, window: int) -> float:
    async def request(_: int) -> None:
        reply = await requester.request(SUBJECT, roundtrip.BODY, timeout=TIMEOUT)
        if reply.data != roundtrip.BODY:
            raise RuntimeError(f"unexpected NATS reply {reply.data!r:.200}")

    began = time.perf_counter()
    await windowed(count, window, request)
    return time.perf_counter() - began


async def measure_nats_rr(server: NatsServer, args: argparse.Namespace) -> roundtrip.Sample:
    """roundtrip.measure's phases through nats-server: a responder and a requester."""
    import nats

    responder = await nats.connect(server.url)
    requester = await nats.connect(server.url)
    try:

        async def echo(msg: Any) -> None:
            await msg.respond(msg.data)

        await responder.subscribe(SUBJECT, cb=echo)
        await responder.flush()  # the subscription is in place before the first request
        async with asyncio.timeout(TIMEOUT):
            # Once in a full run on a loaded machine the first request still met "no
            # responders": ask until one is answered (a readiness probe, not timed).
            for _ in range(_READY_TRIES):
                try:
                    await requester.request(SUBJECT, roundtrip.BODY, timeout=TIMEOUT)
                    break
                except nats.errors.NoRespondersError:
                    await responder.flush()
            await nats_sequential(requester, args.warmup)
            await nats_pipelined(requester, args.warmup * 5, args.window)

            cpu0 = server.cpu_seconds()
            latencies = sorted(await nats_sequential(requester, args.trips))
            seq_cpu = server.cpu_seconds() - cpu0

            cpu0, client0 = server.cpu_seconds(), time.process_time()
            elapsed = await nats_pipelined(requester, args.requests, args.window)
            pipe_cpu = server.cpu_seconds() - cpu0
            client_cpu = time.process_time() - client0
    finally:
        await requester.close()
        await responder.close()
    return roundtrip.Sample(
        p50_us=roundtrip._percentile(latencies, 0.50) / 1000,
        p99_us=roundtrip._percentile(latencies, 0.99) / 1000,
        seq_server_cpu_us=seq_cpu / args.trips * 1e6,
        commands_per_s=args.requests / elapsed,
        pipe_server_cpu_us=pipe_cpu / args.requests * 1e6,
        pipe_client_cpu_us=client_cpu / args.requests * 1e6,
    )


async def request_reply(args: argparse.Namespace) -> None:
    print("\n== request/reply: broker (User-Agent -> Application-Agent) vs NATS core ==")
    print(
        f"sequential: {args.trips} after {args.warmup} warm-up; pipelined: {args.requests}, "
        f"window {args.window}; {len(roundtrip.BODY)}-byte bodies",
        flush=True,
    )
    private_pem, public_pem = generate_agent_key()
    labels = [BROKER_UV.label, BROKER_HC.label, NATS_RR]
    samples: dict[str, list[roundtrip.Sample]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="asbp-peers-") as tmp:
        key = Path(tmp) / "agent.pub.pem"
        key.write_text(public_pem)
        brokers = {
            t.label: (t, roundtrip.ServerProcess(t, agent_key=key)) for t in (BROKER_UV, BROKER_HC)
        }
        nats_server = NatsServer()
        try:
            await nats_server.start()
            for _, server in brokers.values():
                await server.start()
            for repeat in range(args.repeats):
                shift = repeat % len(labels)
                for label in labels[shift:] + labels[:shift]:
                    if label == NATS_RR:
                        sample = await measure_nats_rr(nats_server, args)
                    else:
                        target, server = brokers[label]
                        sample = await roundtrip.measure(target, server, private_pem, args)
                    samples[label].append(sample)
                    print(
                        f"  repeat {repeat + 1}/{args.repeats} {label:<18}"
                        f" p50 {sample.p50_us:6.0f} us  p99 {sample.p99_us:6.0f} us"
                        f"  {sample.commands_per_s:8,.0f} requests/s"
                        f"  srv {sample.pipe_server_cpu_us:5.1f} us",
                        flush=True,
                    )
        finally:
            for _, server in brokers.values():
                await server.stop()
            await nats_server.stop()

    print(f"\nMedians of {args.repeats} repeat(s); CPU in us per request (round trip).\n")
    header = (
        f"{'target':<20}{'p50 us':>9}{'p99 us':>9}{'srv CPU':>9}"
        f"{'requests/s':>12}{'srv CPU':>9}{'cli CPU':>9}"
    )
    print(f"{'':<20}{'--- sequential ---':^27}{'--- pipelined ---':^30}")
    print(header)
    print("-" * len(header))
    for label in labels:
        rows = samples[label]

        def med(name: str, rows: list[roundtrip.Sample] = rows) -> float:
            return median([float(getattr(r, name)) for r in rows])

        print(
            f"{label:<20}{med('p50_us'):>9.0f}{med('p99_us'):>9.0f}"
            f"{med('seq_server_cpu_us'):>9.1f}{med('commands_per_s'):>12,.0f}"
            f"{med('pipe_server_cpu_us'):>9.1f}{med('pipe_client_cpu_us'):>9.1f}"
        )

    def per_repeat(label: str, metric: str, *, inverse: bool = False) -> list[float]:
        ours, theirs = samples[label], samples[NATS_RR]
        values = [
            float(getattr(a, metric)) / float(getattr(b, metric))
            for a, b in zip(ours, theirs, strict=True)
        ]
        return [1 / v for v in values] if inverse else values

    ratios = []
    for label in (BROKER_UV.label, BROKER_HC.label):
        ratios += [
            Ratio(f"{label} / nats, requests/s", per_repeat(label, "commands_per_s"), (">=", 1.0)),
            Ratio(
                f"{label} / nats, server CPU per request",
                per_repeat(label, "pipe_server_cpu_us"),
                ("<=", 3.0),
            ),
            Ratio(
                f"{label} / nats, p50 (nats_p50 / ours)", per_repeat(label, "p50_us", inverse=True)
            ),
        ]
    print()
    report(ratios)


# == durable queues =====================================================================


@dataclass
class QueueSample:
    """One run of one target: messages/s, and CPU per message of each server process."""

    rate: float
    server_cpu_us: dict[str, float]
    client_cpu_us: float

    @property
    def total_cpu_us(self) -> float:
        return sum(self.server_cpu_us.values())


async def run_rabbit(url: str, messages: int, payload: bytes) -> float:
    """A quorum queue: confirmed publications (window 100), consumed with basic.ack."""
    import aio_pika

    name = f"bench-{uuid.uuid4().hex[:8]}"
    producer = await aio_pika.connect(url)
    consumer = await aio_pika.connect(url)
    try:
        publish_channel = await producer.channel(publisher_confirms=True)
        consume_channel = await consumer.channel()
        await consume_channel.set_qos(prefetch_count=QUEUE_WINDOW)
        queue = await consume_channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"}
        )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        received = 0

        async def on_message(message: Any) -> None:
            nonlocal received
            received += 1
            if received % ACK_EVERY == 0 or received == messages:
                await message.ack(multiple=True)
            if received == messages and not done.done():
                done.set_result(None)

        exchange = publish_channel.default_exchange

        async def publish(_: int) -> None:
            await exchange.publish(
                aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=name,
            )

        started = time.perf_counter()
        tag = await queue.consume(on_message, no_ack=False)
        async with asyncio.timeout(TIMEOUT):
            await windowed(messages, QUEUE_WINDOW, publish)
            await done
            # A passive declare answers after the channel has processed the last ack.
            await consume_channel.declare_queue(name, passive=True)
        elapsed = time.perf_counter() - started
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
        return messages / elapsed
    finally:
        await consumer.close()
        await producer.close()


async def run_jetstream(url: str, messages: int, payload: bytes) -> float:
    """A file-storage work queue: js.publish awaits each PubAck; a pull consumer acks each."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

    name = f"BENCH{uuid.uuid4().hex[:8]}"
    subject = f"bench.q.{name}"
    producer = await nats.connect(url)
    consumer = await nats.connect(url)
    try:
        js = producer.jetstream()
        await js.add_stream(
            name=name,
            subjects=[subject],
            storage=StorageType.FILE,
            retention=RetentionPolicy.WORK_QUEUE,
        )
        subscription = await consumer.jetstream().pull_subscribe(
            subject,
            durable="bench",
            stream=name,
            # A work-queue stream takes explicit acknowledgements only: one per message.
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
        )

        async def publish(_: int) -> None:
            await js.publish(subject, payload, stream=name)

        async def consume() -> None:
            received = 0
            while received < messages:
                batch = await subscription.fetch(QUEUE_WINDOW, timeout=TIMEOUT)
                for message in batch:
                    received += 1
                    if received == messages:
                        await message.ack_sync()  # the last: wait for the server's answer
                    else:
                        await message.ack()

        started = time.perf_counter()
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(windowed(messages, QUEUE_WINDOW, publish), consume())
        elapsed = time.perf_counter() - started
        await js.delete_stream(name)
        return messages / elapsed
    finally:
        await consumer.close()
        await producer.close()


QueueRun = Callable[[int, bytes], Awaitable[float]]


def watched(run: QueueRun, servers: dict[str, Callable[[], float]]) -> Callable[..., Any]:
    """``run`` with the CPU of every server process in ``servers`` measured around it."""

    async def measured(messages: int, payload: bytes) -> QueueSample:
        before = {name: cpu() for name, cpu in servers.items()}
        client = time.process_time()
        rate = await run(messages, payload)
        client = time.process_time() - client
        return QueueSample(
            rate,
            {name: (cpu() - before[name]) / messages * 1e6 for name, cpu in servers.items()},
            client / messages * 1e6,
        )

    return measured


async def durable_queues(args: argparse.Namespace) -> None:
    print("\n== durable queues: broker on Redis (appendfsync always) vs RabbitMQ vs JetStream ==")
    with_jetstream = jetstream_available()
    if not with_jetstream:
        print("this nats-server has no JetStream: measured against RabbitMQ only")
    print(
        f"{args.messages:,} messages of {len(PAYLOAD)} bytes; {QUEUE_WINDOW} publications "
        f"outstanding, prefetch {QUEUE_WINDOW}, one acknowledgement per {ACK_EVERY}",
        flush=True,
    )
    samples: dict[str, list[QueueSample]] = {}
    with tempfile.TemporaryDirectory(prefix="asbp-peers-") as tmp:
        directory = Path(tmp)
        rabbit = RabbitNode(directory / "rabbitmq")
        jetstream = NatsServer(jetstream_dir=directory / "jetstream")
        async with contextlib.AsyncExitStack() as stack:
            redis = stack.enter_context(RedisServer(directory / "redis", appendonly=True))
            broker = await stack.enter_async_context(queues.broker_process(redis.url, directory))
            await rabbit.start()
            stack.push_async_callback(rabbit.stop)
            runs: dict[str, Callable[..., Any]] = {
                "broker+redis": watched(
                    lambda n, p: queues.run_broker(broker.url, n, p),
                    {
                        "broker": lambda: _cpu(broker.pid),
                        "redis-server": lambda: _cpu(redis.pid),
                    },
                ),
                "rabbitmq-quorum": watched(
                    lambda n, p: run_rabbit(rabbit.url, n, p),
                    {"beam.smp+children": rabbit.cpu_seconds},
                ),
            }
            if with_jetstream:
                await jetstream.start()
                stack.push_async_callback(jetstream.stop)
                runs["jetstream-file"] = watched(
                    lambda n, p: run_jetstream(jetstream.url, n, p),
                    {"nats-server": jetstream.cpu_seconds},
                )
            for run in runs.values():  # warm up: connections, scripts, queues, JIT-less caches
                await run(min(args.messages, 1000), PAYLOAD)
            names = list(runs)
            samples = {name: [] for name in names}
            for repeat in range(args.repeats):
                shift = repeat % len(names)
                for name in names[shift:] + names[:shift]:
                    sample = await runs[name](args.messages, PAYLOAD)
                    samples[name].append(sample)
                    cpu = ", ".join(f"{k} {v:.1f}" for k, v in sample.server_cpu_us.items())
                    print(
                        f"  repeat {repeat + 1}/{args.repeats} {name:<16} {sample.rate:8,.0f} "
                        f"msg/s  server CPU {sample.total_cpu_us:6.1f} us/msg ({cpu})",
                        flush=True,
                    )

    print(f"\nMedians of {args.repeats} repeat(s); CPU in us per message.\n")
    header = f"{'target':<18}{'msg/s':>10}{'srv CPU':>9}{'cli CPU':>9}  server processes"
    print(header)
    print("-" * (len(header) + 30))
    for name, rows in samples.items():
        parts = ", ".join(
            f"{process} {median([r.server_cpu_us[process] for r in rows]):.1f}"
            for process in rows[0].server_cpu_us
        )
        print(
            f"{name:<18}{median([r.rate for r in rows]):>10,.0f}"
            f"{median([r.total_cpu_us for r in rows]):>9.1f}"
            f"{median([r.client_cpu_us for r in rows]):>9.1f}  {parts}"
        )

    def per_repeat(peer: str, metric: Callable[[QueueSample], float]) -> list[float]:
        return [
            metric(a) / metric(b)
            for a, b in zip(samples["broker+redis"], samples[peer], strict=True)
        ]

    ratios = []
    for peer in [p for p in samples if p != "broker+redis"]:
        # A peer whose Python client spends more CPU per message than its server is
        # measured by its client: the throughput ratio flatters us then.
        client = median([r.client_cpu_us for r in samples[peer]])
        server = median([r.total_cpu_us for r in samples[peer]])
        note = (
            f"{peer}'s Python client spent {client:.0f} us/msg, its server {server:.0f}: "
            "client-bound, read the CPU ratio"
            if client > server
            else ""
        )
        ratios.append(
            Ratio(f"broker+redis / {peer}, msg/s", per_repeat(peer, lambda s: s.rate),
                  (">=", 1.0), note)
        )  # fmt: skip
        goal = ("<=", 1.5) if peer == "jetstream-file" else None
        ratios.append(
            Ratio(
                f"broker+redis / {peer}, server CPU per message",
                per_repeat(peer, lambda s: s.total_cpu_us),
                goal,
            )
        )
    print()
    report(ratios)


def _cpu(pid: int) -> float:
    from _peer_servers import cpu_seconds

    return cpu_seconds([pid])


# == fan-out ============================================================================


class NatsSubscriber(asyncio.BufferedProtocol):
    """One NATS core subscriber that costs little per message, as fanout.Subscriber.

    It speaks the client protocol's text lines itself (CONNECT, SUB, PING and
    PONG; ``MSG <subject> <sid> <size>`` and the payload): it reads the
    sequence number off the end of each payload into the Tally as data
    arrives, with no task and no queue per message. nats-py would run a
    subscription task and a callback per message in each of 1,000 clients,
    and this process, not the server, would be the bottleneck.
    """

    def __init__(self, tally: fanout.Tally, buffer: memoryview) -> None:
        self._shared = buffer
        self._tally = tally
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        #: Resolved by the server's PONG to our first PING: after our SUB, in order.
        self.subscribed: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.counting = False
        self.unexpected: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(
            b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"name":"bench"}\r\n'
            b"SUB " + FANOUT_SUBJECT.encode() + b" 1\r\nPING\r\n"
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.subscribed.done():
            self.subscribed.set_exception(ConnectionError(f"connection lost ({exc})"))
        if not self.closed.done():
            self.closed.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._shared

    def buffer_updated(self, nbytes: int) -> None:
        data = self._shared[:nbytes].tobytes()
        if self._buffer:
            data, self._buffer = self._buffer + data, b""
        size, pos = len(data), 0
        while pos < size:
            end = data.find(b"\r\n", pos)
            if end < 0:
                break
            if data.startswith(b"MSG ", pos):
                length = int(data[data.rfind(b" ", pos, end) + 1 : end])
                stop = end + 2 + length
                if stop + 2 > size:
                    break
                if data[stop - fanout.SEQ_DIGITS - 1] == fanout.MARK and self.counting:
                    self._tally.hit(int(data[stop - fanout.SEQ_DIGITS : stop]))
                else:
                    self.unexpected.append(data[end + 2 : stop])
                pos = stop + 2
                continue
            line = data[pos:end]
            pos = end + 2
            if line == b"PING":
                assert self._transport is not None
                self._transport.write(b"PONG\r\n")
            elif line == b"PONG":
                if not self.subscribed.done():
                    self.subscribed.set_result(None)
            elif line.startswith(b"-ERR"):
                self.unexpected.append(line)
            # INFO and +OK need no answer.
        if pos < size:
            self._buffer = data[pos:]

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class NatsPublisher:
    """fanout.run_phase's publisher, through nats-py."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def publish(self, seq: int) -> None:
        await self.client.publish(FANOUT_SUBJECT, fanout.payload(seq))

    def check(self) -> None:
        pass  # nats-py reports errors by raising from publish()

    async def close(self) -> None:
        await self.client.close()


async def measure_nats_fanout(server: NatsServer, args: argparse.Namespace) -> fanout.Sample:
    """fanout.measure's phases through nats-server: N subscriptions over N connections."""
    import nats

    n = args.subscribers
    tally = fanout.Tally(n, args.warmup + args.rounds + args.messages)
    loop = asyncio.get_running_loop()
    buffer = memoryview(bytearray(fanout.RECEIVE_BUFFER))
    slots = asyncio.Semaphore(fanout.CONNECTING)
    subscribers: list[NatsSubscriber] = []

    async def connect_one() -> None:
        async with slots:
            _, subscriber = await loop.create_connection(
                lambda: NatsSubscriber(tally, buffer), fanout.HOST, server.port
            )
            subscribers.append(subscriber)
            await subscriber.subscribed

    try:
        async with asyncio.timeout(fanout.START_TIMEOUT), asyncio.TaskGroup() as group:
            for _ in range(n):
                group.create_task(connect_one())
        publisher = NatsPublisher(await nats.connect(server.url))
        gc.collect()
        gc.disable()  # as fanout.measure: no collection pauses while counting
        try:
            for subscriber in subscribers:
                subscriber.counting = True
            async with asyncio.timeout(fanout.PHASE_TIMEOUT):
                await fanout.run_phase(server, publisher, tally, 0, args.warmup, 1)
                first = args.warmup
                seq = await fanout.run_phase(server, publisher, tally, first, args.rounds, 1)
                first += args.rounds
                win = await fanout.run_phase(
                    server, publisher, tally, first, args.messages, args.window
                )
        finally:
            gc.enable()
            await publisher.close()
        unexpected = [u for s in subscribers for u in s.unexpected]
        if unexpected:
            raise RuntimeError(f"NATS subscribers got unexpected data: {unexpected[:3]!r}")
    finally:
        for subscriber in subscribers:
            subscriber.close()
        if subscribers:
            await asyncio.wait([s.closed for s in subscribers], timeout=fanout.CLOSE_TIMEOUT)
    deliveries = args.messages * n
    return fanout.Sample(
        seq_p50_ms=fanout._percentile(seq.latencies_ns, 0.50) / 1e6,
        seq_p99_ms=fanout._percentile(seq.latencies_ns, 0.99) / 1e6,
        seq_server_cpu_us=seq.server_cpu / (args.rounds * n) * 1e6,
        deliveries_per_s=deliveries / win.elapsed,
        server_cpu_us=win.server_cpu / deliveries * 1e6,
        client_cpu_us=win.client_cpu / deliveries * 1e6,
        server_busy=win.server_cpu / win.elapsed,
        server_wait=0.0,
        client_busy=win.client_cpu / win.elapsed,
        win_p50_ms=fanout._percentile(win.latencies_ns, 0.50) / 1e6,
    )


FANOUT_UV: Final = fanout.Target("broker/uvicorn", "broker", "uvicorn")
FANOUT_HC: Final = fanout.Target("broker/hypercorn", "broker", "hypercorn")
NATS_FANOUT: Final = "nats-core"


async def fan_out(options: argparse.Namespace) -> None:
    # bench/fanout.py's own phases (its defaults, or --quick's), not request/reply's.
    quick = options.quick
    args = argparse.Namespace(
        repeats=options.repeats,
        subscribers=options.subscribers,
        warmup=5 if quick else 10,
        rounds=20 if quick else 100,
        messages=40 if quick else 200,
        window=4,
    )
    print(f"\n== fan-out: one topic message to {args.subscribers} subscribers vs NATS core ==")
    print(
        f"{args.warmup} warm-up messages, {args.rounds} sequential, {args.messages} with window "
        f"{args.window}; {fanout.PAYLOAD_BYTES}-byte payloads",
        flush=True,
    )
    fanout.raise_file_limit(args.subscribers)
    labels = [FANOUT_UV.label, FANOUT_HC.label, NATS_FANOUT]
    samples: dict[str, list[fanout.Sample]] = {label: [] for label in labels}
    brokers = {t.label: (t, fanout.ServerProcess(t)) for t in (FANOUT_UV, FANOUT_HC)}
    nats_server = NatsServer()
    try:
        await nats_server.start()
        for _, server in brokers.values():
            await server.start()
        for repeat in range(args.repeats):
            shift = repeat % len(labels)
            for label in labels[shift:] + labels[:shift]:
                if label == NATS_FANOUT:
                    sample = await measure_nats_fanout(nats_server, args)
                else:
                    target, server = brokers[label]
                    sample = await fanout.measure(target, server, args)
                samples[label].append(sample)
                print(
                    f"  repeat {repeat + 1}/{args.repeats} {label:<18}"
                    f" {sample.deliveries_per_s:9,.0f} deliveries/s"
                    f"  srv {sample.server_cpu_us:5.2f} us  cli {sample.client_cpu_us:5.2f} us"
                    f"  last p50 {sample.seq_p50_ms:6.1f} ms",
                    flush=True,
                )
    finally:
        for _, server in brokers.values():
            await server.stop()
        await nats_server.stop()

    print(f"\nMedians of {args.repeats} repeat(s); CPU in us per delivery.\n")
    header = (
        f"{'target':<20}{'last p50 ms':>12}{'p99 ms':>8}{'deliveries/s':>14}"
        f"{'srv CPU':>9}{'cli CPU':>9}"
    )
    print(header)
    print("-" * len(header))
    for label in labels:
        rows = samples[label]

        def med(name: str, rows: list[fanout.Sample] = rows) -> float:
            return median([float(getattr(r, name)) for r in rows])

        print(
            f"{label:<20}{med('seq_p50_ms'):>12.1f}{med('seq_p99_ms'):>8.1f}"
            f"{med('deliveries_per_s'):>14,.0f}{med('server_cpu_us'):>9.2f}"
            f"{med('client_cpu_us'):>9.2f}"
        )

    def per_repeat(label: str, metric: str) -> list[float]:
        return [
            float(getattr(a, metric)) / float(getattr(b, metric))
            for a, b in zip(samples[label], samples[NATS_FANOUT], strict=True)
        ]

    ratios = []
    for label in (FANOUT_UV.label, FANOUT_HC.label):
        ratios += [
            Ratio(f"{label} / nats, deliveries/s", per_repeat(label, "deliveries_per_s")),
            Ratio(f"{label} / nats, server CPU per delivery", per_repeat(label, "server_cpu_us")),
        ]
    print()
    report(ratios)


# == main ===============================================================================

CASES: Final = {"rr": request_reply, "queues": durable_queues, "fanout": fan_out}


async def run(args: argparse.Namespace) -> None:
    for case in args.cases:
        await CASES[case](args)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred operations per case")
    parser.add_argument("--repeats", type=int, help="interleaved repeats (3; 1 with --quick)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument(
        "--install-only", action="store_true", help="install the peers if missing, then stop"
    )
    # request/reply, as bench/roundtrip.py
    parser.add_argument("--trips", type=int, default=2000, help="sequential requests (2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests (200)")
    parser.add_argument("--requests", type=int, default=20000, help="pipelined requests (20000)")
    parser.add_argument("--window", type=int, default=100, help="requests outstanding (100)")
    # durable queues
    parser.add_argument("--messages", type=int, default=20000, help="queued messages (20000)")
    # fan-out, as bench/fanout.py
    parser.add_argument("--subscribers", type=int, default=1000, help="connections (1000)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.quick:
        args.trips, args.warmup, args.requests, args.messages = 200, 50, 500, 300
        args.subscribers = min(args.subscribers, 200)
    install_peers()
    if args.install_only:
        return
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    asyncio.run(run(args), debug=False)


if __name__ == "__main__":
    main()

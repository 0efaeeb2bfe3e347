"""One topic message to 1,000 WebSocket subscribers: the broker, raw broadcast, python-socketio.

    python bench/fanout.py [--quick] [--repeats N] [--subscribers N] [--targets T ...]
                           [--profile uvicorn|hypercorn|both|TARGET ...]

Each target is a server in its own process (bench/_fanout_servers.py), all
measured in one run, interleaved, ``--repeats`` times; the table shows medians:

=========================  ===================================================
broker/hypercorn           the real broker, memory engine: ``asbp.subscribe``
                           and ``asbp.publish`` on one topic
broker/uvicorn             the same on Uvicorn (ws="websockets-sansio")
raw-broadcast              plain ``websockets``: ``websockets.broadcast()`` to
                           every subscriber, synchronously
await-loop/hypercorn       Starlette: ``await websocket.send_bytes()`` to one
                           subscriber after the other
await-loop/uvicorn         the same on Uvicorn
socketio/hypercorn         ``socketio.AsyncServer(async_mode="asgi")``,
                           ``emit()`` to a room of every subscriber
socketio/uvicorn           the same on Uvicorn
=========================  ===================================================

This process holds the ``--subscribers`` connections (1,000) and one
publisher. Subscribers are a minimal WebSocket client (the handshake, frame
headers, pongs; no per-message task), so that the server, not this process,
is the bottleneck; the publisher is a ``websockets`` client. Each message
carries a 100-byte payload ending in ``#<8-digit sequence number>``, which
every subscriber reads back from the end of the frame it gets (the broker
wraps it in an ``asbp.notification``, python-socketio in an Engine.IO
``42["m","…"]``), and counts. A message is delivered when the last
subscriber has it.

Per target and repeat, after ``--warmup`` messages:

* sequential: ``--rounds`` messages, each published once the previous one
  reached every subscriber: the time from publishing to the last delivery
  (p50, p99), and server CPU per delivery;
* windowed: ``--messages`` messages with up to ``--window`` not yet delivered
  to everyone: deliveries per second, server and client CPU per delivery.

Server CPU comes from /proc/<pid>/task/*/schedstat (all threads), client CPU
from this process's ``time.process_time()``; the table also shows the shares
of the windowed phase the server spent on a CPU and waiting for one (another
process had it), and this process on a CPU: which side was the bottleneck.

Ratios are computed within each repeat and their medians printed, against the
goals: broker/hypercorn at least 2.5x python-socketio, broker/uvicorn at least
0.60x raw broadcast, in deliveries per second.

``--profile`` then runs a broker alone under py-spy during windowed fan-out
and summarises where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import hashlib
import importlib.util
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final, Protocol

from websockets.asyncio.client import ClientConnection, connect

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "_fanout_servers.py"
HOST: Final = "127.0.0.1"
TOPIC: Final = "/bench/fanout"
PAYLOAD_BYTES: Final = 100
#: Payloads end in MARK and 8 digits: the sequence number, read from the end of a frame.
MARK: Final = 0x23  # "#"
SEQ_DIGITS: Final = 8
FILLER: Final = b"x" * (PAYLOAD_BYTES - 1 - SEQ_DIGITS)
START_TIMEOUT: Final = 60.0
PHASE_TIMEOUT: Final = 300.0
CLOSE_TIMEOUT: Final = 10.0
#: Bytes one read of a subscriber's socket takes at most.
RECEIVE_BUFFER: Final = 64 * 1024
#: Subscribers connecting at once (Hypercorn listens with a backlog of 100).
CONNECTING: Final = 50
HAVE_SCHEDSTAT: Final = os.path.exists("/proc/self/schedstat")
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
WS_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


@dataclass(frozen=True)
class Target:
    label: str
    kind: str  # broker | raw | loop | socketio
    server: str | None  # hypercorn | uvicorn | None (raw)


TARGETS: Final = (
    Target("broker/hypercorn", "broker", "hypercorn"),
    Target("broker/uvicorn", "broker", "uvicorn"),
    Target("raw-broadcast", "raw", None),
    Target("await-loop/hypercorn", "loop", "hypercorn"),
    Target("await-loop/uvicorn", "loop", "uvicorn"),
    Target("socketio/hypercorn", "socketio", "hypercorn"),
    Target("socketio/uvicorn", "socketio", "uvicorn"),
)


def payload(seq: int) -> bytes:
    """The 100 bytes published as message ``seq``."""
    return b"%s#%08d" % (FILLER, seq)


# -- the server process --------------------------------------------------------


class ServerProcess:
    """A bench/_fanout_servers.py subprocess; stopped by closing its stdin."""

    def __init__(self, target: Target):
        self.target = target
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self) -> None:
        args = [sys.executable, str(SERVERS), self.target.kind]
        if self.target.server is not None:
            args += ["--server", self.target.server]
        self.proc = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT)
        if not line.startswith(b"READY "):
            await self.stop()
            raise RuntimeError(f"{self.target.label}: server did not start ({line!r})")
        self.port = int(line.split()[1])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """CPU time of the server process so far, all threads (as in roundtrip.py)."""
        return self.schedstat()[0]

    def schedstat(self) -> tuple[float, float]:
        """Seconds on a CPU and seconds runnable but waiting for one, all threads.

        /proc/<pid>/task/*/schedstat counts both in nanoseconds; the wait tells
        a server that was the bottleneck but shared its core from an idle one.
        Without schedstat: utime + stime in clock ticks, and no wait.
        """
        if HAVE_SCHEDSTAT:
            on_cpu = waiting = 0
            for task in os.listdir(f"/proc/{self.pid}/task"):
                path = f"/proc/{self.pid}/task/{task}/schedstat"
                with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                    fields = f.read().split()  # a thread may just have ended
                    on_cpu += int(fields[0])
                    waiting += int(fields[1])
            return on_cpu / 1e9, waiting / 1e9
        with open(f"/proc/{self.pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK, 0.0

    async def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


# -- counting deliveries -----------------------------------------------------------


class Tally:
    """How many subscribers have each message, and when the last one got it."""

    __slots__ = ("_waiters", "counts", "delivered", "need", "sent", "unexpected")

    def __init__(self, subscribers: int, messages: int) -> None:
        self.need = subscribers
        self.counts = [0] * messages
        #: perf_counter_ns() when each message was published, and when its last
        #: subscriber had it.
        self.sent = [0] * messages
        self.delivered = [0] * messages
        self.unexpected: list[bytes] = []
        self._waiters: dict[int, asyncio.Future[None]] = {}

    def hit(self, seq: int) -> None:
        count = self.counts[seq] + 1
        self.counts[seq] = count
        if count == self.need:
            self.delivered[seq] = time.perf_counter_ns()
            waiter = self._waiters.pop(seq, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def wait(self, seq: int) -> None:
        """Until every subscriber has message ``seq``."""
        if self.counts[seq] < self.need:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters[seq] = waiter
            try:
                await waiter
            finally:
                self._waiters.pop(seq, None)


# -- subscribers: a minimal WebSocket client ----------------------------------------


def client_frame(opcode: int, data: bytes) -> bytes:
    """A masked, unfragmented client frame (RFC 6455 section 5.2)."""
    mask = os.urandom(4)
    size = len(data)
    if size < 126:
        head = bytes([0x80 | opcode, 0x80 | size])
    elif size < 65536:
        head = bytes([0x80 | opcode, 0xFE]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0xFF]) + size.to_bytes(8, "big")
    return head + mask + bytes(b ^ mask[i & 3] for i, b in enumerate(data))


class Subscriber(asyncio.BufferedProtocol):
    """One subscriber: a WebSocket client that costs little per message.

    A ``websockets`` client runs a frame parser, a queue and a task wake-up
    per message received; a thousand of them would make this process, not the
    server, the bottleneck. This one parses frame headers as data arrives,
    answers pings, and while ``counting`` reads the sequence number off the
    end of each data frame into the Tally: no task, no queue. Before that (the
    handshake, subscribing) frames go to ``recv()``.

    It reads into ``buffer``, which all subscribers share (asyncio fills it
    and calls back at once, one connection at a time): a plain Protocol gets a
    new bytes object from each ``recv(256 KiB)``, which glibc serves with an
    mmap, a page fault and a munmap until something raises its mmap threshold.
    That tripled this process's CPU per delivery in the first measurement.
    """

    def __init__(
        self, path: str, tally: Tally, tail: int, engineio: bool, buffer: memoryview
    ) -> None:
        self._shared = buffer
        self._path = path
        self._tally = tally
        #: Bytes that follow the sequence number in a delivered frame.
        self._tail = tail
        #: Answer Engine.IO pings ("2") with pongs ("3").
        self._engineio = engineio
        self._key = base64.b64encode(os.urandom(16))
        self._upgraded = False
        self._buffer = b""
        self._inbox: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.counting = False
        self._closing = False

    # asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        host, port = transport.get_extra_info("peername")[:2]
        transport.write(
            b"GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (self._path.encode(), host.encode(), port, self._key)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        error = ConnectionError(f"connection lost ({exc})")
        if not self.opened.done():
            self.opened.set_exception(error)
        if not self.closed.done():
            self.closed.set_result(None)
        self._wake(error)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._shared

    def buffer_updated(self, nbytes: int) -> None:
        self._received(self._shared[:nbytes].tobytes())

    def _received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        if not self._upgraded:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._buffer = data
                return
            self._handshake(data[:end])
            data = data[end + 4 :]
        size = len(data)
        pos = 0
        while size - pos >= 2:
            # Server frames are not masked: 2 bytes, then 2 or 8 more for long ones.
            length = data[pos + 1] & 0x7F
            start = pos + 2
            if length >= 126:
                start = pos + (4 if length == 126 else 10)
                if start > size:
                    break
                length = int.from_bytes(data[pos + 2 : start], "big")
            end = start + length
            if end > size:
                break
            opcode = data[pos] & 0x0F
            tail = self._tail
            if (
                self.counting
                and opcode <= 2
                and length > SEQ_DIGITS + tail
                and data[end - tail - SEQ_DIGITS - 1] == MARK
            ):
                self._tally.hit(int(data[end - tail - SEQ_DIGITS : end - tail]))
            else:
                self._control(opcode, data[start:end])
            pos = end
        if pos < size:
            self._buffer = data[pos:]

    # the rest

    def _handshake(self, head: bytes) -> None:
        status, *lines = head.split(b"\r\n")
        accept = base64.b64encode(hashlib.sha1(self._key + WS_GUID).digest())
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines)}
        if not status.startswith(b"HTTP/1.1 101") or headers.get(b"sec-websocket-accept") != accept:
            error = ConnectionError(f"handshake refused: {head[:300]!r}")
            self.opened.set_exception(error)
            assert self._transport is not None
            self._transport.abort()
            return
        self._upgraded = True
        self.opened.set_result(None)

    def _control(self, opcode: int, data: bytes) -> None:
        transport = self._transport
        assert transport is not None
        if opcode == 0x9:  # ping
            transport.write(client_frame(0xA, data))
        elif opcode == 0x8:  # close: the server closes the TCP connection next
            if not self._closing:
                self.close()
        elif opcode == 0xA:  # pong
            pass
        elif self._engineio and data == b"2":
            transport.write(client_frame(0x1, b"3"))
        elif self.counting:
            self._tally.unexpected.append(data)
        else:
            self._inbox.append(data)
            self._wake(None)

    def _wake(self, error: Exception | None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    async def recv(self) -> bytes:
        """The next data frame (before counting starts)."""
        while not self._inbox:
            if self.closed.done():
                raise ConnectionError("connection closed")
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._inbox.popleft()

    def send(self, data: bytes, *, text: bool = False) -> None:
        assert self._transport is not None
        self._transport.write(client_frame(0x1 if text else 0x2, data))

    def close(self) -> None:
        """Start the closing handshake (code 1000).

        ``closed`` resolves when the server has closed the TCP connection (RFC
        6455 section 7.1.1: the server closes it first), so a server is done
        with its subscribers before the next target's measurement starts.
        """
        if self._transport is not None and not self._closing:
            self._closing = True
            self._transport.write(client_frame(0x8, (1000).to_bytes(2, "big")))

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


# -- what each kind of server speaks ---------------------------------------------------


class Publisher:
    """Publishes message ``seq``; answers the server in the background."""

    def __init__(
        self,
        websocket: ClientConnection,
        publish: Callable[[int], Awaitable[None]],
        answer: Callable[[str | bytes], Awaitable[None]],
    ) -> None:
        self.websocket = websocket
        self.publish = publish
        self._answer = answer
        self.error: Exception | None = None
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for message in self.websocket:
                await self._answer(message)
        except Exception as exc:  # reported by check(): the benchmark stops there
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"publisher: {self.error}") from self.error

    async def close(self) -> None:
        await self.websocket.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@dataclass(frozen=True)
class Dialect:
    """How a kind of server is subscribed to and published to."""

    sub_path: str
    pub_path: str
    #: Bytes after the sequence number in a delivered frame.
    tail: int
    engineio: bool
    subscribe: Callable[[Subscriber], Awaitable[None]]
    publisher: Callable[[str], Awaitable[Publisher]]


async def _open(url: str) -> ClientConnection:
    return await connect(url, compression=None, max_queue=None, open_timeout=30)


async def _expect(subscriber: Subscriber, prefix: bytes) -> bytes:
    frame = await subscriber.recv()
    if not frame.startswith(prefix):
        raise RuntimeError(f"expected {prefix!r}, got {frame[:200]!r}")
    return frame


async def _subscribe_broker(subscriber: Subscriber) -> None:
    await _expect(subscriber, b"c=asbp.channel,")
    subscriber.send(b"c=asbp.subscribe,destination=%s,u=1;" % TOPIC.encode())
    await _expect(subscriber, b"c=asbp.accepted,")


async def _publisher_broker(url: str) -> Publisher:
    websocket = await _open(url)
    greeting = await websocket.recv()
    if isinstance(greeting, str):  # the broker greets in text when it is UTF-8
        greeting = greeting.encode()
    if not (isinstance(greeting, bytes) and greeting.startswith(b"c=asbp.channel,")):
        raise RuntimeError(f"unexpected Channel greeting {greeting!r}")
    head = b"c=asbp.publish,destination=%s,u=" % TOPIC.encode()

    async def publish(seq: int) -> None:
        await websocket.send(b"%s%d;%s" % (head, seq % 1_000_000, payload(seq)))

    async def answer(message: str | bytes) -> None:
        if not (isinstance(message, bytes) and message.startswith(b"c=asbp.accepted,")):
            raise RuntimeError(f"publishing failed: {message!r:.300}")

    return Publisher(websocket, publish, answer)


async def _subscribe_plain(subscriber: Subscriber) -> None:
    await _expect(subscriber, b"ok")


async def _publisher_plain(url: str) -> Publisher:
    websocket = await _open(url)

    async def publish(seq: int) -> None:
        await websocket.send(payload(seq))

    async def answer(message: str | bytes) -> None:
        raise RuntimeError(f"unexpected message {message!r:.300}")

    return Publisher(websocket, publish, answer)


async def _subscribe_socketio(subscriber: Subscriber) -> None:
    await _expect(subscriber, b"0{")  # Engine.IO OPEN
    subscriber.send(b'40{"role":"sub"}', text=True)  # Socket.IO CONNECT, with auth
    await _expect(subscriber, b"40")  # in the room once this arrives


async def _publisher_socketio(url: str) -> Publisher:
    websocket = await _open(url)
    opened = await websocket.recv()
    if not (isinstance(opened, str) and opened.startswith("0{")):
        raise RuntimeError(f"unexpected Engine.IO greeting {opened!r}")
    await websocket.send("40")
    connected = await websocket.recv()
    if not (isinstance(connected, str) and connected.startswith("40")):
        raise RuntimeError(f"Socket.IO connect failed: {connected!r}")

    async def publish(seq: int) -> None:
        await websocket.send(f'42["pub","{payload(seq).decode()}"]')

    async def answer(message: str | bytes) -> None:
        if message == "2":
            await websocket.send("3")
        else:
            raise RuntimeError(f"unexpected message {message!r:.300}")

    return Publisher(websocket, publish, answer)


ENGINEIO_PATH: Final = "/socket.io/?EIO=4&transport=websocket"
DIALECTS: Final = {
    "broker": Dialect("/asbp", "/asbp", 0, False, _subscribe_broker, _publisher_broker),
    "raw": Dialect("/sub", "/pub", 0, False, _subscribe_plain, _publisher_plain),
    "loop": Dialect("/sub", "/pub", 0, False, _subscribe_plain, _publisher_plain),
    # A delivery is 42["m","<payload>"]: two bytes after the sequence number.
    "socketio": Dialect(
        ENGINEIO_PATH, ENGINEIO_PATH, 2, True, _subscribe_socketio, _publisher_socketio
    ),
}


# -- a measurement ---------------------------------------------------------------------


@dataclass
class Sample:
    """One target, one repeat. Latencies are until the last subscriber has a message."""

    seq_p50_ms: float
    seq_p99_ms: float
    seq_server_cpu_us: float
    deliveries_per_s: float
    server_cpu_us: float
    client_cpu_us: float
    #: Shares of the windowed phase the server spent on a CPU and runnable but
    #: waiting for one (other processes had it), and this process on a CPU.
    server_busy: float
    server_wait: float
    client_busy: float
    win_p50_ms: float


@dataclass
class Phase:
    elapsed: float
    server_cpu: float
    server_wait: float
    client_cpu: float
    latencies_ns: list[int] = field(default_factory=list)


async def connect_subscribers(
    server: ServerProcess, dialect: Dialect, tally: Tally, count: int
) -> list[Subscriber]:
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(CONNECTING)
    subscribers: list[Subscriber] = []
    buffer = memoryview(bytearray(RECEIVE_BUFFER))

    async def one() -> None:
        async with slots:
            _, subscriber = await loop.create_connection(
                lambda: Subscriber(dialect.sub_path, tally, dialect.tail, dialect.engineio, buffer),
                HOST,
                server.port,
            )
            subscribers.append(subscriber)
            await subscriber.opened
            await dialect.subscribe(subscriber)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(count):
                group.create_task(one())
    except BaseException:
        for subscriber in subscribers:
            subscriber.abort()
        raise
    return subscribers


async def close_subscribers(subscribers: list[Subscriber]) -> None:
    """Close every subscriber and wait until the server has let go of each."""
    for subscriber in subscribers:
        subscriber.close()
    pending = [s.closed for s in subscribers]
    _, late = await asyncio.wait(pending, timeout=CLOSE_TIMEOUT)
    if late:
        print(f"  {len(late)} subscriber(s) not closed by the server; aborted", file=sys.stderr)
        for subscriber in subscribers:
            subscriber.abort()


class Measured(Protocol):
    """A server whose CPU a phase measures (ours, or a peer's: bench/peers.py)."""

    def schedstat(self) -> tuple[float, float]:
        """Seconds on the CPU and waiting for it, so far."""
        ...


class Publishing(Protocol):
    """What a phase publishes through (ours, or a peer's client: bench/peers.py)."""

    @property
    def publish(self) -> Callable[[int], Awaitable[None]]:
        """Sends message ``seq`` (a method, or a callable returning an awaitable)."""
        ...

    def check(self) -> None:
        """Raise what the server refused so far."""
        ...


async def run_phase(
    server: Measured, publisher: Publishing, tally: Tally, first: int, count: int, window: int
) -> Phase:
    """Publish messages ``first`` .. ``first + count - 1``, ``window`` undelivered at most."""
    clock = time.perf_counter_ns
    (cpu0, wait0), client0 = server.schedstat(), time.process_time()
    began = time.perf_counter()
    for seq in range(first, first + count):
        if seq - window >= first:
            await tally.wait(seq - window)
            publisher.check()
        tally.sent[seq] = clock()
        await publisher.publish(seq)
    for seq in range(max(first, first + count - window), first + count):
        await tally.wait(seq)
    elapsed = time.perf_counter() - began
    cpu, wait = server.schedstat()
    phase = Phase(elapsed, cpu - cpu0, wait - wait0, time.process_time() - client0)
    publisher.check()
    if tally.unexpected:
        raise RuntimeError(f"subscribers got unexpected frames: {tally.unexpected[:3]!r}")
    phase.latencies_ns = [tally.delivered[s] - tally.sent[s] for s in range(first, first + count)]
    return phase


def _percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(target: Target, server: ServerProcess, args: argparse.Namespace) -> Sample:
    dialect = DIALECTS[target.kind]
    n = args.subscribers
    tally = Tally(n, args.warmup + args.rounds + args.messages)
    subscribers = await connect_subscribers(server, dialect, tally, n)
    try:
        publisher = await dialect.publisher(f"ws://{HOST}:{server.port}{dialect.pub_path}")
        # This process's collector is off while it counts: a full collection walks
        # every connection's objects, a pause that would count against the server.
        gc.collect()
        gc.disable()
        try:
            for subscriber in subscribers:
                subscriber.counting = True
            async with asyncio.timeout(PHASE_TIMEOUT):
                try:
                    await run_phase(server, publisher, tally, 0, args.warmup, 1)
                    first = args.warmup
                    seq = await run_phase(server, publisher, tally, first, args.rounds, 1)
                    first += args.rounds
                    win = await run_phase(
                        server, publisher, tally, first, args.messages, args.window
                    )
                except TimeoutError:
                    late = next((s for s, c in enumerate(tally.counts) if c < n), None)
                    got = "" if late is None else f": {tally.counts[late]}/{n} have #{late}"
                    raise RuntimeError(f"{target.label}: deliveries stalled{got}") from None
        finally:
            gc.enable()
            await publisher.close()
    finally:
        await close_subscribers(subscribers)
    seq_deliveries = args.rounds * n
    deliveries = args.messages * n
    return Sample(
        seq_p50_ms=_percentile(seq.latencies_ns, 0.50) / 1e6,
        seq_p99_ms=_percentile(seq.latencies_ns, 0.99) / 1e6,
        seq_server_cpu_us=seq.server_cpu / seq_deliveries * 1e6,
        deliveries_per_s=deliveries / win.elapsed,
        server_cpu_us=win.server_cpu / deliveries * 1e6,
        client_cpu_us=win.client_cpu / deliveries * 1e6,
        server_busy=win.server_cpu / win.elapsed,
        server_wait=win.server_wait / win.elapsed,
        client_busy=win.client_cpu / win.elapsed,
        win_p50_ms=_percentile(win.latencies_ns, 0.50) / 1e6,
    )


# -- the run -----------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    """``numerator.metric / denominator.metric``, optionally with a goal."""

    name: str
    numerator: str
    denominator: str
    metric: str
    goal: float | None = None

    def of(self, samples: dict[str, Sample]) -> float:
        top = getattr(samples[self.numerator], self.metric)
        bottom = getattr(samples[self.denominator], self.metric)
        return float(top / bottom)


HC, UV = "broker/hypercorn", "broker/uvicorn"
RAW, SIO_HC, SIO_UV = "raw-broadcast", "socketio/hypercorn", "socketio/uvicorn"
LOOP_HC, LOOP_UV = "await-loop/hypercorn", "await-loop/uvicorn"
RATIOS: Final = (
    Ratio("broker/hypercorn / socketio/hypercorn, deliveries/s", HC, SIO_HC,
          "deliveries_per_s", 2.5),
    Ratio("broker/hypercorn / socketio/uvicorn, deliveries/s", HC, SIO_UV,
          "deliveries_per_s", 2.5),
    Ratio("broker/uvicorn / raw-broadcast, deliveries/s", UV, RAW, "deliveries_per_s", 0.60),
    Ratio("broker/uvicorn / socketio/uvicorn, deliveries/s", UV, SIO_UV, "deliveries_per_s"),
    Ratio("broker/hypercorn / await-loop/hypercorn, deliveries/s", HC, LOOP_HC,
          "deliveries_per_s"),
    Ratio("broker/uvicorn / await-loop/uvicorn, deliveries/s", UV, LOOP_UV, "deliveries_per_s"),
    # Server CPU per delivery, other / broker: what the throughput ratio would be
    # if the server alone were the bottleneck.
    Ratio("server CPU per delivery, socketio/hypercorn / broker/hypercorn", SIO_HC, HC,
          "server_cpu_us"),
    Ratio("server CPU per delivery, socketio/uvicorn / broker/hypercorn", SIO_UV, HC,
          "server_cpu_us"),
    Ratio("server CPU per delivery, raw-broadcast / broker/uvicorn", RAW, UV, "server_cpu_us"),
    # Latency until the last subscriber: other / broker, so higher is better.
    Ratio("last-delivery p50, socketio/hypercorn / broker/hypercorn", SIO_HC, HC, "seq_p50_ms"),
    Ratio("last-delivery p50, raw-broadcast / broker/uvicorn", RAW, UV, "seq_p50_ms"),
)  # fmt: skip


def print_table(samples: dict[str, list[Sample]], repeats: int, args: argparse.Namespace) -> None:
    print(
        f"\nMedians of {repeats} repeat(s); {args.subscribers} subscribers; CPU in us per "
        "delivery; 'last' is the time until the last subscriber has a message.\n"
    )
    print(f"{'':<24}{'--- sequential ---':^27}{f'--- window {args.window} ---':^65}")
    header = (
        f"{'target':<24}{'last p50':>9}{'p99 ms':>8}{'srv CPU':>10}"
        f"{'deliveries/s':>14}{'srv CPU':>9}{'cli CPU':>9}{'srv busy':>9}{'srv wait':>9}"
        f"{'cli busy':>9}{'last p50':>10}"
    )
    print(header)
    print("-" * len(header))
    for label, rows in samples.items():
        if not rows:
            continue

        def med(name: str, rows: list[Sample] = rows) -> float:
            return statistics.median(float(getattr(r, name)) for r in rows)

        print(
            f"{label:<24}{med('seq_p50_ms'):>9.1f}{med('seq_p99_ms'):>8.1f}"
            f"{med('seq_server_cpu_us'):>10.1f}{med('deliveries_per_s'):>14,.0f}"
            f"{med('server_cpu_us'):>9.1f}{med('client_cpu_us'):>9.1f}"
            f"{100 * med('server_busy'):>8.0f}%{100 * med('server_wait'):>8.0f}%"
            f"{100 * med('client_busy'):>8.0f}%"
            f"{med('win_p50_ms'):>10.1f}"
        )


def print_ratios(samples: dict[str, list[Sample]], repeats: int) -> dict[str, float]:
    print("\nRatios (median of the per-repeat ratios; higher is better):\n")
    medians = {}
    for ratio in RATIOS:
        if not (samples.get(ratio.numerator) and samples.get(ratio.denominator)):
            continue
        per_repeat = [ratio.of({k: v[r] for k, v in samples.items() if v}) for r in range(repeats)]
        value = statistics.median(per_repeat)
        medians[ratio.name] = value
        spread = f"[{min(per_repeat):.2f}-{max(per_repeat):.2f}]" if repeats > 1 else ""
        goal = ratio.goal
        verdict = (
            "" if goal is None else f"goal >= {goal:.2f}  {'ok' if value >= goal else 'MISSED'}"
        )
        print(f"  {ratio.name:<64}{value:>6.2f} {spread:<12}{verdict}")
    return medians


def raise_file_limit(connections: int) -> None:
    """Allow this process (and the servers it starts) the sockets the run needs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * connections + 256
    if soft != resource.RLIM_INFINITY and soft < needed:
        ceiling = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        if ceiling < needed:
            print(f"warning: RLIMIT_NOFILE is {ceiling}; {needed} wanted", file=sys.stderr)


async def benchmark(args: argparse.Namespace) -> dict[str, list[Sample]]:
    targets = args.targets
    servers = {t.label: ServerProcess(t) for t in targets}
    samples: dict[str, list[Sample]] = {t.label: [] for t in targets}
    try:
        for server in servers.values():
            await server.start()
        for repeat in range(args.repeats):
            # Rotate the order, so no target always runs first (or last).
            shift = repeat % len(targets)
            for target in targets[shift:] + targets[:shift]:
                sample = await measure(target, servers[target.label], args)
                samples[target.label].append(sample)
                print(
                    f"  repeat {repeat + 1}/{args.repeats} {target.label:<22}"
                    f" {sample.deliveries_per_s:9,.0f} deliveries/s"
                    f"  srv {sample.server_cpu_us:5.1f} us  cli {sample.client_cpu_us:5.1f} us"
                    f"  last p50 {sample.seq_p50_ms:6.1f} ms",
                    flush=True,
                )
    finally:
        for server in servers.values():
            await server.stop()
    return samples


# -- profiling -------------------------------------------------------------------------


async def profile(target: Target, args: argparse.Namespace, tmp: Path) -> None:
    """Profile ``target``'s server alone under windowed fan-out, with py-spy."""
    # roundtrip.py's py-spy reader and package grouping, shared by both benchmarks.
    import roundtrip

    py_spy = roundtrip._py_spy()
    if py_spy is None:
        print(f"\n--profile {target.label}: py-spy is not installed (pip install py-spy)")
        return
    output = tmp / f"{target.label.replace('/', '-')}.pyspy.txt"
    server = ServerProcess(target)
    await server.start()
    dialect = DIALECTS[target.kind]
    n, batch = args.subscribers, 50
    tally = Tally(n, 100_000)
    try:
        subscribers = await connect_subscribers(server, dialect, tally, n)
        publisher = await dialect.publisher(f"ws://{HOST}:{server.port}{dialect.pub_path}")
        for subscriber in subscribers:
            subscriber.counting = True
        await run_phase(server, publisher, tally, 0, args.warmup, args.window)
        first = args.warmup
        recorder = await asyncio.create_subprocess_exec(
            py_spy, "record", "--pid", str(server.pid), "--rate", "250",
            "--duration", str(args.profile_seconds), "--format", "raw", "--output", str(output),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        finished = asyncio.create_task(recorder.communicate())
        cpu0, began = server.cpu_seconds(), time.perf_counter()
        while not finished.done():
            await run_phase(server, publisher, tally, first, batch, args.window)
            first += batch
        elapsed = time.perf_counter() - began
        deliveries = (first - args.warmup) * n
        cpu_us = (server.cpu_seconds() - cpu0) / deliveries * 1e6
        _, err = await finished
        if recorder.returncode != 0:
            raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')}")
        await publisher.close()
        await close_subscribers(subscribers)
    finally:
        await server.stop()
    if args.keep_profile:
        args.keep_profile.mkdir(parents=True, exist_ok=True)
        (args.keep_profile / output.name).write_bytes(output.read_bytes())
    prof = roundtrip._from_pyspy(output)
    print(
        f"\nProfile of {target.label}, window {args.window} (py-spy, "
        f"{deliveries / elapsed:,.0f} deliveries/s while profiled; "
        f"server CPU {cpu_us:.1f} us per delivery)\n"
    )
    if not prof.total:
        print("  no samples")
        return
    idle = 100 * prof.idle / (prof.total + prof.idle)
    print(f"  {prof.total:g} samples of work ({idle:.0f}% more in epoll_wait, left out)\n")

    def rows(title: str, counter: Counter[str], top: int) -> None:
        print(f"  {title}:")
        for name, value in counter.most_common(top):
            share = value / prof.total
            print(f"    {100 * share:5.1f}% {share * cpu_us:5.2f} us  {name}")

    rows("self time by package", prof.self_by_package, 12)
    rows("top functions by self time", prof.self_by_function, 25)
    rows("gateway.* and asbp.* functions, inclusive time", prof.inclusive, 15)


# -- main --------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")
    print(
        f"{args.subscribers} subscribers; {args.warmup} warm-up messages, {args.rounds} "
        f"sequential, {args.messages} with window {args.window}; {PAYLOAD_BYTES}-byte payloads"
    )
    if not args.skip_table:
        samples = await benchmark(args)
        print_table(samples, args.repeats, args)
        ratios = print_ratios(samples, args.repeats)
        print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
        if args.json:
            dump = {
                "args": {k: str(v) for k, v in vars(args).items()},
                "samples": {k: [asdict(s) for s in v] for k, v in samples.items()},
                "ratios": ratios,
            }
            Path(args.json).write_text(json.dumps(dump, indent=2))
    with tempfile.TemporaryDirectory(prefix="asbp-fanout-") as tmp:
        for target in args.profile:
            await profile(target, args, Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, help="interleaved repeats (3; 1 with --quick)")
    parser.add_argument("--subscribers", type=int, default=1000, help="connections (1000)")
    parser.add_argument("--warmup", type=int, default=10, help="warm-up messages (10)")
    parser.add_argument("--rounds", type=int, default=100, help="sequential messages (100)")
    parser.add_argument("--messages", type=int, default=200, help="windowed messages (200)")
    parser.add_argument("--window", type=int, default=4, help="messages not yet delivered (4)")
    parser.add_argument("--quick", action="store_true", help="a short run (numbers are rough)")
    labels = [t.label for t in TARGETS]
    parser.add_argument(
        "--targets", nargs="+", choices=labels, default=labels, metavar="TARGET",
        help="measure only these: " + ", ".join(labels),
    )  # fmt: skip
    parser.add_argument(
        "--profile", nargs="+", default=[], metavar="TARGET",
        choices=["uvicorn", "hypercorn", "both", *labels],
        help="then profile these targets; uvicorn, hypercorn and both mean the broker's",
    )  # fmt: skip
    parser.add_argument("--profile-seconds", type=int, default=10)
    parser.add_argument(
        "--profile-only", dest="skip_table", action="store_true", help="skip the benchmark"
    )
    parser.add_argument("--keep-profile", type=Path, metavar="DIR", help="copy raw profiles here")
    parser.add_argument("--json", metavar="PATH", help="write every sample here as JSON")
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.rounds, args.messages = 5, 20, 40
        args.profile_seconds = min(args.profile_seconds, 3)
    args.repeats = args.repeats or (1 if args.quick else 3)
    by_label = {t.label: t for t in TARGETS}
    args.targets = tuple(by_label[x] for x in dict.fromkeys(args.targets))
    if importlib.util.find_spec("socketio") is None:
        print("python-socketio is not installed: pip install -e '.[bench]'; skipping it")
        args.targets = tuple(t for t in args.targets if t.kind != "socketio")
    aliases = {"uvicorn": [UV], "hypercorn": [HC], "both": [UV, HC]}
    args.profile = [by_label[x] for name in args.profile for x in aliases.get(name, [name])]
    raise_file_limit(args.subscribers)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

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
(goal 0: a handshake that fails, a 503 from the broker's bound on handshakes
in flight included, or gives no greeting within 10 s, a Channel
closed by the broker, a ping without its pong within 10 s, any fault, a topic
message a subscriber did not get), the handshake time (TCP connect to greeting)
p50/p99, the connect rate reached, and the broker's memory before and after.
With ``--repeats``, the soak runs too are interleaved over the servers and a
table of medians ends the report, with the broker's CPU per connect (robust to
a shared machine, unlike the rate reached) and the rate a broker with a quiet
core to itself would sustain (one second divided by it).

Connections come from 127.0.0.2 and on, one source address per 500 of them:
the broker limits open Channels per client address (``max_per_address``,
1,000 by default), and one address would run out of ports under churn (each
closed connection waits in TIME_WAIT). The open-file limit is raised to its
hard limit in this process and the servers it starts.

The churn is an open loop: ``--rate`` connects a second are started whether
or not the broker keeps up (as users arrive), and a failed one is not
retried. ``--max-handshakes N`` makes it a closed loop instead (no more than
N handshakes in flight; the rest wait for the next tick), which measures the
rate the broker takes with 0 errors. The progress lines (every 10 s of a run
of 20 s or more) show the handshakes in flight and each process's share of a
core, which tell a broker falling behind from a load generator that is.

**The client** is written for this benchmark (``Channel``): one
``asyncio.Protocol`` object per Channel and no task for its life, the upgrade
request written as soon as TCP connects, the 101 and the greeting parsed from
``data_received``, client frames masked (RFC 6455; a random key per
connection), pings answered, deadlines kept by timer handles. A ``websockets``
ClientConnection per Channel (its tasks, keepalive and parsing) cost the load
generator as much CPU as the broker spent, and starved the handshakes it was
timing; this one costs about a third of the broker's CPU per connect. The
idle-memory phase uses it for both servers, so the ratio stays like for like.
The load generator runs in one process: at 1,000 connects/s it needs about
30% of a core, and a second process would not help a broker that is the
bottleneck (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import gc
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.credentials import generate_agent_key  # noqa: E402

SERVERS = ROOT / "bench" / "_servers.py"
#: Seconds a server has to print READY, a handshake to finish, a ping to be answered.
START_TIMEOUT, HANDSHAKE_TIMEOUT, ANSWER_TIMEOUT = 30.0, 10.0, 10.0
#: Connections per client source address (127.0.0.2, 127.0.0.3, ...).
PER_ADDRESS = 500
TICK = 0.1
HOST = "127.0.0.1"
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
        self.log: Path | None = None

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
        # Its log goes to a file: under overload a server may log a traceback per
        # abandoned connection, which would bury the report.
        self.log = self.agent_key.parent / f"{self.label.replace('/', '-')}-{uuid.uuid4().hex}.log"
        with open(self.log, "wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
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

    def log_summary(self) -> str:
        """How much the server logged, and its first error, for the report."""
        if self.log is None or not self.log.exists():
            return "none"
        lines = self.log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if line.startswith(("ERROR", "Traceback", "CRITICAL"))]
        first = f"; first: {errors[0][:160]}" if errors else ""
        return f"{len(lines):,} lines, {len(errors):,} errors or tracebacks{first}"


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


# -- the client: one asyncio.Protocol per Channel ------------------------------------
#
# A ``websockets`` ClientConnection costs about as much CPU as the broker spends
# on it (its tasks, keepalive and parsing), so one load generator could not open
# 1,000 a second on a small machine. A Channel here is one Protocol object and no
# task: the upgrade request is written as soon as TCP connects, the 101 and the
# greeting are parsed from data_received, and every deadline is a timer handle.

#: Where a Channel is in its life.
CONNECTING, UPGRADING, GREETING, OPEN, CLOSING, CLOSED = range(6)
OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
#: Close code 1000 (normal closure), the payload of the client's close frame.
NORMAL_CLOSURE = (1000).to_bytes(2, "big")
#: Longest server response head accepted before the 101 is judged missing.
MAX_HEAD = 16 * 1024


def frame(opcode: int, payload: bytes, key: bytes) -> bytes:
    """A final client frame: RFC 6455 requires every client frame masked with ``key``."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 1 << 16:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    # XOR as one big integer: a Python loop over the bytes would cost more than the send.
    mask = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return head + key + (int.from_bytes(payload, "big") ^ mask).to_bytes(n, "big")


class Load:
    """What the Channels of one phase share: the server, the tally, the source addresses."""

    def __init__(self, port: int, tally: Tally, sources: Iterator[str], *, greeting: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.port, self.tally, self.sources, self.greeting = port, tally, sources, greeting
        #: Connections whose transport is up (connection_made, not yet connection_lost).
        self.live = 0
        #: Channels opened and not yet open or failed.
        self.handshaking = 0
        #: Sockets this phase holds (connecting, open or closing), and how many it may:
        #: an open loop against a broker that has stopped answering would run out.
        self.sockets = 0
        self.budget = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 500
        self._drained: asyncio.Future[None] | None = None

    def open(self, *, record: bool = True) -> Channel:
        channel = Channel(self, record)
        self.handshaking += 1
        if self.sockets >= self.budget:
            channel.fail("not started: the load generator is out of file descriptors")
            return channel
        self.sockets += 1
        # The only task of a Channel's life, done once TCP connects.
        channel.connecting = self.loop.create_task(
            self.loop.create_connection(
                lambda: channel, HOST, self.port, local_addr=(next(self.sources), 0)
            )
        )
        channel.connecting.add_done_callback(channel.connected)
        return channel

    def lost(self) -> None:
        self.live -= 1
        self.sockets -= 1
        if self.live == 0 and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drained(self, timeout: float) -> None:
        """Until every connection of this phase is gone (or ``timeout``)."""
        if self.live:
            self._drained = self.loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained, timeout)


class Channel(asyncio.Protocol):
    """One WebSocket Channel to ``/asbp``: the handshake, Commands, the close."""

    __slots__ = (
        "began",
        "buffer",
        "connecting",
        "fragments",
        "key",
        "load",
        "next_u",
        "notes",
        "ready",
        "record",
        "state",
        "timer",
        "transport",
        "waiting",
    )

    def __init__(self, load: Load, record: bool) -> None:
        self.load, self.record = load, record
        self.state = CONNECTING
        self.transport: asyncio.Transport | None = None
        self.connecting: asyncio.Task[tuple[asyncio.BaseTransport, Channel]] | None = None
        self.key = os.urandom(4)
        self.began = time.perf_counter()
        #: True once open (the greeting read), False if it never opens.
        self.ready: asyncio.Future[bool] = load.loop.create_future()
        self.timer: asyncio.TimerHandle | None = load.loop.call_later(
            HANDSHAKE_TIMEOUT, self.fail, "handshake failed: no greeting within 10 s"
        )
        self.buffer = b""
        self.fragments: list[bytes] = []
        #: The Commands awaiting their answer, by ``u``: its timer and what to do then.
        self.waiting: dict[bytes, tuple[asyncio.TimerHandle, Callable[[], None]]] = {}
        #: The topic messages this Channel was notified of (their numbers); subscribers only.
        self.notes: set[int] | None = None
        self.next_u = 0

    # -- opening ---------------------------------------------------------------------

    def connected(self, task: asyncio.Task[tuple[asyncio.BaseTransport, Channel]]) -> None:
        self.connecting = None
        if task.cancelled():
            self.load.sockets -= 1
            self.fail("handshake failed: cancelled")
        elif (exc := task.exception()) is not None:
            self.load.sockets -= 1
            self.fail(f"handshake failed: {type(exc).__name__}")

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.load.live += 1
        if self.state != CONNECTING:  # timed out while TCP connected
            transport.abort()
            return
        self.state = UPGRADING
        key = base64.b64encode(os.urandom(16))
        transport.write(
            b"GET /asbp HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (HOST.encode(), self.load.port, key)
        )

    def opened(self) -> None:
        self.state = OPEN
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.record:
            self.load.tally.handshakes.append(time.perf_counter() - self.began)
        self.load.handshaking -= 1
        self.ready.set_result(True)

    def fail(self, kind: str | None) -> None:
        """The handshake failed (counted as ``kind``) or was given up: the connection dropped."""
        if self.state >= OPEN:
            return
        if kind is not None:
            self.load.tally.error(kind)
        self.state = CLOSED
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.abort()
        if not self.ready.done():
            self.load.handshaking -= 1
            self.ready.set_result(False)

    # -- reading ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        if self.state == UPGRADING:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                self.buffer = buffer
                if len(buffer) > MAX_HEAD:
                    self.fail("handshake failed: no 101")
                return
            if not buffer.startswith(b"HTTP/1.1 101 "):
                status = buffer.partition(b"\r\n")[0].decode("latin-1")
                self.fail(f"handshake failed: {status}")
                return
            buffer = buffer[end + 4 :]
            if self.load.greeting:
                self.state = GREETING
            else:
                self.opened()
        pos, size = 0, len(buffer)
        while size - pos >= 2 and self.state != CLOSED:
            first, second = buffer[pos], buffer[pos + 1]
            length, head = second & 0x7F, 2
            if length == 126:
                if size - pos < 4:
                    break
                length, head = int.from_bytes(buffer[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if size - pos < 10:
                    break
                length, head = int.from_bytes(buffer[pos + 2 : pos + 10], "big"), 10
            if second & 0x80:  # a server never masks (RFC 6455 5.1)
                self.broken("a masked server frame")
                return
            end = pos + head + length
            if end > size:
                break
            self.frame_received(first, buffer[pos + head : end])
            pos = end
        self.buffer = buffer[pos:]

    def frame_received(self, first: int, payload: bytes) -> None:
        opcode = first & 0x0F
        if opcode in (OP_TEXT, OP_BINARY, OP_CONTINUATION):
            if not first & 0x80:  # a fragment: kept until the final one
                self.fragments.append(payload)
                return
            if self.fragments:
                payload = b"".join([*self.fragments, payload])
                self.fragments.clear()
            self.message_received(payload)
        elif opcode == OP_PING:
            self.send(OP_PONG, payload)
        elif opcode == OP_CLOSE:
            if self.state == CLOSING:  # the answer to ours: done
                assert self.transport is not None
                self.transport.close()
            else:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                self.broken(f"closed by the broker ({code})")

    def message_received(self, payload: bytes) -> None:
        if self.state == GREETING:
            if payload.startswith(b"c=asbp.channel"):
                self.opened()
            else:
                self.fail("no greeting")
            return
        head, _, body = payload.partition(b";")
        name = u = code = None
        for pair in head.lstrip(b"+").split(b","):
            key, _, value = pair.partition(b"=")
            if key == b"c":
                name = value
            elif key == b"u":
                u = value
            elif key == b"code":
                code = value
        if name == b"asbp.notification":
            if self.notes is not None:
                self.notes.add(int(body))
        elif name == b"asbp.fault":
            self.load.tally.error(f"fault {(code or b'?').decode()}")
        if u is not None and (waiting := self.waiting.pop(u, None)) is not None:
            waiting[0].cancel()
            waiting[1]()

    def broken(self, kind: str) -> None:
        """The broker closed a Channel this client had not asked to close."""
        if self.state == OPEN:
            self.load.tally.error(kind)
        elif self.state < OPEN:
            self.fail(f"handshake failed: {kind}")
            return
        self.state = CLOSED
        self.forget()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.lost()
        if self.state < OPEN:
            self.fail("handshake failed: connection lost")
        elif self.state == OPEN:
            self.load.tally.error("closed by the broker (connection lost)")
        self.state = CLOSED
        self.forget()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # -- writing ---------------------------------------------------------------------

    def send(self, opcode: int, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(opcode, payload, self.key))

    def request(self, command: bytes, u: bytes, answered: Callable[[], None], late: str) -> None:
        """Send a Command; ``answered()`` once its answer comes, error ``late`` if none in 10 s."""
        if self.state != OPEN:
            return
        timer = self.load.loop.call_later(ANSWER_TIMEOUT, self.unanswered, u, late)
        self.waiting[u] = (timer, answered)
        self.send(OP_BINARY, command)

    def unanswered(self, u: bytes, late: str) -> None:
        if self.waiting.pop(u, None) is not None:
            self.load.tally.error(late)

    def ping(self) -> None:
        self.next_u = (self.next_u + 1) % 50000
        u = b"%d" % self.next_u
        self.request(b"c=asbp.ping,u=%s;" % u, u, self.ponged, "ping without a pong")

    def ponged(self) -> None:
        self.load.tally.pings += 1

    def close(self) -> None:
        """Start the closing handshake; the broker's close frame ends it."""
        if self.state == OPEN:
            self.state = CLOSING
            self.forget()  # churned away while waiting: not an error
            self.send(OP_CLOSE, NORMAL_CLOSURE)
            # A broker that never answers the close: dropped after the same 10 s.
            self.timer = self.load.loop.call_later(ANSWER_TIMEOUT, self.abort)
        elif self.state < OPEN:
            self.fail(None)
            if self.connecting is not None:
                self.connecting.cancel()

    def abort(self) -> None:
        self.timer = None
        if self.transport is not None:
            self.transport.abort()

    def forget(self) -> None:
        for timer, _ in self.waiting.values():
            timer.cancel()
        self.waiting.clear()


async def open_many(load: Load, count: int, rate: int, *, record: bool = True) -> list[Channel]:
    """``count`` Channels, started ``rate`` a second, at most 500 handshakes at a time."""
    loop = load.loop
    began = loop.time()
    channels: list[Channel] = []
    while len(channels) < count:
        due = min(count, 1 + int((loop.time() - began) * rate))
        while len(channels) < due and load.handshaking < 500:
            channels.append(load.open(record=record))
        # Pacing, not synchronisation: the clock says when the next ones are due.
        await asyncio.sleep(0.005)
    opened = await asyncio.gather(*(channel.ready for channel in channels))
    return [channel for channel, ok in zip(channels, opened, strict=True) if ok]


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- phase 1: idle memory -------------------------------------------------------------


async def idle_memory(server: Server, channels: int, rate: int) -> float:
    """KiB of server memory per idle connection."""
    tally = Tally()
    load = Load(server.port, tally, source_addresses(), greeting=server.kind == "broker")
    warm = await open_many(load, 300, 10 * rate)
    for channel in warm:
        channel.close()
    await load.drained(ANSWER_TIMEOUT)
    gc.collect()
    before = rss_kib(server.pid)
    held = await open_many(load, channels, 10 * rate)
    after = rss_kib(server.pid)
    if tally.errors or len(held) != channels:
        raise RuntimeError(f"{server.label}: {len(held)} of {channels} opened: {tally.errors}")
    for channel in held:
        channel.close()
    await load.drained(ANSWER_TIMEOUT)
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
    #: The broker's CPU seconds per second for the traffic alone (pings, topic fan-out,
    #: the server's keepalive pings), measured before the churn.
    traffic_cpu: float = 0.0


async def soak(
    server: Server,
    channels: int,
    rate: int,
    seconds: float,
    subs: int,
    *,
    progress: bool,
    max_handshakes: int = 0,
) -> SoakResult:
    tally = Tally()
    load = Load(server.port, tally, source_addresses(), greeting=True)
    loop = load.loop
    held = await open_many(load, channels, rate, record=False)
    if progress or len(held) < channels:
        print(f"  {len(held):,} of {channels:,} Channels open; errors {tally.errors}", flush=True)
    subscribers, churned = held[:subs], held[subs:]
    subscribed: list[asyncio.Future[None]] = []
    for n, channel in enumerate(subscribers):
        channel.notes = set()
        future: asyncio.Future[None] = loop.create_future()
        u = b"%d" % (60001 + n)
        channel.request(
            b"c=asbp.subscribe,destination=%s,type=TOPIC,u=%s;" % (TOPIC.encode(), u),
            u,
            functools.partial(future.set_result, None),
            "subscription not answered",
        )
        subscribed.append(future)
    await asyncio.wait_for(asyncio.gather(*subscribed), ANSWER_TIMEOUT)
    gc.collect()
    rss_start = rss_kib(server.pid)
    cpu_start = cpu_seconds(server.pid), time.process_time()
    per_tick = max(1, round(rate * TICK))
    began = loop.time()
    connects = owed = 0
    last = 0.0, *cpu_start

    def joined(channel: Channel, ready: asyncio.Future[bool]) -> None:
        nonlocal connects
        if ready.result():
            connects += 1
            churned.append(channel)

    def publish(channel: Channel, n: int) -> None:
        u = b"%d" % (50000 + n % 10000)
        channel.request(
            b"c=asbp.publish,destination=%s,type=TOPIC,u=%s;%d" % (TOPIC.encode(), u, n),
            u,
            functools.partial(tally.published.add, n),
            "publication not accepted",
        )

    # The traffic alone first: what the pings and the topic fan-out cost the broker a
    # second. The churn's CPU less that is the CPU per connect proper, which does not
    # depend on the rate reached (at 100 connects/s the traffic was most of it).
    quiet = min(10.0, seconds / 4)
    quiet_cpu = cpu_seconds(server.pid)
    quiet_began = loop.time()
    quiet_tick = 0
    while loop.time() - quiet_began < quiet:
        quiet_tick += 1
        for channel in random.sample(churned, min(per_tick, len(churned))):
            channel.ping()
        publish(random.choice(churned), 1_000_000 + quiet_tick)
        await asyncio.sleep(max(0.0, quiet_began + quiet_tick * TICK - loop.time()))
    traffic_cpu = (cpu_seconds(server.pid) - quiet_cpu) / max(loop.time() - quiet_began, TICK)
    cpu_start = cpu_seconds(server.pid), time.process_time()
    began = loop.time()
    last = 0.0, *cpu_start
    tick = 0
    while loop.time() - began < seconds:
        tick += 1
        # Open loop by default: users arrive at the rate asked whether or not the broker
        # keeps up, and a failed handshake is not retried (the next arrival comes anyway).
        # With --max-handshakes, a closed loop: what the broker can take with 0 errors;
        # then only as many close as open, or the closes alone (not paced by the broker)
        # would hold up the first handshakes.
        owed += per_tick
        room = owed if not max_handshakes else max(0, max_handshakes - load.handshaking)
        opening = min(owed, room)
        owed -= opening
        leaving = []
        for _ in range(min(opening if max_handshakes else per_tick, len(churned))):
            # A random Channel swapped to the end and popped: a shuffle of 10,000 a tick
            # cost the load generator more than the connects.
            n = random.randrange(len(churned))
            churned[n], churned[-1] = churned[-1], churned[n]
            leaving.append(churned.pop())
        for channel in leaving:
            channel.close()
        for _ in range(opening):
            new = load.open()
            new.ready.add_done_callback(functools.partial(joined, new))
        for channel in random.sample(churned, min(per_tick, len(churned))):
            channel.ping()
        if churned:  # none open: every replacement still in its handshake
            publish(random.choice(churned), tick)
        if progress and tick % round(10 / TICK) == 0:
            # Every 10 s: enough to tell a broker falling behind from a client that is.
            now = loop.time() - began, cpu_seconds(server.pid), time.process_time()
            span = now[0] - last[0]
            print(
                f"  {now[0]:4.0f} s: {connects:,} connects, {load.handshaking:,} handshakes"
                f" in flight, {len(churned) + subs:,} open; CPU broker"
                f" {100 * (now[1] - last[1]) / span:.0f}%, load generator"
                f" {100 * (now[2] - last[2]) / span:.0f}%; load {os.getloadavg()[0]:.1f};"
                f" errors {sum(tally.errors.values()):,}",
                flush=True,
            )
            last = now
        # Paced: the next tick starts TICK after this one was due, not after it ended.
        await asyncio.sleep(max(0.0, began + tick * TICK - loop.time()))
    elapsed = loop.time() - began
    cpu = cpu_seconds(server.pid) - cpu_start[0], time.process_time() - cpu_start[1]
    connects_in_time = connects
    # What is still in flight (handshakes, pings, publications) gets its 10 s; then
    # every subscriber must have every publication accepted (one answered after its
    # publisher was churned away is delivered too, but not counted).
    deadline = loop.time() + 2 * ANSWER_TIMEOUT
    while loop.time() < deadline and (
        load.handshaking
        or any(c.waiting for c in churned)
        or any(tally.published - s.notes for s in subscribers if s.notes is not None)
    ):
        await asyncio.sleep(TICK)
    missing = sum(len(tally.published - s.notes) for s in subscribers if s.notes is not None)
    if missing:
        tally.errors["topic messages not received"] = missing
    received = sum(len(tally.published & s.notes) for s in subscribers if s.notes is not None)
    rss_end = rss_kib(server.pid)
    for channel in [*subscribers, *churned]:
        channel.close()
    await load.drained(2 * ANSWER_TIMEOUT)
    return SoakResult(
        tally,
        connects_in_time,
        elapsed,
        rss_start,
        rss_end,
        len(subscribers),
        received,
        *cpu,
        traffic_cpu=traffic_cpu,
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


@dataclass
class SoakRow:
    """One soak run's figures, for the medians."""

    reached: float
    errors: int
    p50: float
    p99: float
    #: Broker CPU microseconds per connect (less the traffic's), and its share of a core
    #: (the traffic's alone).
    cpu_per_connect: float
    net_per_connect: float
    traffic_share: float
    cpu_share: float
    load: tuple[float, float]


async def soak_once(args: argparse.Namespace, name: str, key: Path, repeat: int) -> SoakRow:
    """One soak run on a fresh broker, printed as it ends."""
    load_before = os.getloadavg()[0]
    server = Server("broker", name, key)
    await server.start()
    try:
        result = await soak(
            server,
            args.channels,
            args.rate,
            args.seconds,
            args.subscribers,
            progress=args.seconds >= 20,
            max_handshakes=args.max_handshakes,
        )
    finally:
        await server.stop()
    load_after = os.getloadavg()[0]
    tally = result.tally
    errors = sum(tally.errors.values())
    shakes = tally.handshakes
    loop_kind = (
        f", at most {args.max_handshakes:,} handshakes in flight" if args.max_handshakes else ""
    )
    run_label = f" (run {repeat + 1} of {args.repeats})" if args.repeats > 1 else ""
    print(
        f"\nsoak broker/{name}{run_label}: {args.channels:,} Channels held for"
        f" {result.seconds:.1f} s{loop_kind}; load average {load_before:.1f} -> {load_after:.1f}"
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
    per_connect = 1e6 / max(1, result.connects)
    print(
        f"  CPU per connect: broker {per_connect * result.broker_cpu:,.0f} us,"
        f" load generator {per_connect * result.client_cpu:,.0f} us (each with a close"
        f" and {tally.pings / max(1, result.connects):.1f} pings, and its share of the"
        f" topic traffic)"
    )
    net = (result.broker_cpu - result.traffic_cpu * result.seconds) / max(1, result.connects)
    print(
        f"  the traffic alone (before the churn): broker {100 * result.traffic_cpu:.0f}% of a"
        f" core; CPU per connect less the traffic: broker {1e6 * net:,.0f} us"
    )
    print(f"  errors: {errors}" + (f" {tally.errors}" if errors else ""))
    print(f"  server log: {server.log_summary()}")
    return SoakRow(
        reached=result.connects / result.seconds,
        errors=errors,
        p50=percentile(shakes, 0.5) if shakes else 0.0,
        p99=percentile(shakes, 0.99) if shakes else 0.0,
        cpu_per_connect=per_connect * result.broker_cpu,
        net_per_connect=1e6 * net,
        traffic_share=result.traffic_cpu,
        cpu_share=result.broker_cpu / result.seconds,
        load=(load_before, load_after),
    )


def soak_medians(rows: dict[str, list[SoakRow]]) -> None:
    """The medians of the soak runs per server, and the rate one whole core would take.

    The machine may be shared: the broker's CPU per connect less the traffic's does
    not depend on the share of a core it got, nor on the rate reached; the rate
    reached does. ``(1 s - the traffic's CPU) / CPU per connect`` is the rate a
    broker with a quiet core to itself would sustain with the same traffic.
    """
    print(
        "\nsoak medians            reached/s  errors  p50 ms   p99 ms  CPU/connect"
        "  less traffic  traffic  core  one core"
    )
    for name, runs in rows.items():
        med = statistics.median
        net = med(r.net_per_connect for r in runs)
        traffic = med(r.traffic_share for r in runs)
        print(
            f"  broker/{name:<15} {med(r.reached for r in runs):>9,.0f}"
            f" {med(r.errors for r in runs):>7,.0f} {1000 * med(r.p50 for r in runs):>7,.0f}"
            f" {1000 * med(r.p99 for r in runs):>8,.0f}"
            f" {med(r.cpu_per_connect for r in runs):>9,.0f} us {net:>9,.0f} us"
            f" {100 * traffic:>7.0f}% {100 * med(r.cpu_share for r in runs):>4.0f}%"
            f" {1e6 * (1 - traffic) / max(net, 1):>7,.0f}/s"
        )
        loads = ", ".join(f"{a:.1f}->{b:.1f}" for a, b in (r.load for r in runs))
        print(f"    runs: errors {[r.errors for r in runs]}, load average {loads}")


# -- main ------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    limit = raise_open_files()
    # The load generator makes no reference cycles that matter (a closed transport
    # lets go of its Channel), and a full collection over 10,000 Channels stops it
    # for a large fraction of a second, which would be counted as the broker's
    # handshake time: collected between phases only (gc.collect in the phases).
    gc.disable()
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
        rows: dict[str, list[SoakRow]] = {}
        for repeat in range(args.repeats if "soak" in args.phases else 0):
            for name in args.server:
                row = await soak_once(args, name, key, repeat)
                rows.setdefault(name, []).append(row)
                failed = failed or row.errors > 0
        if args.repeats > 1:
            soak_medians(rows)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=1_000, help="connects per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--max-handshakes",
        type=int,
        default=0,
        metavar="N",
        help="churn as a closed loop: at most N handshakes in flight (default: open loop)",
    )
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

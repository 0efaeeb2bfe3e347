"""Courses: a round trip across two buses beside the same round trip inside one, and a drain.

    python bench/courses.py [--repeats N] [--requests N] [--window N] [--backlog N]
                            [--engine memory|redis] [--http2 | --h2c] [--hold SECONDS]

Brokers run as processes (``python -m gateway``, Hypercorn, each its own bus with
its own engine: ``memory``, or with ``--engine redis`` a database each of one
private ``redis-server``). Plain ``ws://`` on loopback behind the dev flag, as the
baseline has no TLS either. Each bus has a sign-in agent (a bare Tube) that gives
``<name>*<domain>`` addresses.

=============  ================================================================
one-bus        alice*a.test sends ``r=bob*a.test``; bob (on bus A) answers by
               ``p`` (the baseline: address routing inside one bus)
two-buses      alice*a.test sends ``r=bob*b.test``; bob (on bus B) answers by
               ``p``: each Command is queued at A, crosses the Course, is
               acknowledged by B; the answer crosses back the same way
=============  ================================================================

The round trips' Courses (a.test to b.test and back) dial the peer broker itself,
as a deployment does: the comparison is UA -> Course -> agent -> back against
UA -> agent, so nothing is on one path that the other lacks. (Until this was
changed every Course went through a TCP relay in this process, there only so the
bench could cut the link, and the two-bus round trip paid for it.) The relay is
kept for what needs the link held down: the drain and the outage run to bob on a
fourth bus, ``d.test``, which a.test reaches through the relay and which only
receives (no Course back).

With ``--http2``, everything runs on TLS (a throwaway CA) and one more bus,
``c.test``, is linked to ``a.test`` by a Course over HTTP/2 (RFC 8441, ``http2 =
"auto"`` against Hypercorn), while the Course to ``b.test`` is told ``http2 =
"never"``: one more layout, ``two-buses-h2`` (bob on bus C), measured in the same
repeats, so the HTTP/2 Course and the HTTP/1.1 one are compared in one run, each
against one bus on TLS; the drain is measured over HTTP/2 too (to ``e.test``,
through the relay). ``--h2c`` is the same on plain text: the Courses told ``http2
= "always"`` over ``ws://`` (HTTP/2 with prior knowledge, under the development
flag), so the two HTTPs are compared without TLS.

With ``--outage 60 --rate 100`` (issue 13's figure), the Course is also held for 60
s while alice sends 100 Commands/s, then let through: every Command must arrive once,
in order, and the counts are printed.

Per layout and repeat: pipelined round trips per second with ``--window``
outstanding; the ratio two-buses / one-bus within each repeat, and its median
(goal >= 0.5). Then the drain: ``--backlog`` Commands queued at A while the
Course is held down, then let through; Commands/s from the Course coming back to
bob receiving the last (goal >= 10,000/s), median of the repeats.

``CPU us/trip`` is the brokers' CPU per round trip (each process's CPU-time
clock, in nanoseconds, else /proc's clock ticks; with ``--engine
redis`` the redis-server's too), ``bench us/trip`` this process's (the UAs). Both
are steadier than the rates on a shared machine; the load average is printed with
them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
# Run as ``python bench/courses.py``, Python puts bench/ first on the path, not the
# checkout: tests.support (the TLS files, free ports, a private Redis) is found only
# from here, and agents from this checkout rather than any other one installed.
sys.path.insert(0, str(ROOT))
from agents.credentials import generate_agent_key, mint_agent_token  # noqa: E402
from tests.support.ports import listen_port  # noqa: E402
from tests.support.redis import RedisServer  # noqa: E402
from tests.support.tls import TlsFiles, client_ssl_context, generate_tls_files  # noqa: E402

START_TIMEOUT = 30.0


class Relay:
    """A loopback TCP forwarder that can be held (nothing connects) or let through.

    Built on asyncio protocols, not streams: each chunk read is written to the other
    side from the read callback, with no task and no trip through the loop, since
    the relay shares this process (and its loop) with the UAs it measures.
    """

    def __init__(self) -> None:
        self.target: int | None = None
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[_Half] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Half(self), "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()

    def cut(self) -> None:
        """Hold: abort what is open, refuse what comes."""
        self.target = None
        for half in list(self._open):
            if half.transport is not None:
                half.transport.abort()

    def accepted(self, half: _Half) -> None:
        """A connection came in: to the target, or aborted while held."""
        assert half.transport is not None
        if self.target is None:
            half.transport.abort()
            return
        task = asyncio.create_task(self._connect(half, self.target))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, down: _Half, target: int) -> None:
        up = _Half(self, peer=down)
        try:
            await asyncio.get_running_loop().create_connection(lambda: up, "127.0.0.1", target)
        except OSError:
            # The broker behind is gone (the run is stopping): the dialler retries.
            if down.transport is not None:
                down.transport.abort()
            return
        down.joined(up)


class _Half(asyncio.Protocol):
    """One end of a relayed connection: what it reads, its peer writes."""

    def __init__(self, relay: Relay, peer: _Half | None = None) -> None:
        self.relay = relay
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.relay._open.add(self)
        if self.peer is None:
            self.relay.accepted(self)

    def joined(self, peer: _Half) -> None:
        """The upstream side is connected: what came before it goes now."""
        self.peer = peer
        if self.transport is None or self.transport.is_closing():
            if peer.transport is not None:
                peer.transport.abort()
            return
        assert peer.transport is not None
        for data in self._early:
            peer.transport.write(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early.append(data)
        else:
            peer.transport.write(data)

    # Flow control: a side that cannot write as fast stops the other reading.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay._open.discard(self)
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.abort()


class Bus:
    """One bus: its files and its broker process."""

    def __init__(
        self,
        root: Path,
        domain: str,
        server: str,
        tls: TlsFiles | None = None,
        redis_url: str | None = None,
    ) -> None:
        self.domain = domain
        self.server = server
        self.redis_url = redis_url
        self.tls = tls
        self.ssl = client_ssl_context(tls) if tls is not None else None
        self.directory = root / domain
        self.directory.mkdir()
        private, public = generate_agent_key()
        (self.directory / "bus.pem").write_text(private)
        (self.directory / "bus.pub.pem").write_text(public)
        self.agent_private, agent_public = generate_agent_key()
        (self.directory / "signin.pem").write_text(agent_public)
        self.process: asyncio.subprocess.Process | None = None
        # Chosen before any broker starts: a peer dialled directly is told this port
        # in its configuration, so the buses cannot each pick port 0 as they start.
        self.port = listen_port()
        #: Per peer dialled: whether its Course came up on HTTP/2 (course.up).
        self.http2: dict[str, bool] = {}

    def configure(self, *peers: tuple[Bus, str | None, str]) -> None:
        """A Course to each of ``peers``: (the peer, the URL this bus dials or None to
        only answer it, ``http2``)."""
        tls = self.tls
        text = 'insecure_dev_tubes = true\nauthenticate_command = "login"\n'
        if self.redis_url is not None:
            text += f'engine = "redis"\nredis_url = "{self.redis_url}"\n'
        text += (
            '[event_log]\nmode = "off"\n'
            '[agents.signin]\npublic_key = "signin.pem"\nserves = ["login"]\n'
        )
        if tls is not None:
            text += f'[tls]\ncertfile = "{tls.cert}"\nkeyfile = "{tls.key}"\n'
        text += (
            f'[courses]\ndomain = "{self.domain}"\nsigning_key = "bus.pem"\n'
            "backoff_min = 0.01\nbackoff_max = 0.05\nqueue_max_commands = 1000000\n"
            "queue_max_bytes = 1073741824\n"
        )
        if tls is not None:
            text += f'ca = "{tls.ca}"\n'
        for other, other_url, mode in peers:
            key = f"{other.domain}.pub.pem"
            (self.directory / key).write_bytes((other.directory / "bus.pub.pem").read_bytes())
            text += f'[courses."{other.domain}"]\npublic_key = "{key}"\nnames = ["chat.*"]\n'
            if other_url is not None:
                text += f'urls = ["{other_url}"]\n'
            if tls is not None or mode != "never":
                text += f'http2 = "{mode}"\n'
        (self.directory / "broker.toml").write_text(text)

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
        env["PYTHONPATH"] = str(ROOT)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway",
            "--config", str(self.directory / "broker.toml"),
            "--host", "127.0.0.1", "--port", str(self.port), "--log-format", "json",
            "--server", self.server,
            "--data-dir", str(self.directory),
            cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stderr is not None
        async with asyncio.timeout(START_TIMEOUT):
            while True:
                line = await self.process.stderr.readline()
                if not line:
                    raise RuntimeError(f"{self.domain}'s broker exited before listening")
                if line.startswith(b"{"):
                    event = json.loads(line)
                    if event.get("event") == "listening":
                        break
        stderr = self.process.stderr

        async def drain() -> None:
            while line := await stderr.readline():
                if line.startswith(b"{") and b'"course.up"' in line:
                    # Which HTTP each Course of this bus runs on, from its own log.
                    event = json.loads(line)
                    self.http2[str(event.get("peer"))] = bool(event.get("http2"))

        self._drain = asyncio.create_task(drain())

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await self.process.wait()

    def url(self, path: str) -> str:
        return f"{'ws' if self.tls is None else 'wss'}://127.0.0.1:{self.port}{path}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


@contextlib.asynccontextmanager
async def signin_agent(bus: Bus) -> AsyncIterator[None]:
    """A bare Tube that signs ``<body>`` in as ``<body>*<domain>``."""
    token = mint_agent_token("signin", bus.agent_private, audience="asbp-broker")
    tube = await connect(
        bus.url("/tube"),
        additional_headers={"Authorization": f"Bearer {token}"},
        compression=None,
        ssl=bus.ssl,
    )
    await tube.recv()  # asbp.tube
    await tube.send(b"c=asbp.register,names=login,u=1;")
    await tube.recv()  # asbp.accepted

    async def serve() -> None:
        async for frame in tube:
            assert isinstance(frame, bytes)
            head, _, body = frame.partition(b";")
            keys = dict(pair.split(b"=", 1) for pair in head.split(b","))
            if keys.get(b"c") != b"login":
                continue
            address = body + b"*" + bus.domain.encode()
            await tube.send(
                b"c=asbp.authenticated,s=" + keys[b"s"] + b",roles=[user],p=" + address + b";"
            )

    task = asyncio.create_task(serve())
    try:
        yield
    finally:
        task.cancel()
        await tube.close()


async def sign_in(bus: Bus, name: str) -> tuple[ClientConnection, bytes]:
    """A Channel with ``name`` signed in; the Subject-Identifier."""
    ws = await connect(
        bus.url("/asbp"), compression=None, max_queue=4096, max_size=None, ssl=bus.ssl
    )
    await ws.recv()  # asbp.channel
    await ws.send(b"c=login,u=1;" + name.encode())
    answer = await ws.recv()
    assert isinstance(answer, bytes) and answer.startswith(b"c=asbp.authenticated"), answer
    subject = next(p[2:] for p in answer.partition(b";")[0].split(b",") if p[:2] == b"s=")
    return ws, subject


async def echo_by_p(bob: ClientConnection, subject: bytes) -> None:
    """bob answers each Command with ``r=<its p>``, keeping ``u``."""
    async for frame in bob:
        assert isinstance(frame, bytes)
        head, _, body = frame.partition(b";")
        publisher = command_id = None
        for pair in head.split(b","):
            if pair[:2] == b"p=":
                publisher = pair[2:]
            elif pair[:2] == b"u=":
                command_id = pair[2:]
        if publisher is None or command_id is None:
            continue
        await bob.send(
            b"c=chat.reply,r=" + publisher + b",s=" + subject + b",u=" + command_id + b";" + body
        )


async def round_trips(
    alice: ClientConnection, subject: bytes, to: bytes, count: int, window: int
) -> float:
    """``count`` Commands to ``to`` with up to ``window`` unanswered; seconds taken."""
    slots = asyncio.Semaphore(window)
    head = b"c=chat,r=" + to + b",s=" + subject + b",u="

    async def send_all() -> None:
        for n in range(count):
            await slots.acquire()
            await alice.send(head + str(n % 60000).encode() + b";ping")

    async def receive_all() -> None:
        for _ in range(count):
            reply = await alice.recv()
            assert isinstance(reply, bytes) and reply.startswith(b"c=chat.reply"), reply[:200]
            slots.release()

    began = time.perf_counter()
    async with asyncio.timeout(300):
        await asyncio.gather(send_all(), receive_all())
    return time.perf_counter() - began


async def drain(
    relay: Relay,
    port: int,
    alice: ClientConnection,
    subject: bytes,
    bob: ClientConnection,
    backlog: int,
    cpu: Callable[[], float],
    to: bytes = b"bob*b.test",
) -> tuple[float, float]:
    """``backlog`` Commands queued while the Course is held, then let through:
    Commands/s, and the brokers' CPU per Command (``cpu``: their seconds so far)
    from the Course coming back to the last received."""
    relay.cut()
    head = b"c=chat,r=" + to + b",s=" + subject + b";"
    for n in range(backlog):
        await alice.send(head + str(n).encode())
    # Alice's own Channel answers in order: once this fault arrives, all were queued.
    await alice.send(b"c=chat,r=nobody*a.test,s=" + subject + b",u=1;")
    reply = await alice.recv()
    assert isinstance(reply, bytes) and b"code=2201" in reply, reply
    began = time.perf_counter()
    cpu0 = cpu()
    relay.target = port
    async with asyncio.timeout(300):
        for n in range(backlog):
            frame = await bob.recv()
            assert isinstance(frame, bytes) and frame.endswith(b";" + str(n).encode()), frame[:200]
    return backlog / (time.perf_counter() - began), (cpu() - cpu0) / backlog * 1e6


async def outage(
    relay: Relay,
    port: int,
    alice: ClientConnection,
    subject: bytes,
    bob: ClientConnection,
    seconds: float,
    rate: float,
    to: bytes,
) -> tuple[int, int, float]:
    """The Course held for ``seconds`` while alice sends ``rate`` Commands/s to bob, then
    let through: (sent, delivered once and in order, seconds to drain)."""
    relay.cut()
    head = b"c=chat,r=" + to + b",s=" + subject + b";"
    sent = 0
    began = time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds:
        due = int(elapsed * rate) + 1
        while sent < due:
            await alice.send(head + str(sent).encode())
            sent += 1
        await asyncio.sleep(1 / rate)  # pacing the sender, not waiting for the broker
    await alice.send(b"c=chat,r=nobody*a.test,s=" + subject + b",u=2;")
    reply = await alice.recv()
    assert isinstance(reply, bytes) and b"code=2201" in reply, reply
    back = time.perf_counter()
    relay.target = port
    in_order = 0
    async with asyncio.timeout(300):
        for n in range(sent):
            frame = await bob.recv()
            assert isinstance(frame, bytes)
            in_order += frame.endswith(b";" + str(n).encode())
    drained = time.perf_counter() - back
    # One more, through: had anything arrived twice, it would come before this one.
    await alice.send(head + b"last")
    frame = await bob.recv()
    assert isinstance(frame, bytes) and frame.endswith(b";last"), frame[:200]
    return sent, in_order, drained


def _wakes_and_writes(pid: int) -> tuple[int, int]:
    """A process's wake-ups (voluntary context switches: each a return from waiting
    for the event loop's poll, summed over its threads) and write system calls so far.

    Per round trip, they say how many loop wake-ups and socket writes a layout
    costs a broker, which the CPU per trip depends on and which, unlike the rates,
    hardly move with the machine's load. (0, 0) where /proc cannot be read.
    """
    try:
        wakes = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/status") as status:
                for line in status:
                    if line.startswith("voluntary_ctxt_switches:"):
                        wakes += int(line.split()[1])
        with open(f"/proc/{pid}/io") as io:
            writes = next(int(line.split()[1]) for line in io if line.startswith("syscw:"))
    except (OSError, StopIteration):
        return 0, 0
    return wakes, writes


def _cpu_seconds(pid: int) -> float:
    """A process's CPU seconds so far, user and system, to the nanosecond.

    Read from the process's CPU-time clock (``clock_getcpuclockid``'s id, which
    Python does not wrap: ``~pid << 3 | CPUCLOCK_SCHED``): the kernel's runtime in
    nanoseconds that /proc/<pid>/schedstat shows for one thread, summed over all of
    the process's threads, those gone included. /proc's stat counts clock ticks (10
    ms), which stepped a per-trip figure by 2 us and swung single runs: it is the
    fallback where that clock cannot be read.
    """
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-courses-") as tmp:
        tls = generate_tls_files(Path(tmp) / "tls") if args.http2 else None
        scheme = "ws" if tls is None else "wss"
        redis = RedisServer(Path(tmp) / "redis") if args.engine == "redis" else None
        if redis is not None:
            redis.start()
        h2 = args.http2 or args.h2c
        domains = ["a.test", "b.test", "d.test"] + (["c.test", "e.test"] if h2 else [])
        # Separate engines for separate buses: one redis-server, a database each.
        buses = {
            domain: Bus(
                Path(tmp),
                domain,
                args.server,
                tls,
                None if redis is None else f"redis://127.0.0.1:{redis.port}/{n}",
            )
            for n, domain in enumerate(domains)
        }
        a, b, d = buses["a.test"], buses["b.test"], buses["d.test"]
        c, e = buses.get("c.test"), buses.get("e.test")
        # HTTP/2: "auto" finds it by ALPN on TLS; on plain text only "always" asks.
        h2_mode = "always" if args.h2c else "auto"
        to_d, to_e = Relay(), Relay()
        for relay in (to_d, to_e):
            await relay.start()

        def direct(bus: Bus) -> str:
            return f"{scheme}://127.0.0.1:{bus.port}/course"

        def relayed(relay: Relay) -> str:
            return f"{scheme}://127.0.0.1:{relay.port}/course"

        # The round trips' Courses dial the peer bus itself, as a deployment does; the
        # relay (which the bench holds down) is only on the Courses the drain and the
        # outage use, to d.test (and e.test), which only receive.
        from_a: list[tuple[Bus, str | None, str]] = [
            (b, direct(b), "never"),
            (d, relayed(to_d), "never"),
        ]
        if c is not None and e is not None:
            from_a += [(c, direct(c), h2_mode), (e, relayed(to_e), h2_mode)]
            c.configure((a, direct(a), h2_mode))
            e.configure((a, None, h2_mode))
        a.configure(*from_a)
        b.configure((a, direct(a), "never"))
        d.configure((a, None, "never"))
        processes: list[int] = []
        try:
            await asyncio.gather(*(bus.start() for bus in buses.values()))
            to_d.target = d.port
            if e is not None:
                to_e.target = e.port
            processes = [bus.pid for bus in buses.values()]
            if redis is not None:
                processes.append(redis.pid)
            results = await measure(args, a, b, c, d, e, to_d, to_e, processes)
        finally:
            for bus in buses.values():
                await bus.stop()
            for relay in (to_d, to_e):
                await relay.stop()
            if redis is not None:
                redis.stop()
    report(args, tls is not None, list(buses.values()), *results)


Results = tuple[
    dict[str, list[float]],
    dict[str, list[float]],
    dict[str, list[float]],
    dict[str, list[float]],
    dict[str, list[float]],
    tuple[int, int, float],
]


async def measure(
    args: argparse.Namespace,
    a: Bus,
    b: Bus,
    c: Bus | None,
    d: Bus,
    e: Bus | None,
    to_d: Relay,
    to_e: Relay,
    processes: list[int],
) -> Results:
    """The round trips, the drains and the outage, on buses already started."""
    layouts = {"one-bus": b"bob*a.test", "two-buses": b"bob*b.test"}
    if c is not None:
        layouts["two-buses-h2"] = b"bob*c.test"
    rows: dict[str, list[float]] = {layout: [] for layout in layouts}
    cpu: dict[str, list[float]] = {layout: [] for layout in layouts}
    #: This process's CPU per round trip: the UAs.
    own: dict[str, list[float]] = {layout: [] for layout in layouts}
    drains: dict[str, list[float]] = {"two-buses": [], "two-buses-h2": []}
    drain_cpu: dict[str, list[float]] = {"two-buses": [], "two-buses-h2": []}
    counts = (0, 0, 0.0)
    #: (layout, domain) -> that broker's CPU per round trip, per repeat.
    per_bus: dict[tuple[str, str], list[float]] = {}
    #: (layout, domain) -> that broker's (wake-ups, writes) per round trip, per repeat.
    per_bus_calls: dict[tuple[str, str], list[tuple[float, float]]] = {}

    def brokers_cpu() -> float:
        # The brokers' processes, and with --engine redis the redis-server they share.
        return sum(_cpu_seconds(pid) for pid in processes)

    async with contextlib.AsyncExitStack() as agents:
        for bus in (a, b, c, d, e):
            if bus is not None:
                await agents.enter_async_context(signin_agent(bus))
        alice, alice_s = await sign_in(a, "alice")
        bobs = {"one-bus": await sign_in(a, "bob"), "two-buses": await sign_in(b, "bob")}
        if c is not None:
            bobs["two-buses-h2"] = await sign_in(c, "bob")
        echoes = [asyncio.create_task(echo_by_p(*bob)) for bob in bobs.values()]
        # Warm up every path (and wait for the Courses to come up).
        for to in layouts.values():
            await round_trips(alice, alice_s, to, args.requests // 10, args.window)
        if args.hold:
            # Two-bus round trips only, for a profiler to attach to the brokers.
            print(f"holding two-buses for {args.hold:g} s: a.test pid {a.pid}, b.test pid {b.pid}")
            sys.stdout.flush()
            began = time.perf_counter()
            held = 0
            while time.perf_counter() - began < args.hold:
                await round_trips(alice, alice_s, layouts["two-buses"], 2000, args.window)
                held += 2000
            print(f"held: {held} round trips in {time.perf_counter() - began:.1f} s")
        for _ in range(args.repeats):
            for layout, to in layouts.items():
                cpu0 = brokers_cpu()
                by_bus0 = (_cpu_seconds(a.pid), _cpu_seconds(b.pid))
                calls0 = (_wakes_and_writes(a.pid), _wakes_and_writes(b.pid))
                own0 = time.process_time()
                seconds = await round_trips(alice, alice_s, to, args.requests, args.window)
                used = brokers_cpu() - cpu0
                for bus, pid, before in zip((a, b), (a.pid, b.pid), by_bus0, strict=True):
                    per_bus.setdefault((layout, bus.domain), []).append(
                        (_cpu_seconds(pid) - before) / args.requests * 1e6
                    )
                for bus, pid, (wakes0, writes0) in zip((a, b), (a.pid, b.pid), calls0, strict=True):
                    wakes, writes = _wakes_and_writes(pid)
                    per_bus_calls.setdefault((layout, bus.domain), []).append(
                        ((wakes - wakes0) / args.requests, (writes - writes0) / args.requests)
                    )
                own[layout].append((time.process_time() - own0) / args.requests * 1e6)
                rows[layout].append(args.requests / seconds)
                cpu[layout].append(used / args.requests * 1e6)
        for task in echoes:
            task.cancel()
        # Where a round trip's CPU goes: each loop wake-up and each socket write is a
        # system call and a trip through the loop, the cost that batching shares out.
        print(
            "brokers' wake-ups / writes per trip by bus (median): "
            + ", ".join(
                f"{layout} {domain} {statistics.median(w for w, _ in values):.2f} / "
                f"{statistics.median(x for _, x in values):.2f}"
                for (layout, domain), values in per_bus_calls.items()
            )
        )
        # Each broker's share, to see which side of a Course a change moved.
        print(
            "brokers' CPU us/trip by bus (median): "
            + ", ".join(
                f"{layout} {domain} {statistics.median(values):.1f}"
                for (layout, domain), values in per_bus.items()
            )
        )
        # The drains and the outage: to bob on d.test (and e.test over HTTP/2), whose
        # Courses go through a relay the bench holds down.
        courses = [("two-buses", to_d, d, b"bob*d.test", await sign_in(d, "bob"))]
        if e is not None:
            courses.append(("two-buses-h2", to_e, e, b"bob*e.test", await sign_in(e, "bob")))
        for _ in range(args.repeats):
            for layout, relay, bus, to, bob in courses:
                rate, used = await drain(
                    relay, bus.port, alice, alice_s, bob[0], args.backlog, brokers_cpu, to
                )
                drains[layout].append(rate)
                drain_cpu[layout].append(used)
        if args.outage:
            counts = await outage(
                to_d,
                d.port,
                alice,
                alice_s,
                courses[0][4][0],
                args.outage,
                args.rate,
                b"bob*d.test",
            )
    return rows, cpu, own, drains, drain_cpu, counts


def report(
    args: argparse.Namespace,
    on_tls: bool,
    buses: list[Bus],
    rows: dict[str, list[float]],
    cpu: dict[str, list[float]],
    own: dict[str, list[float]],
    drains: dict[str, list[float]],
    drain_cpu: dict[str, list[float]],
    counts: tuple[int, int, float],
) -> None:
    """The figures, medians of the repeats."""
    sent, in_order, drained = counts
    print(
        f"{args.server}, {args.engine} engine{' on TLS' if on_tls else ''}, round trips, "
        f"window {args.window}, {args.requests} per repeat, {args.repeats} repeats"
    )
    print(
        "Courses: "
        + ", ".join(
            f"{bus.domain}->{peer} {'HTTP/2' if on else 'HTTP/1.1'}"
            for bus in buses
            for peer, on in sorted(bus.http2.items())
        )
    )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'layout':<13} {'round trips/s':>14} {'CPU us/trip':>12} {'bench us/trip':>14}")
    for layout in rows:
        print(
            f"{layout:<13} {statistics.median(rows[layout]):>14.0f} "
            f"{statistics.median(cpu[layout]):>12.1f} {statistics.median(own[layout]):>14.1f}"
        )
    for layout, what in (("two-buses", "two-buses"), ("two-buses-h2", "two-buses over HTTP/2")):
        if layout not in rows:
            continue
        ratio = statistics.median(t / o for t, o in zip(rows[layout], rows["one-bus"], strict=True))
        print(f"  ratio {what} / one-bus (median of repeats): {ratio:.2f}")
        print(f"  goal >= 0.50: {ratio:.2f}, {'met' if ratio >= 0.5 else 'missed'}")
    if "two-buses-h2" in rows:
        ratio = statistics.median(
            h2 / h1 for h2, h1 in zip(rows["two-buses-h2"], rows["two-buses"], strict=True)
        )
        print(f"  ratio HTTP/2 Course / HTTP/1.1 Course (median of repeats): {ratio:.2f}")
    for layout, what in (("two-buses", ""), ("two-buses-h2", " over HTTP/2")):
        if not drains[layout]:
            continue
        rate = statistics.median(drains[layout])
        print(
            f"drain of a {args.backlog}-Command backlog{what}: {rate:.0f} Commands/s (median), "
            f"brokers' CPU {statistics.median(drain_cpu[layout]):.1f} us per Command"
        )
        print(f"  goal >= 10000: {rate:.0f}, {'met' if rate >= 10_000 else 'missed'}")
    if args.outage:
        print(
            f"Course down {args.outage:g} s while alice sent {args.rate:g}/s: {sent} sent, "
            f"{in_order} delivered once and in order, drained in {drained:.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument(
        "--outage", type=float, default=0, help="also hold the Course this many seconds"
    )
    parser.add_argument("--rate", type=float, default=100, help="Commands/s during --outage")
    parser.add_argument("--server", choices=("hypercorn", "uvicorn"), default="hypercorn")
    parser.add_argument(
        "--http2",
        action="store_true",
        help="TLS, and a third bus linked over HTTP/2 beside the HTTP/1.1 Course",
    )
    parser.add_argument(
        "--h2c",
        action="store_true",
        help="as --http2 on plain text: the third bus's Course over h2c (prior knowledge)",
    )
    parser.add_argument(
        "--engine",
        choices=("memory", "redis"),
        default="memory",
        help="every bus's engine (redis: one private redis-server, a database per bus)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small counts")
    parser.add_argument(
        "--hold",
        type=float,
        default=0,
        help="first run two-bus round trips this many seconds (printing the brokers' "
        "pids), to profile them",
    )
    args = parser.parse_args()
    if (args.http2 or args.h2c) and args.server != "hypercorn":
        parser.error("--http2 and --h2c need --server hypercorn (Uvicorn has no HTTP/2)")
    if args.http2 and args.h2c:
        parser.error("--http2 (on TLS) or --h2c (plain text), not both")
    if args.quick:
        args.repeats, args.requests, args.backlog = 1, 500, 1000
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

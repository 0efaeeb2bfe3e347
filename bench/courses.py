"""Courses: a round trip across two buses beside the same round trip inside one, and a drain.

    python bench/courses.py [--repeats N] [--requests N] [--window N] [--backlog N]
                            [--http2 | --h2c]

Two brokers run as processes (``python -m gateway``, Hypercorn, the memory engine,
each its own bus: ``a.test`` and ``b.test``), linked by a Course through a TCP relay
in this process (so the bench can hold the Course down). Plain ``ws://`` on loopback
behind the dev flag, as the baseline has no TLS either. Each bus has a sign-in agent
(a bare Tube) that gives ``<name>*<domain>`` addresses.

=============  ================================================================
one-bus        alice*a.test sends ``r=bob*a.test``; bob (on bus A) answers by
               ``p`` (the baseline: address routing inside one bus)
two-buses      alice*a.test sends ``r=bob*b.test``; bob (on bus B) answers by
               ``p``: each Command is queued at A, crosses the Course, is
               acknowledged by B; the answer crosses back the same way
=============  ================================================================

With ``--http2``, everything runs on TLS (a throwaway CA) and a third bus, ``c.test``,
is linked to ``a.test`` by a Course over HTTP/2 (RFC 8441, ``http2 = "auto"`` against
Hypercorn), while the Course to ``b.test`` is told ``http2 = "never"``: one more
layout, ``two-buses-h2`` (bob on bus C), measured in the same repeats, so the HTTP/2
Course and the HTTP/1.1 one are compared in one run, each against one bus on TLS;
the drain is measured on both Courses too. ``--h2c`` is the same on plain text:
the Course to ``c.test`` told ``http2 = "always"`` over ``ws://`` (HTTP/2 with prior
knowledge, under the development flag), so the two HTTPs are compared without TLS.

With ``--outage 60 --rate 100`` (issue 13's figure), the Course is also held for 60
s while alice sends 100 Commands/s, then let through: every Command must arrive once,
in order, and the counts are printed.

Per layout and repeat: pipelined round trips per second with ``--window``
outstanding; the ratio two-buses / one-bus within each repeat, and its median
(goal >= 0.5). Then the drain: ``--backlog`` Commands queued at A while the
Course is held down, then let through; Commands/s from the Course coming back to
bob receiving the last (goal >= 10,000/s), median of the repeats.

``CPU us/trip`` is the brokers' CPU per round trip (from /proc), ``bench us/trip``
this process's: the UAs, and the relay every Course message goes through, on the
round trip's path. Both are steadier than the rates on a shared machine; the load
average is printed with them.
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

    def __init__(self, root: Path, domain: str, server: str, tls: TlsFiles | None = None) -> None:
        self.domain = domain
        self.server = server
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
        self.port = 0
        #: Per peer dialled: whether its Course came up on HTTP/2 (course.up).
        self.http2: dict[str, bool] = {}

    def configure(
        self, peer: Bus, url: str, *more: tuple[Bus, str, str], http2: str = "never"
    ) -> None:
        """Courses to ``peer`` at ``url`` with ``http2`` (on TLS), and to each of
        ``more`` (peer, URL, ``http2``)."""
        tls = self.tls
        text = (
            'insecure_dev_tubes = true\nauthenticate_command = "login"\n'
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
        for other, other_url, mode in ((peer, url, http2), *more):
            key = f"{other.domain}.pub.pem"
            (self.directory / key).write_bytes((other.directory / "bus.pub.pem").read_bytes())
            text += (
                f'[courses."{other.domain}"]\nurls = ["{other_url}"]\npublic_key = "{key}"\n'
                'names = ["chat.*"]\n'
            )
            if tls is not None or mode != "never":
                text += f'http2 = "{mode}"\n'
        (self.directory / "broker.toml").write_text(text)

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
        env["PYTHONPATH"] = str(ROOT)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway",
            "--config", str(self.directory / "broker.toml"),
            "--host", "127.0.0.1", "--port", "0", "--log-format", "json",
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
                        self.port = int(str(event["url"]).rsplit(":", 1)[1].split("/")[0])
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

    def cpu_seconds(self) -> float:
        assert self.process is not None
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
) -> tuple[int, int, float]:
    """The Course held for ``seconds`` while alice sends ``rate`` Commands/s to bob, then
    let through: (sent, delivered once and in order, seconds to drain)."""
    relay.cut()
    head = b"c=chat,r=bob*b.test,s=" + subject + b";"
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


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asbp-courses-") as tmp:
        tls = generate_tls_files(Path(tmp) / "tls") if args.http2 else None
        scheme = "ws" if tls is None else "wss"
        a = Bus(Path(tmp), "a.test", args.server, tls)
        b = Bus(Path(tmp), "b.test", args.server, tls)
        c = Bus(Path(tmp), "c.test", args.server, tls) if args.http2 or args.h2c else None
        # HTTP/2: "auto" finds it by ALPN on TLS; on plain text only "always" asks.
        h2_mode = "always" if args.h2c else "auto"
        to_a, to_b, to_c = Relay(), Relay(), Relay()
        for relay in (to_a, to_b, to_c):
            await relay.start()
        buses = [a, b] if c is None else [a, b, c]
        if c is None:
            a.configure(b, f"ws://127.0.0.1:{to_b.port}/course")
        else:
            # b over HTTP/1.1 (http2 = "never"), c over HTTP/2 ("auto" against Hypercorn).
            a.configure(
                b, f"{scheme}://127.0.0.1:{to_b.port}/course",
                (c, f"{scheme}://127.0.0.1:{to_c.port}/course", h2_mode),
            )  # fmt: skip
            c.configure(a, f"{scheme}://127.0.0.1:{to_a.port}/course", http2=h2_mode)
        b.configure(a, f"{scheme}://127.0.0.1:{to_a.port}/course")
        for bus in buses:
            await bus.start()
        to_a.target, to_b.target = a.port, b.port
        if c is not None:
            to_c.target = c.port
        layouts = {"one-bus": b"bob*a.test", "two-buses": b"bob*b.test"}
        if c is not None:
            layouts["two-buses-h2"] = b"bob*c.test"
        rows: dict[str, list[float]] = {layout: [] for layout in layouts}
        cpu: dict[str, list[float]] = {layout: [] for layout in layouts}
        #: This process's CPU per round trip: the UAs, and the relay the Courses go
        #: through (the same process, so on the round trip's critical path).
        own: dict[str, list[float]] = {layout: [] for layout in layouts}
        drains: dict[str, list[float]] = {"two-buses": [], "two-buses-h2": []}
        drain_cpu: dict[str, list[float]] = {"two-buses": [], "two-buses-h2": []}
        sent = in_order = 0
        drained = 0.0
        try:
            async with contextlib.AsyncExitStack() as agents:
                for bus in buses:
                    await agents.enter_async_context(signin_agent(bus))
                alice, alice_s = await sign_in(a, "alice")
                bobs = {"one-bus": await sign_in(a, "bob"), "two-buses": await sign_in(b, "bob")}
                if c is not None:
                    bobs["two-buses-h2"] = await sign_in(c, "bob")
                echoes = [asyncio.create_task(echo_by_p(*bob)) for bob in bobs.values()]
                # Warm up every path (and wait for the Courses to come up).
                for to in layouts.values():
                    await round_trips(alice, alice_s, to, args.requests // 10, args.window)
                for _ in range(args.repeats):
                    for layout, to in layouts.items():
                        cpu0 = sum(bus.cpu_seconds() for bus in buses)
                        own0 = time.process_time()
                        seconds = await round_trips(alice, alice_s, to, args.requests, args.window)
                        used = sum(bus.cpu_seconds() for bus in buses) - cpu0
                        own[layout].append((time.process_time() - own0) / args.requests * 1e6)
                        rows[layout].append(args.requests / seconds)
                        cpu[layout].append(used / args.requests * 1e6)
                for task in echoes:
                    task.cancel()
                courses = [("two-buses", to_b, b, b"bob*b.test")]
                if c is not None:
                    courses.append(("two-buses-h2", to_c, c, b"bob*c.test"))

                def brokers_cpu() -> float:
                    return sum(bus.cpu_seconds() for bus in buses)

                for _ in range(args.repeats):
                    for layout, relay, bus, to in courses:
                        rate, used = await drain(
                            relay,
                            bus.port,
                            alice,
                            alice_s,
                            bobs[layout][0],
                            args.backlog,
                            brokers_cpu,
                            to,
                        )
                        drains[layout].append(rate)
                        drain_cpu[layout].append(used)
                if args.outage:
                    sent, in_order, drained = await outage(
                        to_b, b.port, alice, alice_s, bobs["two-buses"][0], args.outage, args.rate
                    )
        finally:
            for bus in buses:
                await bus.stop()
            for relay in (to_a, to_b, to_c):
                await relay.stop()
    print(
        f"{args.server}{' on TLS' if tls else ''}, round trips, window {args.window}, "
        f"{args.requests} per repeat, {args.repeats} repeats"
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
    parser.add_argument("--quick", action="store_true", help="a smoke run: small counts")
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

"""Round trips User-Agent -> broker -> agent -> broker -> User-Agent over WebSocket.

    python bench/roundtrip.py [--quick] [--repeats N] [--profile uvicorn|hypercorn|both|TARGET...]

Five targets, each a server in its own process (bench/_servers.py), measured in
one run, interleaved, ``--repeats`` times; the table shows medians:

=========================  ===============================================
broker/hypercorn           the real broker (gateway.app.create_app)
bare-starlette/hypercorn   a Starlette WebSocket endpoint relaying A->B->A
broker/uvicorn             the broker on Uvicorn (ws="websockets-sansio")
bare-starlette/uvicorn     the bare relay on Uvicorn
raw-websockets             the same relay on plain ``websockets``
=========================  ===============================================

This process is the load generator: one "user" WebSocket and one "agent"
WebSocket. The user sends ``c=echo,u=N;<64 bytes>``. Through the broker, the
agent has registered ``echo`` on ``/tube`` and answers each request with
``c=echo.reply,d=<i>,u=<u>;<body>``; through a relay it sends back what it got.

Per target and repeat:

* sequential: round trips one at a time, after a warm-up: p50 and p99 in us;
* pipelined: a window of ``--window`` requests outstanding: Commands/s (round
  trips per second);
* server CPU per round trip, from /proc/<pid>/stat (utime + stime), and this
  process's CPU per round trip: on a 2-core machine the two compete.

Ratios are computed within each repeat (same run, same load) and the
medians printed, against the goals: broker / bare relay on the same server
>= 0.70 (latency as bare_p50 / broker_p50, so higher is better; throughput),
and broker/uvicorn / raw-websockets throughput >= 0.50.

The brokers run on the loop ``asbp broker`` would (``ASBP_LOOP``, else
``auto``: uvloop where installed) and the bare and raw relays on asyncio's
loop, as they always did. ``--raw-uvloop`` adds the raw relay on uvloop
(``raw-websockets/uvloop``), so both baselines are in the table;
``--loops`` instead measures each broker on uvloop and on asyncio's loop in
one run, interleaved, beside the raw relay on both.

``--profile`` then runs a broker alone under py-spy (or cProfile, if py-spy
is not installed) during a pipelined load and summarises where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

from agents.credentials import generate_agent_key, mint_agent_token

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "_servers.py"
AGENT_ID = "bench-agent"
AUDIENCE = "asbp-broker"  # GatewayConfig's default audience
BODY = bytes(range(0x41, 0x41 + 26)) * 2 + b"0123456789ab"  # 64 bytes
assert len(BODY) == 64
START_TIMEOUT = 60.0
PHASE_TIMEOUT = 300.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
HAVE_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


@dataclass(frozen=True)
class Target:
    label: str
    kind: str  # broker | bare | raw
    server: str | None  # hypercorn | uvicorn | None (raw)
    metrics: str = "on"  # the broker's [metrics] enabled
    loop: str | None = None  # bench/_servers.py --loop; None: its default


TARGETS: tuple[Target, ...] = (
    Target("broker/hypercorn", "broker", "hypercorn"),
    Target("bare-starlette/hypercorn", "bare", "hypercorn"),
    Target("broker/uvicorn", "broker", "uvicorn"),
    Target("bare-starlette/uvicorn", "bare", "uvicorn"),
    Target("raw-websockets", "raw", None),
)


@dataclass
class Sample:
    """One target, one repeat."""

    p50_us: float
    p99_us: float
    seq_server_cpu_us: float
    commands_per_s: float
    pipe_server_cpu_us: float
    pipe_client_cpu_us: float


# -- the server process --------------------------------------------------------


#: The brokers' event log, on or off (--event-log); a list so main() can set it.
EVENT_LOG: list[str] = ["on"]


class ServerProcess:
    """A bench/_servers.py subprocess; stopped by closing its stdin."""

    def __init__(self, target: Target, *, agent_key: Path | None, cprofile: Path | None = None):
        self.target = target
        self.agent_key = agent_key
        self.cprofile = cprofile
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0

    async def start(self) -> None:
        args = [sys.executable, str(SERVERS), self.target.kind]
        if self.target.server is not None:
            args += ["--server", self.target.server]
        if self.target.kind == "broker":
            assert self.agent_key is not None
            args += ["--agent-id", AGENT_ID, "--agent-key", str(self.agent_key)]
            args += ["--broker-id", "bench-" + uuid.uuid4().hex[:8]]
            args += ["--event-log", EVENT_LOG[0], "--metrics", self.target.metrics]
        if self.target.loop is not None:
            args += ["--loop", self.target.loop]
        if self.cprofile is not None:
            args += ["--cprofile", str(self.cprofile)]
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

    def url(self, path: str) -> str:
        return f"ws://127.0.0.1:{self.port}{path}"

    def cpu_seconds(self) -> float:
        """CPU time of the server process so far, in seconds, all threads.

        /proc/<pid>/task/*/schedstat counts nanoseconds on CPU; /proc/<pid>/stat
        (utime + stime) counts clock ticks, too coarse for a short phase.
        """
        if HAVE_SCHEDSTAT:
            total = 0
            for task in os.listdir(f"/proc/{self.pid}/task"):
                path = f"/proc/{self.pid}/task/{task}/schedstat"
                with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
                    total += int(f.read().split()[0])  # a thread may just have ended
            return total / 1e9
        with open(f"/proc/{self.pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        # Fields 14 and 15 of proc(5); the split starts at field 3.
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

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


# -- the clients ---------------------------------------------------------------


async def _open(url: str, headers: dict[str, str] | None = None) -> ClientConnection:
    return await connect(
        url, compression=None, additional_headers=headers, max_queue=1024, open_timeout=30
    )


async def _agent_broker(agent: ClientConnection) -> None:
    """Answer each forwarded ``echo`` with ``c=echo.reply,d=<i>,u=<u>;<body>``."""
    async for message in agent:
        assert isinstance(message, bytes)
        head, _, body = message.partition(b";")
        channel = command_id = None
        for pair in head.split(b","):
            if pair[:2] == b"i=":
                channel = pair[2:]
            elif pair[:2] == b"u=":
                command_id = pair[2:]
        if channel is None or command_id is None:
            raise RuntimeError(f"agent got an unexpected Command: {message[:200]!r}")
        await agent.send(b"c=echo.reply,d=" + channel + b",u=" + command_id + b";" + body)


async def _agent_relay(agent: ClientConnection) -> None:
    async for message in agent:
        await agent.send(message)


@contextlib.asynccontextmanager
async def session(
    target: Target, server: ServerProcess, private_pem: str
) -> AsyncIterator[tuple[ClientConnection, bytes]]:
    """Connect the agent, then the user; yield the user and the expected reply prefix."""
    if target.kind == "broker":
        token = mint_agent_token(AGENT_ID, private_pem, audience=AUDIENCE)
        agent = await _open(server.url("/tube"), {"Authorization": f"Bearer {token}"})
        greeting = await agent.recv()
        if isinstance(greeting, str):  # the broker greets in text when it is UTF-8
            greeting = greeting.encode()
        if not (isinstance(greeting, bytes) and greeting.startswith(b"c=asbp.tube")):
            raise RuntimeError(f"unexpected Tube greeting {greeting!r}")
        await agent.send(b"c=asbp.register,names=echo,u=1;")
        accepted = await agent.recv()
        if not (isinstance(accepted, bytes) and accepted.startswith(b"c=asbp.accepted")):
            raise RuntimeError(f"registering echo failed: {accepted!r}")
        responder = asyncio.create_task(_agent_broker(agent))
        user = await _open(server.url("/asbp"))
        greeting = await user.recv()
        if isinstance(greeting, str):  # the broker greets in text when it is UTF-8
            greeting = greeting.encode()
        if not (isinstance(greeting, bytes) and greeting.startswith(b"c=asbp.channel")):
            raise RuntimeError(f"unexpected Channel greeting {greeting!r}")
        prefix = b"c=echo.reply,"
    else:
        agent = await _open(server.url("/b"))
        responder = asyncio.create_task(_agent_relay(agent))
        user = await _open(server.url("/a"))
        prefix = b"c=echo,"
    try:
        yield user, prefix
    finally:
        await user.close()
        await agent.close()
        responder.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await responder


def _frame(n: int) -> bytes:
    return b"c=echo,u=%d;" % (n % 65536) + BODY


def _check(reply: str | bytes, prefix: bytes) -> None:
    if not (isinstance(reply, bytes) and reply.startswith(prefix) and reply.endswith(BODY)):
        raise RuntimeError(f"unexpected reply {reply!r:.300}")


async def sequential(user: ClientConnection, prefix: bytes, count: int, start: int) -> list[int]:
    """``count`` round trips one at a time; their latencies in ns."""
    latencies = []
    clock = time.perf_counter_ns
    for n in range(start, start + count):
        frame = _frame(n)
        began = clock()
        await user.send(frame)
        reply = await user.recv()
        latencies.append(clock() - began)
        _check(reply, prefix)
    return latencies


async def pipelined(user: ClientConnection, prefix: bytes, count: int, window: int) -> float:
    """``count`` requests with up to ``window`` outstanding; seconds taken."""
    slots = asyncio.Semaphore(window)

    async def send_all() -> None:
        for n in range(count):
            await slots.acquire()
            await user.send(_frame(n))

    async def receive_all() -> None:
        for _ in range(count):
            _check(await user.recv(), prefix)
            slots.release()

    began = time.perf_counter()
    await asyncio.gather(send_all(), receive_all())
    return time.perf_counter() - began


def _percentile(sorted_values: list[int], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def measure(
    target: Target, server: ServerProcess, private_pem: str, args: argparse.Namespace
) -> Sample:
    async with asyncio.timeout(PHASE_TIMEOUT), session(target, server, private_pem) as (u, p):
        await sequential(u, p, args.warmup, 0)
        await pipelined(u, p, args.warmup * 5, args.window)

        cpu0 = server.cpu_seconds()
        latencies = sorted(await sequential(u, p, args.trips, args.warmup))
        seq_cpu = server.cpu_seconds() - cpu0

        cpu0, client0 = server.cpu_seconds(), time.process_time()
        elapsed = await pipelined(u, p, args.requests, args.window)
        pipe_cpu = server.cpu_seconds() - cpu0
        client_cpu = time.process_time() - client0
    return Sample(
        p50_us=_percentile(latencies, 0.50) / 1000,
        p99_us=_percentile(latencies, 0.99) / 1000,
        seq_server_cpu_us=seq_cpu / args.trips * 1e6,
        commands_per_s=args.requests / elapsed,
        pipe_server_cpu_us=pipe_cpu / args.requests * 1e6,
        pipe_client_cpu_us=client_cpu / args.requests * 1e6,
    )


# -- the run ---------------------------------------------------------------------


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


HC_BROKER, HC_BARE = "broker/hypercorn", "bare-starlette/hypercorn"
UV_BROKER, UV_BARE = "broker/uvicorn", "bare-starlette/uvicorn"
RAW = "raw-websockets"
RATIOS: tuple[Ratio, ...] = (
    # Latency: bare / broker, so that higher is better here too.
    Ratio("hypercorn: broker/bare p50 latency (bare_p50 / broker_p50)", HC_BARE, HC_BROKER,
          "p50_us", 0.70),
    Ratio("hypercorn: broker/bare throughput", HC_BROKER, HC_BARE, "commands_per_s", 0.70),
    Ratio("uvicorn:   broker/bare p50 latency (bare_p50 / broker_p50)", UV_BARE, UV_BROKER,
          "p50_us", 0.70),
    Ratio("uvicorn:   broker/bare throughput", UV_BROKER, UV_BARE, "commands_per_s", 0.70),
    Ratio("broker/uvicorn / raw-websockets throughput", UV_BROKER, RAW, "commands_per_s", 0.50),
    Ratio("broker/hypercorn / raw-websockets throughput", HC_BROKER, RAW, "commands_per_s"),
    Ratio("bare-starlette/uvicorn / raw-websockets throughput", UV_BARE, RAW, "commands_per_s"),
    Ratio("bare-starlette/hypercorn / raw-websockets throughput", HC_BARE, RAW, "commands_per_s"),
    # Server CPU per pipelined round trip: bare / broker, the server-bound limit.
    Ratio("hypercorn: server CPU per trip, bare / broker", HC_BARE, HC_BROKER,
          "pipe_server_cpu_us"),
    Ratio("uvicorn:   server CPU per trip, bare / broker", UV_BARE, UV_BROKER,
          "pipe_server_cpu_us"),
)  # fmt: skip


# --metrics-cost: the broker with its metrics on and off, same run, interleaved.
UV_NO_METRICS, HC_NO_METRICS = "broker-no-metrics/uvicorn", "broker-no-metrics/hypercorn"
METRICS_TARGETS = (
    Target(UV_BROKER, "broker", "uvicorn"),
    Target(UV_NO_METRICS, "broker", "uvicorn", metrics="off"),
    Target(HC_BROKER, "broker", "hypercorn"),
    Target(HC_NO_METRICS, "broker", "hypercorn", metrics="off"),
)
METRICS_RATIOS = (
    # The goal: metrics cost at most 3% of throughput.
    Ratio("uvicorn:   metrics on / off throughput", UV_BROKER, UV_NO_METRICS,
          "commands_per_s", 0.97),
    Ratio("hypercorn: metrics on / off throughput", HC_BROKER, HC_NO_METRICS,
          "commands_per_s", 0.97),
    Ratio("uvicorn:   server CPU per trip, off / on", UV_NO_METRICS, UV_BROKER,
          "pipe_server_cpu_us"),
    Ratio("hypercorn: server CPU per trip, off / on", HC_NO_METRICS, HC_BROKER,
          "pipe_server_cpu_us"),
)  # fmt: skip


# --raw-uvloop: the raw relay on uvloop too, beside the stock one (asyncio's loop).
RAW_UVLOOP = "raw-websockets/uvloop"
RAW_UVLOOP_TARGET = Target(RAW_UVLOOP, "raw", None, loop="uvloop")
RAW_UVLOOP_RATIOS = (
    Ratio("broker/uvicorn / raw-websockets/uvloop throughput", UV_BROKER, RAW_UVLOOP,
          "commands_per_s"),
    Ratio("broker/hypercorn / raw-websockets/uvloop throughput", HC_BROKER, RAW_UVLOOP,
          "commands_per_s"),
)  # fmt: skip

# --loops: each broker on uvloop (its default) and on asyncio's loop, same run.
UV_ASYNCIO, HC_ASYNCIO = "broker/uvicorn/asyncio", "broker/hypercorn/asyncio"
LOOP_TARGETS = (
    Target(UV_BROKER, "broker", "uvicorn", loop="uvloop"),
    Target(UV_ASYNCIO, "broker", "uvicorn", loop="asyncio"),
    Target(HC_BROKER, "broker", "hypercorn", loop="uvloop"),
    Target(HC_ASYNCIO, "broker", "hypercorn", loop="asyncio"),
    Target(RAW, "raw", None, loop="asyncio"),
    RAW_UVLOOP_TARGET,
)
LOOP_RATIOS = (
    Ratio("uvicorn:   uvloop / asyncio throughput", UV_BROKER, UV_ASYNCIO, "commands_per_s"),
    Ratio("hypercorn: uvloop / asyncio throughput", HC_BROKER, HC_ASYNCIO, "commands_per_s"),
    Ratio("uvicorn:   server CPU per trip, uvloop / asyncio", UV_BROKER, UV_ASYNCIO,
          "pipe_server_cpu_us"),
    Ratio("hypercorn: server CPU per trip, uvloop / asyncio", HC_BROKER, HC_ASYNCIO,
          "pipe_server_cpu_us"),
    Ratio("raw-websockets: uvloop / asyncio throughput", RAW_UVLOOP, RAW, "commands_per_s"),
    Ratio("broker/uvicorn (uvloop) / raw-websockets throughput", UV_BROKER, RAW,
          "commands_per_s", 0.50),
    Ratio("broker/hypercorn (uvloop) / raw-websockets throughput", HC_BROKER, RAW,
          "commands_per_s"),
    Ratio("broker/uvicorn/asyncio / raw-websockets throughput", UV_ASYNCIO, RAW,
          "commands_per_s"),
    Ratio("broker/hypercorn/asyncio / raw-websockets throughput", HC_ASYNCIO, RAW,
          "commands_per_s"),
    *RAW_UVLOOP_RATIOS,
)  # fmt: skip


def print_table(samples: dict[str, list[Sample]], repeats: int) -> None:
    print(f"\nMedians of {repeats} repeat(s); CPU is per round trip.\n")
    header = (
        f"{'target':<26}{'p50 us':>9}{'p99 us':>9}{'srv CPU us':>12}"
        f"{'Commands/s':>12}{'srv CPU us':>12}{'cli CPU us':>12}"
    )
    print(f"{'':<26}{'--- sequential ---':^30}{'--- pipelined ---':^36}")
    print(header)
    print("-" * len(header))
    for target in TARGETS:
        rows = samples[target.label]

        def med(name: str, rows: list[Sample] = rows) -> float:
            return statistics.median(float(getattr(r, name)) for r in rows)

        print(
            f"{target.label:<26}{med('p50_us'):>9.0f}{med('p99_us'):>9.0f}"
            f"{med('seq_server_cpu_us'):>12.0f}{med('commands_per_s'):>12,.0f}"
            f"{med('pipe_server_cpu_us'):>12.0f}{med('pipe_client_cpu_us'):>12.0f}"
        )


def print_ratios(samples: dict[str, list[Sample]], repeats: int) -> dict[str, float]:
    print("\nRatios (median of the per-repeat ratios; higher is better):\n")
    medians = {}
    for ratio in RATIOS:
        name, goal = ratio.name, ratio.goal
        per_repeat = [ratio.of({k: v[r] for k, v in samples.items()}) for r in range(repeats)]
        value = statistics.median(per_repeat)
        medians[name] = value
        spread = f"[{min(per_repeat):.2f}-{max(per_repeat):.2f}]" if repeats > 1 else ""
        verdict = (
            "" if goal is None else (f"goal >= {goal:.2f}  {'ok' if value >= goal else 'MISSED'}")
        )
        print(f"  {name:<60}{value:>6.2f} {spread:<12}{verdict}")
    return medians


async def run(args: argparse.Namespace) -> None:
    private_pem, public_pem = generate_agent_key()
    with tempfile.TemporaryDirectory(prefix="asbp-bench-") as tmp:
        key = Path(tmp) / "agent.pub.pem"
        key.write_text(public_pem)
        print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")
        print(
            f"sequential: {args.trips} trips after {args.warmup} warm-up; pipelined: "
            f"{args.requests} requests, window {args.window}; {len(BODY)}-byte bodies"
        )
        if not args.skip_table:
            samples = await benchmark(args, private_pem, key)
            print_table(samples, args.repeats)
            ratios = print_ratios(samples, args.repeats)
            print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
            if args.json:
                dump = {
                    "args": vars(args),
                    "samples": {k: [asdict(s) for s in v] for k, v in samples.items()},
                    "ratios": ratios,
                }
                Path(args.json).write_text(json.dumps(dump, indent=2, default=str))
        for target in args.profile:
            await profile(target, args, private_pem, key, Path(tmp))


async def benchmark(
    args: argparse.Namespace, private_pem: str, key: Path
) -> dict[str, list[Sample]]:
    servers = {t.label: ServerProcess(t, agent_key=key) for t in TARGETS}
    samples: dict[str, list[Sample]] = {t.label: [] for t in TARGETS}
    try:
        for server in servers.values():
            await server.start()
        for repeat in range(args.repeats):
            # Rotate the order, so no target always runs first (or last).
            order = TARGETS[repeat % len(TARGETS) :] + TARGETS[: repeat % len(TARGETS)]
            for target in order:
                sample = await measure(target, servers[target.label], private_pem, args)
                samples[target.label].append(sample)
                print(
                    f"  repeat {repeat + 1}/{args.repeats} {target.label:<26}"
                    f" p50 {sample.p50_us:6.0f} us  p99 {sample.p99_us:6.0f} us"
                    f"  {sample.commands_per_s:8,.0f} Commands/s",
                    flush=True,
                )
    finally:
        for server in servers.values():
            await server.stop()
    return samples


# -- profiling -------------------------------------------------------------------

PACKAGES = frozenset(
    {"gateway", "asbp", "uvicorn", "hypercorn", "wsproto", "h11", "websockets", "starlette"}
)
#: The event loop waiting in epoll_wait: py-spy does not always see it as idle.
IDLE = "EpollSelector.select (selectors.py)"


def _short(filename: str) -> str:
    """``.../site-packages/uvicorn/x.py`` -> ``uvicorn/x.py``, as py-spy writes it."""
    for marker in ("/site-packages/", "/work/main/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    _, sep, tail = filename.rpartition("/lib/python3")
    return tail.partition("/")[2] if sep else filename


def _category(filename: str) -> str:
    """The top-level package a source file belongs to, or ``stdlib``/``other``."""
    short = _short(filename)
    top = short.partition("/")[0]
    if top in PACKAGES:
        return top
    if top == "asyncio":
        return "asyncio"
    if short.startswith("~") or not short or short.startswith("<"):
        return "builtins"
    return "stdlib/other"


@dataclass
class Profile:
    """Where a server's time went: self time by package and by function."""

    #: Work, in samples (py-spy) or seconds (cProfile), without ``idle``.
    total: float
    #: The event loop in epoll_wait: waiting, not work.
    idle: float
    self_by_package: Counter[str]
    self_by_function: Counter[str]
    #: gateway.* and asbp.* functions only.
    inclusive: Counter[str]


def _frame_key(frame: str) -> tuple[str, str]:
    """``"f (path/file.py:12)"`` -> ``("f (path/file.py)", "path/file.py")``."""
    name, _, where = frame.partition(" (")
    filename = where.rsplit(":", 1)[0]
    return f"{name} ({_short(filename)})", filename


def _from_pyspy(path: Path) -> Profile:
    """Summarise py-spy's ``--format raw``: one ``f (file:line);g (...) N`` per stack."""
    prof = Profile(0, 0, Counter(), Counter(), Counter())
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_frame_key(f) for f in stack.split(";")]
        leaf, filename = frames[-1]
        if leaf == IDLE:
            prof.idle += count
            continue
        prof.total += count
        prof.self_by_package[_category(filename)] += count
        prof.self_by_function[leaf] += count
        for key in {k for k, f in frames if _category(f) in ("gateway", "asbp")}:
            prof.inclusive[key] += count
    return prof


def _from_pstats(path: Path) -> Profile:
    import pstats

    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    prof = Profile(0.0, 0.0, Counter(), Counter(), Counter())
    for (filename, _line, name), (_cc, _nc, tottime, cumtime, _callers) in stats.items():
        key = f"{name} ({_short(filename)})"
        if name == "<method 'poll' of 'select.epoll' objects>":
            prof.idle += tottime
            continue
        prof.total += tottime
        prof.self_by_package[_category(filename)] += tottime
        prof.self_by_function[key] += tottime
        if _category(filename) in ("gateway", "asbp"):
            prof.inclusive[key] += cumtime
    return prof


def print_profile(title: str, prof: Profile, cpu_us_per_trip: float, unit: str) -> None:
    """Print shares of the server's work, and each as us of CPU per round trip."""
    print(f"\n{title}\n")
    if not prof.total:
        print("  no samples")
        return
    idle = 100 * prof.idle / (prof.total + prof.idle)
    print(
        f"  {prof.total:g} {unit} of work ({idle:.0f}% more in epoll_wait, left out); "
        f"server CPU {cpu_us_per_trip:.1f} us per round trip\n"
    )

    def row(value: float, name: str) -> str:
        share = value / prof.total
        return f"    {100 * share:5.1f}% {share * cpu_us_per_trip:5.1f} us  {name}"

    print("  self time by package:")
    for name, value in prof.self_by_package.most_common():
        print(row(value, name))
    print("  top functions by self time:")
    for name, value in prof.self_by_function.most_common(20):
        print(row(value, name))
    print("  gateway.* and asbp.* functions, inclusive time:")
    for name, value in prof.inclusive.most_common(20):
        print(row(value, name))


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


async def profile(
    target: Target, args: argparse.Namespace, private_pem: str, key: Path, tmp: Path
) -> None:
    """Profile ``target``'s server alone, under a pipelined or sequential load."""
    py_spy = _py_spy() if args.profiler == "py-spy" else None
    stem = f"{target.label.replace('/', '-')}-{args.profile_phase}"
    output = tmp / (f"{stem}.pyspy.txt" if py_spy else f"{stem}.pstats")
    server = ServerProcess(target, agent_key=key, cprofile=None if py_spy else output)
    await server.start()
    sequential_phase = args.profile_phase == "sequential"
    batch = 200 if sequential_phase else 2000

    async def load(user: ClientConnection, prefix: bytes, start: int) -> None:
        if sequential_phase:
            await sequential(user, prefix, batch, start)
        else:
            await pipelined(user, prefix, batch, args.window)

    try:
        async with session(target, server, private_pem) as (user, prefix):
            await pipelined(user, prefix, args.warmup * 5, args.window)
            requests = 0
            cpu0, began = server.cpu_seconds(), time.perf_counter()
            if py_spy:
                recorder = await asyncio.create_subprocess_exec(
                    py_spy, "record", "--pid", str(server.pid), "--rate", "250",
                    "--duration", str(args.profile_seconds),
                    "--format", "raw", "--output", str(output),
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                finished = asyncio.create_task(recorder.communicate())
                while not finished.done():
                    await load(user, prefix, requests)
                    requests += batch
                _, err = await finished
                if recorder.returncode != 0:
                    raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')}")
            else:
                while time.perf_counter() - began < args.profile_seconds:
                    await load(user, prefix, requests)
                    requests += batch
            elapsed = time.perf_counter() - began
            cpu_us = (server.cpu_seconds() - cpu0) / requests * 1e6
    finally:
        await server.stop()
    if args.keep_profile:
        args.keep_profile.mkdir(parents=True, exist_ok=True)
        shutil.copy(output, args.keep_profile / output.name)
    how = "py-spy samples" if py_spy else "cProfile"
    title = (
        f"Profile of {target.label}, {args.profile_phase} ({how}; "
        f"{requests / elapsed:,.0f} Commands/s while profiled)"
    )
    if py_spy:
        print_profile(title, _from_pyspy(output), cpu_us, "samples")
    else:  # cProfile also counts the server's start-up (imports) and its clients' handshakes
        print_profile(title, _from_pstats(output), cpu_us, "s")


def main() -> None:
    global TARGETS, RATIOS  # --metrics-cost measures other targets
    parser = argparse.ArgumentParser(
        description="Round trips User-Agent -> broker -> agent -> broker -> User-Agent."
    )
    parser.add_argument("--repeats", type=int, help="interleaved repeats (3; 1 with --quick)")
    parser.add_argument("--trips", type=int, default=2000, help="sequential round trips (2000)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up round trips (200)")
    parser.add_argument("--requests", type=int, default=20000, help="pipelined requests (20000)")
    parser.add_argument("--window", type=int, default=100, help="requests outstanding (100)")
    parser.add_argument("--quick", action="store_true", help="a short run (numbers are rough)")
    parser.add_argument(
        "--event-log",
        choices=["on", "off"],
        default="on",
        help="the brokers' event log (on, as brokers run by default)",
    )
    parser.add_argument(
        "--profile",
        nargs="+",
        default=[],
        metavar="TARGET",
        choices=["uvicorn", "hypercorn", "both", *(t.label for t in TARGETS)],
        help="then profile these targets; uvicorn, hypercorn and both mean the broker's",
    )
    parser.add_argument("--profile-seconds", type=int, default=10)
    parser.add_argument(
        "--profile-phase",
        choices=["pipelined", "sequential"],
        default="pipelined",
        help="the load to profile under (pipelined)",
    )
    parser.add_argument(
        "--profiler",
        choices=["py-spy", "cprofile"],
        default="py-spy",
        help="py-spy (sampling; cProfile if py-spy is not installed) or cProfile (exact, slow)",
    )
    parser.add_argument(
        "--profile-only", dest="skip_table", action="store_true", help="skip the benchmark"
    )
    parser.add_argument("--keep-profile", type=Path, metavar="DIR", help="copy raw profiles here")
    parser.add_argument("--json", metavar="PATH", help="write every sample here as JSON")
    parser.add_argument(
        "--metrics-cost",
        action="store_true",
        help="instead: the broker with metrics on against metrics off (goal: >= 0.97)",
    )
    parser.add_argument(
        "--raw-uvloop",
        action="store_true",
        help="also the raw websockets relay on uvloop (the stock one runs on asyncio's loop)",
    )
    parser.add_argument(
        "--loops",
        action="store_true",
        help="instead: each broker on uvloop and on asyncio's loop, beside raw on both",
    )
    args = parser.parse_args()
    if args.metrics_cost:
        TARGETS, RATIOS = METRICS_TARGETS, METRICS_RATIOS
    elif args.loops:
        TARGETS, RATIOS = LOOP_TARGETS, LOOP_RATIOS
    elif args.raw_uvloop:
        TARGETS, RATIOS = (*TARGETS, RAW_UVLOOP_TARGET), (*RATIOS, *RAW_UVLOOP_RATIOS)
    EVENT_LOG[0] = args.event_log
    if args.quick:
        args.trips, args.warmup, args.requests = 300, 50, 3000
        args.profile_seconds = min(args.profile_seconds, 3)
    args.repeats = args.repeats or (1 if args.quick else 3)
    aliases = {
        "uvicorn": ["broker/uvicorn"],
        "hypercorn": ["broker/hypercorn"],
        "both": ["broker/uvicorn", "broker/hypercorn"],
    }
    by_label = {t.label: t for t in TARGETS}
    args.profile = [by_label[x] for name in args.profile for x in aliases.get(name, [name])]
    if args.window > 256:
        parser.error("--window above 256 exceeds the broker's in-flight limit per Channel")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

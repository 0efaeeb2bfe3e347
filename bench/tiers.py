"""Round trips through the tiers: a 4-tier chain and a Broker-Agent against the direct path.

    python bench/tiers.py [--repeats N] [--requests N] [--window N] [--quick]

Three layouts, each run in one go with the same client (the SDK's
``UserAgent``, in this process) and the same Respondent code, interleaved in a
rotated order ``--repeats`` times:

============  =================================================================
direct        UA → broker B → examples/echo_agent.py (the baseline: one broker
              between the User-Agent and its Respondent)
four-tier     UA → broker A → examples/intermediary.py → broker B →
              examples/echo_agent.py (draft §3.4: every Command crosses two
              brokers and the Intermediary, both ways)
broker-agent  UA → examples/broker_agent.py, its Respondent in process (§3.2,
              three tiers: no broker, no Tube)
============  =================================================================

Brokers are ``python -m gateway --server uvicorn`` processes (memory engine,
event log on, as deployed); every program is its own process, started here
and stopped by its PID. Per layout and repeat: ``--requests`` sequential round
trips (p50 and p99, µs) after a warm-up, and ``--requests`` pipelined with
``--window`` outstanding (round trips per second, and the CPU every serving
process of the layout spent per round trip, from ``/proc/<pid>/task/*/schedstat``).
Each ratio against ``direct`` is computed within a repeat, and the median over
repeats printed. On a shared machine throughput swings most; the CPU per trip
is the steadiest figure.

What to expect: the four-tier chain does the direct path's work twice plus the
Intermediary's decode, re-encode and bookkeeping, so about half the direct
throughput and twice its latency is the natural ceiling on a machine whose
cores all processes share.
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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents import UserAgent, generate_agent_key  # noqa: E402  # after the path is set

LAYOUTS = ("direct", "four-tier", "broker-agent")
START_TIMEOUT = 60.0
BODY = b"x" * 64


class Child:
    """A child process whose merged output is read line by line (so its pipe never fills)."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.lines: list[str] = []
        self._arrived = asyncio.Event()
        assert process.stdout is not None
        self._reader = asyncio.create_task(self._read(process.stdout))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode("utf-8", "replace").rstrip())
            self._arrived.set()
        self._arrived.set()

    async def wait_line(self, matches: Callable[[str], bool]) -> str:
        seen = 0
        async with asyncio.timeout(START_TIMEOUT):
            while True:
                for line in self.lines[seen:]:
                    if matches(line):
                        return line
                seen = len(self.lines)
                if self._reader.done():
                    raise RuntimeError(f"{self.name} exited:\n" + "\n".join(self.lines[-30:]))
                self._arrived.clear()
                await self._arrived.wait()

    async def stop(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await self.process.wait()
            except TimeoutError:
                os.kill(self.process.pid, signal.SIGKILL)
                await self.process.wait()
        await self._reader


@contextlib.asynccontextmanager
async def child(args: list[str], name: str) -> AsyncIterator[Child]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    running = Child(process, name)
    try:
        yield running
    finally:
        await running.stop()


def _listening(line: str) -> bool:
    with contextlib.suppress(ValueError):
        record = json.loads(line)
        return isinstance(record, dict) and record.get("event") == "listening"
    return False


def cpu_ns(pids: list[int]) -> int:
    """CPU time the processes have used so far, every thread (``/proc/<pid>/task/*/schedstat``)."""
    total = 0
    for pid in pids:
        for schedstat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(schedstat.read_text().split()[0])
    return total


@dataclass(frozen=True)
class Layout:
    """Where a layout's User-Agent connects, and the processes that serve it."""

    url: str
    #: The serving processes, by name.
    pids: dict[str, int]


@contextlib.asynccontextmanager
async def broker(directory: Path, broker_id: str, identity: str) -> AsyncIterator[tuple[str, int]]:
    """``python -m gateway`` trusting ``identity``; yields its ``ws://`` base URL and PID."""
    config = directory / f"{broker_id}.toml"
    config.write_text(
        f'broker_id = "{broker_id}"\ninsecure_dev_tubes = true\n'
        f'data_dir = "{directory / broker_id}"\n'
        f'[agents.{identity}]\npublic_key = "{identity}.pem"\n'
    )
    args = [sys.executable, "-m", "gateway", "--config", str(config), "--server", "uvicorn"]
    args += ["--host", "127.0.0.1", "--port", "0", "--log-format", "json"]
    async with child(args, broker_id) as process:
        line = await process.wait_line(_listening)
        yield str(json.loads(line)["url"]).replace("http://", "ws://", 1), process.process.pid


def example(name: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / f"{name}.py")]


def write_key(directory: Path, identity: str) -> Path:
    private, public = generate_agent_key()
    (directory / f"{identity}.pem").write_text(public)
    key = directory / f"{identity}.key"
    key.write_text(private)
    return key


@contextlib.asynccontextmanager
async def layouts(directory: Path) -> AsyncIterator[dict[str, Layout]]:
    """Every program of the three layouts running; each layout's URL and processes."""
    echo_key, gate_key = write_key(directory, "echo"), write_key(directory, "gate")
    async with (
        broker(directory, "broker-b", "echo") as (url_b, pid_b),
        broker(directory, "broker-a", "gate") as (url_a, pid_a),
    ):
        agent_args = ["--url", url_b + "/tube", "--key-file", str(echo_key)]
        gate_args = ["--upstream", url_a + "/tube", "--identity", "gate"]
        gate_args += ["--key-file", str(gate_key), "--downstream", url_b + "/asbp"]
        gate_args += ["--name", "echo"]
        async with (
            child([*example("echo_agent"), *agent_args], "echo_agent") as agent,
            child([*example("broker_agent"), "--port", "0"], "broker_agent") as broker_agent,
        ):
            await agent.wait_line(lambda line: "serving echo and clock" in line)
            line = await broker_agent.wait_line(lambda line: line.startswith("listening "))
            url_ba = line.split()[1]
            async with child([*example("intermediary"), *gate_args], "intermediary") as gate:
                await gate.wait_line(lambda line: line.startswith("forwarding "))
                agent_pid, gate_pid = agent.process.pid, gate.process.pid
                yield {
                    "direct": Layout(url_b + "/asbp", {"broker B": pid_b, "agent": agent_pid}),
                    "four-tier": Layout(
                        url_a + "/asbp",
                        {
                            "broker A": pid_a,
                            "intermediary": gate_pid,
                            "broker B": pid_b,
                            "agent": agent_pid,
                        },
                    ),
                    "broker-agent": Layout(url_ba, {"broker-agent": broker_agent.process.pid}),
                }


async def measure(layout: Layout, requests: int, window: int) -> dict[str, float]:
    """Sequential latency, pipelined throughput and server CPU per trip through one layout."""
    async with UserAgent.websocket(layout.url) as ua:
        for _ in range(max(20, requests // 10)):  # warm-up: connections, caches, JIT-free paths
            await ua.request("echo", BODY, timeout=30)
        latencies: list[float] = []
        for _ in range(requests):
            started = time.perf_counter()
            reply = await ua.request("echo", BODY, timeout=30)
            latencies.append(time.perf_counter() - started)
            assert reply.body == BODY
        latencies.sort()
        slots = asyncio.Semaphore(window)

        async def one() -> None:
            async with slots:
                answer = await ua.request("echo", BODY, timeout=30)
                assert answer.body == BODY

        cpu_before = {name: cpu_ns([pid]) for name, pid in layout.pids.items()}
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        elapsed = time.perf_counter() - started
        cpu = {name: cpu_ns([pid]) - cpu_before[name] for name, pid in layout.pids.items()}
    sample = {
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
        "per_s": requests / elapsed,
        "cpu_us": sum(cpu.values()) / requests / 1e3,
    }
    sample.update({f"cpu_us {name}": ns / requests / 1e3 for name, ns in cpu.items()})
    return sample


async def run(repeats: int, requests: int, window: int) -> dict[str, list[dict[str, float]]]:
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix="asbp-tiers-") as folder:
        async with layouts(Path(folder)) as urls:
            for repeat in range(repeats):
                order = LAYOUTS[repeat % len(LAYOUTS) :] + LAYOUTS[: repeat % len(LAYOUTS)]
                for name in order:
                    samples[name].append(await measure(urls[name], requests, window))
                    print(f"  repeat {repeat + 1} {name}: {samples[name][-1]}", file=sys.stderr)
    return samples


def report(samples: dict[str, list[dict[str, float]]]) -> None:
    print(f"{'layout':<14}{'p50 us':>10}{'p99 us':>10}{'trips/s':>10}{'CPU us/trip':>13}")
    for name in LAYOUTS:
        rows = samples[name]
        print(
            f"{name:<14}"
            f"{statistics.median(r['p50_us'] for r in rows):>10.0f}"
            f"{statistics.median(r['p99_us'] for r in rows):>10.0f}"
            f"{statistics.median(r['per_s'] for r in rows):>10.0f}"
            f"{statistics.median(r['cpu_us'] for r in rows):>13.0f}"
        )
    for name in LAYOUTS:
        parts = [key for key in samples[name][0] if key.startswith("cpu_us ")]
        shares = ", ".join(
            f"{key.removeprefix('cpu_us ')} {statistics.median(r[key] for r in samples[name]):.0f}"
            for key in parts
        )
        print(f"  CPU us/trip by process, {name}: {shares}")
    base = samples["direct"]
    for name in ("four-tier", "broker-agent"):
        throughput = [r["per_s"] / b["per_s"] for r, b in zip(samples[name], base, strict=True)]
        latency = [r["p50_us"] / b["p50_us"] for r, b in zip(samples[name], base, strict=True)]
        cpu = [r["cpu_us"] / b["cpu_us"] for r, b in zip(samples[name], base, strict=True)]
        print(
            f"  ratio {name}/direct: throughput {statistics.median(throughput):.2f} "
            f"(range {min(throughput):.2f}-{max(throughput):.2f}), "
            f"p50 latency {statistics.median(latency):.2f} "
            f"(range {min(latency):.2f}-{max(latency):.2f}), "
            f"server CPU per trip {statistics.median(cpu):.2f} "
            f"(range {min(cpu):.2f}-{max(cpu):.2f})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="1 short repeat: rough numbers")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.requests, args.window = 1, 100, 10
    report(asyncio.run(run(args.repeats, args.requests, args.window)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Real processes for the tier examples: brokers (``python -m gateway``), examples, stopped by PID.

:class:`Process` runs one program with its standard output and error merged and
read line by line in the background (so a pipe never fills), and lets a test
wait for a line; :func:`broker_process` runs a broker from a TOML file on a free
port and yields its base URL once it logs ``listening``. Every process is
stopped by its own PID (SIGTERM, then SIGKILL after a deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from tests.support.timing import T

__all__ = ["ROOT", "Process", "broker_process", "example", "running_process"]

ROOT = Path(__file__).resolve().parents[2]


class Process:
    """One child process, its output lines collected as they come."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.lines: list[str] = []
        self._arrived = asyncio.Event()
        assert process.stdout is not None
        self._reader = asyncio.create_task(self._read(process.stdout))

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode("utf-8", "replace").rstrip("\n"))
            self._arrived.set()
        self._arrived.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    async def wait_line(self, matches: Callable[[str], bool], timeout: float = 30 * T) -> str:
        """The first line (seen so far or to come) that ``matches``.

        Raises:
            RuntimeError: the process ended without printing one.
            TimeoutError: not within ``timeout``.
        """
        seen = 0
        async with asyncio.timeout(timeout):
            while True:
                for line in self.lines[seen:]:
                    if matches(line):
                        return line
                seen = len(self.lines)
                if self._reader.done():
                    raise RuntimeError(f"{self.name} exited first:\n{self.output}")
                self._arrived.clear()
                await self._arrived.wait()

    async def wait(self, timeout: float = 30 * T) -> int:
        """Wait for the process to exit by itself; its exit status."""
        async with asyncio.timeout(timeout):
            code = await self.process.wait()
            await self._reader
        return code

    async def stop(self, signum: int = signal.SIGTERM, timeout: float = 20 * T) -> int:
        """Signal the process by its PID and wait for it (SIGKILL after ``timeout``)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)
            try:
                async with asyncio.timeout(timeout):
                    await self.process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                await self.process.wait()
        await self._reader
        code = self.process.returncode
        assert code is not None
        return code


@contextlib.asynccontextmanager
async def running_process(
    args: Sequence[str], name: str, *, env: dict[str, str] | None = None
) -> AsyncIterator[Process]:
    """``args`` run with this interpreter's environment and the project on the path."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    process = await asyncio.create_subprocess_exec(
        *args,
        cwd=ROOT,
        env=environment,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    running = Process(process, name)
    try:
        yield running
    finally:
        await running.stop()


def example(name: str) -> list[str]:
    """The command line of ``examples/<name>.py``."""
    return [sys.executable, str(ROOT / "examples" / f"{name}.py")]


@contextlib.asynccontextmanager
async def broker_process(
    directory: Path, broker_id: str, agents: Sequence[str] = (), **settings: float
) -> AsyncIterator[tuple[Process, str]]:
    """``python -m gateway`` on a free loopback port, trusting ``agents`` (``<id>.pem`` here).

    Yields the process and its base URL (``http://127.0.0.1:<port>``) once it
    listens. ``settings`` go into ``[tubes]`` (``respondent_timeout=...``).
    """
    lines = [
        f'broker_id = "{broker_id}"',
        "insecure_dev_tubes = true",
        f'data_dir = "{directory / "data"}"',
    ]
    if settings:
        lines.append("[tubes]")
        lines += [f"{key} = {value}" for key, value in settings.items()]
    for identity in agents:
        lines += [f"[agents.{identity}]", f'public_key = "{identity}.pem"']
    config = directory / f"{broker_id}.toml"
    config.write_text("\n".join(lines) + "\n")
    args = [sys.executable, "-m", "gateway", "--config", str(config)]
    args += ["--host", "127.0.0.1", "--port", "0", "--log-format", "json"]
    async with running_process(args, broker_id) as process:
        line = await process.wait_line(_listening)
        yield process, str(json.loads(line)["url"])


def _listening(line: str) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and record.get("event") == "listening"

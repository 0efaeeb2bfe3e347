"""A broker in its own process (``python -m gateway``), so that a test can SIGKILL it.

The in-thread servers of tests/support cannot be killed like a crash: they share the
test's process. Here the broker is a child process on a port it picks itself (port 0),
and the test learns its URL from the ``listening`` event of its JSON log, never by
waiting for time to pass.

WebSocket clients of a killed broker must be abandoned, not closed
(:func:`abandon`): a client that stopped reading while the broker was still
sending has its reading paused by flow control (more than ``max_queue`` frames
unread), so it never sees the kernel's end of the dead connection, and a
closing handshake would wait its whole ``close_timeout`` (10 s) for a peer
that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import orjson
from websockets.asyncio.client import ClientConnection, connect

from asbp import decode
from tests.support import T

__all__ = ["BrokerProcess", "abandon", "broker_process", "open_channel", "receive"]

ROOT = Path(__file__).resolve().parents[3]


class LogLines:
    """What a broker process wrote to its log, and a wait for a line."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self._changed = asyncio.Condition()

    async def add(self, line: bytes) -> None:
        async with self._changed:
            self.lines.append(line)
            self._changed.notify_all()

    async def wait_for(self, *needles: bytes, timeout: float = 5 * T) -> bytes:
        """The first line (since the start) holding every one of ``needles``."""
        with anyio.fail_after(timeout):
            async with self._changed:
                seen = 0
                while True:
                    for line in self.lines[seen:]:
                        if all(needle in line for needle in needles):
                            return line
                    seen = len(self.lines)
                    await self._changed.wait()


@dataclass(frozen=True, slots=True)
class BrokerProcess:
    """A running broker process and where its WebSocket transport listens."""

    process: asyncio.subprocess.Process
    #: ``ws://127.0.0.1:PORT/asbp``.
    url: str
    #: Its log lines, as they come (the JSON log on stderr).
    log: LogLines = field(default_factory=LogLines)

    async def kill(self) -> None:
        """SIGKILL the broker, as a crash would, and reap it."""
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()


@contextlib.asynccontextmanager
async def broker_process(
    redis_url: str,
    directory: Path,
    *,
    ack_timeout: float,
    prefetch: int,
    settings: str = "",
    host: str = "127.0.0.1",
    port: int = 0,
) -> AsyncIterator[BrokerProcess]:
    """``python -m gateway --engine redis`` on a free port; stopped with SIGTERM at the end.

    Args:
        redis_url: the Redis every broker of the test shares.
        directory: a new directory for its config file and ``data_dir``.
        ack_timeout: its ``[messaging] ack_timeout``: the leases it takes last this long.
        prefetch: its ``[messaging] prefetch``: unacknowledged messages per subscriber.
        settings: top-level TOML lines before the tables (``bus_lease = 1.5``).
        host: the loopback address to listen on (brokers behind one name use
            127.0.0.2, 127.0.0.3, ... on one port).
        port: the port; 0 picks a free one.
    """
    directory.mkdir(parents=True)
    config = directory / "broker.toml"
    config.write_text(
        f"{settings}[messaging]\nack_timeout = {ack_timeout}\nprefetch = {prefetch}\n"
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway",
        "--config", str(config),
        "--engine", "redis", "--redis-url", redis_url,
        "--host", host, "--port", str(port),
        "--data-dir", str(directory),
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
        with anyio.fail_after(30 * T):
            url = await _listening(stderr)

        running = BrokerProcess(process, url)

        async def drain_stderr() -> None:  # a full pipe would block the broker
            # Kept in its directory too: what a failed test's broker said.
            with (directory / "broker.log").open("wb") as kept:
                while line := await stderr.readline():
                    kept.write(line)
                    await running.log.add(line)

        drain = asyncio.create_task(drain_stderr())
        yield running
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30 * T):
                await process.wait()
        if drain is not None:
            await drain


async def _listening(stderr: asyncio.StreamReader) -> str:
    """The WebSocket URL from the broker's ``listening`` log event."""
    while True:
        line = await stderr.readline()
        assert line, "the broker exited before listening"
        if line.startswith(b"{"):
            event = orjson.loads(line)
            if event.get("event") == "listening":
                return str(event["url"]).replace("http://", "ws://", 1) + "/asbp"


async def open_channel(url: str) -> ClientConnection:
    """A User-Agent's WebSocket, past the broker's ``asbp.channel`` greeting."""
    connection = await connect(url, compression=None, max_size=None)
    greeting = decode(await receive(connection))
    assert greeting.name == "asbp.channel", greeting
    return connection


async def receive(connection: ClientConnection) -> bytes:
    """The next frame, as bytes."""
    frame = await connection.recv()
    return frame.encode() if isinstance(frame, str) else frame


def abandon(connection: ClientConnection) -> None:
    """Drop the connection to a killed broker without a closing handshake."""
    connection.transport.abort()

"""Helpers for the agent SDK's tests: real brokers, agents, and a TCP proxy to cut.

:func:`running_broker` serves a broker on Hypercorn (or Uvicorn) on loopback through
``serve_app_async``; :func:`make_credentials` writes the public key where that broker
looks. Connections are cut with :class:`TcpProxy`, a small forwarding proxy the test
controls, rather than by timing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import (
    AgentCredentialSource,
    ApplicationAgent,
    Backoff,
    Request,
    generate_agent_key,
)
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from tests.support import RunningServer, ServerName, T, serve_app_async

AUDIENCE = "asbp-broker"
#: Reconnect quickly in tests; still exponential with full jitter.
FAST = Backoff(initial=0.02 * T, maximum=0.2 * T)


def make_credentials(directory: Path, identity: str = "echo") -> AgentCredentialSource:
    """A new key pair: the public PEM goes where the broker looks, the private stays here."""
    private, public = generate_agent_key()
    (directory / f"{identity}.pem").write_text(public)
    return AgentCredentialSource(identity, private, audience=AUDIENCE)


def broker_config(
    tmp_path: Path, broker_id: str = "broker-a", identities: tuple[str, ...] = ("echo",)
) -> GatewayConfig:
    return GatewayConfig(
        data_dir=tmp_path,
        broker_id=broker_id,
        insecure_dev_tubes=True,
        agents={identity: {"public_key": f"{identity}.pem"} for identity in identities},
        agents_base_dir=tmp_path,
    )


@contextlib.asynccontextmanager
async def running_broker(
    tmp_path: Path,
    broker_id: str = "broker-a",
    identities: tuple[str, ...] = ("echo",),
    server: ServerName = "hypercorn",
) -> AsyncIterator[RunningServer]:
    app = create_app(broker_config(tmp_path, broker_id, identities))
    async with serve_app_async(app, server=server) as running:
        yield running


def tube_url(server: RunningServer) -> str:
    return server.ws_url + "/tube"


def make_agent(
    credentials: AgentCredentialSource, urls: list[str], **options: Any
) -> ApplicationAgent:
    options.setdefault("backoff", FAST)
    options.setdefault("timeout", 5 * T)
    return ApplicationAgent(credentials.identity, credentials, urls, **options)


def install_echo(agent: ApplicationAgent) -> None:
    @agent.respondent("echo")
    async def echo(request: Request) -> bytes:
        return request.body


class TcpProxy:
    """Forwards a loopback port to ``target``; the test can repoint it or cut it.

    ``cut()`` aborts every forwarded connection at once (both directions)
    and refuses new ones until ``target`` is set again: a broker that went
    away, without waiting for any server's graceful shutdown.
    """

    def __init__(self) -> None:
        self.target: int | None = None
        self.port = 0
        self.forwarded = 0
        self._changed = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/tube"

    def cut(self) -> None:
        self.target = None
        for writer in list(self._writers):
            writer.transport.abort()

    async def wait_forwarded(self, count: int) -> None:
        """Wait until ``count`` connections have reached a target in all."""
        async with asyncio.timeout(10 * T):
            while self.forwarded < count:
                changed = self._changed
                await changed.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            target = self.target
            if target is None:
                return
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    "127.0.0.1", target
                )
            except OSError:
                return
            self._writers.update((writer, upstream_writer))
            self.forwarded += 1
            self._changed.set()
            self._changed = asyncio.Event()
            await asyncio.gather(
                self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
            )
        finally:
            writer.transport.abort()
            self._handlers.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass  # the socket edge: the other side is gone, and so is this pipe
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

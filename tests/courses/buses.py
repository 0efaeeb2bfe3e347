"""Buses for the Course tests: keys, configuration, a relay between them, signed-in users.

Each bus has its own directory holding its signing key, the public keys of its peers,
and an agent (``signin``) that signs Subjects in with the Conversation-Address
``<name>*<domain>``. Peers reach each other through a :class:`Relay`, a loopback TCP
forwarder started first, so every bus knows its peers' URLs before any of them
starts, and a test can cut a link or hold a peer's acknowledgements back without
waiting for time to pass. TLS passes through the relay untouched: the certificate
checked is the broker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect

from agents import AgentCredentialSource, ApplicationAgent, Request, generate_agent_key
from asbp import Command, decode, encode
from gateway.app import create_app
from gateway.config.model import GatewayConfig, TlsConfig
from tests.support import RunningServer, T, TlsFiles, serve_app_async
from tests.support.agents import FAST
from tests.support.tls import client_ssl_context

__all__ = [
    "LOGIN",
    "Bus",
    "Relay",
    "User",
    "bus_config",
    "make_bus",
    "serve_bus",
    "signin_agent",
    "user",
]

LOGIN = "login"


@dataclass(frozen=True, slots=True, eq=False)
class Bus:
    """One bus's files: its directory, domain and keys."""

    directory: Path
    domain: str
    #: The signin agent's credentials.
    signin: AgentCredentialSource

    @property
    def public_key(self) -> Path:
        return self.directory / "bus.pub.pem"


def make_bus(root: Path, domain: str) -> Bus:
    """A directory with a fresh signing key for ``domain`` and a signin agent's key."""
    directory = root / domain
    directory.mkdir(parents=True, exist_ok=True)
    private, public = generate_agent_key()
    (directory / "bus.pem").write_text(private)
    (directory / "bus.pub.pem").write_text(public)
    agent_private, agent_public = generate_agent_key()
    (directory / "signin.pem").write_text(agent_public)
    return Bus(
        directory, domain, AgentCredentialSource("signin", agent_private, audience="asbp-broker")
    )


def bus_config(
    bus: Bus,
    peers: Mapping[Bus, str | list[str]],
    *,
    tls: TlsFiles | None,
    names: tuple[str, ...] = ("chat.*",),
    routes: Mapping[Bus, list[str]] | None = None,
    courses: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> GatewayConfig:
    """A broker of ``bus`` with a Course to each of ``peers`` (domain -> URLs)."""
    table: dict[str, Any] = {
        "domain": bus.domain,
        "signing_key": "bus.pem",
        "backoff_min": 0.02 * T,
        "backoff_max": 0.2 * T,
    }
    if tls is not None:
        table["ca"] = str(tls.ca)
    table.update(courses or {})
    for peer, urls in peers.items():
        key = bus.directory / f"{peer.domain}.pub.pem"
        key.write_bytes(peer.public_key.read_bytes())
        table[peer.domain] = {
            "urls": [urls] if isinstance(urls, str) else urls,
            "public_key": key.name,
            "names": list(names),
            "routes": (routes or {}).get(peer, []),
        }
    overrides.setdefault("insecure_dev_tubes", True)
    return GatewayConfig(
        data_dir=bus.directory,
        broker_id=bus.domain.replace(".", "-"),
        authenticate_command=LOGIN,
        agents={"signin": {"public_key": "signin.pem", "serves": [LOGIN]}},
        agents_base_dir=bus.directory,
        courses=table,
        tls=None if tls is None else _tls_config(tls),
        **overrides,
    )


def _tls_config(tls: TlsFiles) -> TlsConfig:
    return TlsConfig(certfile=tls.cert, keyfile=tls.key)


def signin_agent(bus: Bus, url: str, tls: TlsFiles | None) -> ApplicationAgent:
    """The agent that signs ``<body>`` in as ``<body>*<domain>``."""
    agent = ApplicationAgent(
        "signin",
        bus.signin,
        [url],
        backoff=FAST,
        timeout=5 * T,
        ssl=None if tls is None else client_ssl_context(tls),
    )

    @agent.respondent(LOGIN)
    async def login(request: Request) -> None:
        name = request.body.decode()
        await request.authenticate("user", address=f"{name}*{bus.domain}")

    return agent


@dataclass
class User:
    """A User-Agent's WebSocket with one Subject signed in."""

    ws: ClientConnection
    subject: str
    address: str
    received: list[Command] = field(default_factory=list)

    async def send(self, command: Command) -> None:
        await self.ws.send(encode(command.with_keys(s=self.subject)))

    async def recv(self) -> Command:
        frame = await asyncio.wait_for(self.ws.recv(), 10 * T)
        command = decode(_bytes(frame))
        self.received.append(command)
        return command


def _bytes(frame: str | bytes) -> bytes:
    return frame.encode() if isinstance(frame, str) else frame


@contextlib.asynccontextmanager
async def user(server_url: str, name: str, tls: TlsFiles | None) -> AsyncIterator[User]:
    """A Channel to ``server_url`` (``ws(s)://host:port``) with ``name`` signed in."""
    ssl = None if tls is None else client_ssl_context(tls)
    async with connect(
        server_url + "/asbp", ssl=ssl, ping_interval=None, close_timeout=2 * T
    ) as ws:
        greeting = decode(_bytes(await asyncio.wait_for(ws.recv(), 5 * T)))
        assert greeting.name == "asbp.channel", greeting
        await ws.send(f"c={LOGIN},u=1;{name}")
        answer = decode(_bytes(await asyncio.wait_for(ws.recv(), 5 * T)))
        assert answer.name == "asbp.authenticated", answer
        subject = answer.subject_id
        address = answer.publisher
        assert subject is not None and address is not None, answer
        yield User(ws, subject, address)


@contextlib.asynccontextmanager
async def serve_bus(
    bus: Bus,
    config: GatewayConfig,
    tls: TlsFiles | None,
    log: logging.Logger | None = None,
    *,
    app: Starlette | None = None,
    **serving: Any,
) -> AsyncIterator[RunningServer]:
    """The bus's broker, in this process, with its signin agent registered;
    ``serving`` goes to :func:`~tests.support.serve_app_async` (``server``, ``h2``).
    ``app``: the broker already made from ``config`` (``create_app``), for a test
    that looks at its state (``app.state.courses``); None: made here."""
    async with contextlib.AsyncExitStack() as stack:
        if app is None:
            app = create_app(config, log=log)
        running = await stack.enter_async_context(serve_app_async(app, tls=tls, **serving))
        agent = signin_agent(bus, running.ws_url + "/tube", tls)
        await stack.enter_async_context(agent)
        await agent.wait_registered(10 * T)
        yield running


class Relay:
    """Forwards a loopback port to a broker's; can cut, and hold back what comes back.

    ``hold_back`` keeps every byte the broker sends from reaching the dialler from
    then on (the acknowledgements of a Course), as a receiver killed before it could
    acknowledge would; :meth:`stall` stops reading what the dialler sends until
    :meth:`resume`, as a peer too slow to read would, so that the dialler's socket
    fills; ``cut()`` aborts every connection and refuses new ones until ``target`` is
    set again.
    """

    def __init__(self) -> None:
        self.target: int | None = None
        self.port = 0
        self.hold_back = False
        self.connections = 0
        self._changed = asyncio.Event()
        #: Set while what the dialler sends is read (see :meth:`stall`).
        self._reading = asyncio.Event()
        self._reading.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    def url(self, scheme: str = "wss") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/course"

    def cut(self) -> None:
        self.target = None
        self.hold_back = False
        self._reading.set()
        for writer in list(self._writers):
            writer.transport.abort()

    def stall(self) -> None:
        """Stop reading what the dialler sends (it stays in the sockets' buffers)."""
        self._reading.clear()

    def resume(self) -> None:
        """Read what the dialler sends again."""
        self._reading.set()

    async def drain(self) -> None:
        """Cut, and wait until every connection it forwarded has ended on both sides."""
        self.cut()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def wait_connections(self, count: int) -> None:
        """Until ``count`` connections have been forwarded in all."""
        async with asyncio.timeout(20 * T):
            while self.connections < count:
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
            if self.target is None:  # cut while connecting: this one must not survive it
                upstream_writer.transport.abort()
                return
            self._writers.update((writer, upstream_writer))
            self.connections += 1
            self._changed.set()
            self._changed = asyncio.Event()
            await asyncio.gather(
                self._pipe(reader, upstream_writer, back=False),
                self._pipe(upstream_reader, writer, back=True),
            )
        finally:
            writer.transport.abort()
            self._handlers.discard(task)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, back: bool
    ) -> None:
        try:
            while True:
                if not back:
                    await self._reading.wait()
                data = await reader.read(65536)
                if not data:
                    break
                if back and self.hold_back:
                    continue  # held back: the dialler never sees it
                writer.write(data)
                await writer.drain()
        except OSError:
            pass  # the socket edge: the other side is gone, and so is this pipe
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

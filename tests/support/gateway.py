"""End-to-end broker tests: a real broker on a real server, real clients.

Theory of operation
-------------------
Every test gets a fresh broker (``create_app``) served by a real Hypercorn or Uvicorn on
``127.0.0.1`` port 0 (:func:`tests.support.serve_app_async`; the fixtures
``make_gateway`` and ``gateway`` live in tests/gateway/conftest.py), in a thread with its own
event loop. User-Agents and Application-Agents are ``websockets`` clients, ``httpx`` or
``curl``; agents authenticate with credentials minted by ``agents.credentials`` for keys
generated once per session.

Two windows into the running broker, both without sleeping:

* :class:`BrokerProbe` wraps the app and keeps the lifespan state and the server's event
  loop, so a test can run a function against the real ``Broker`` *inside its loop*
  (``await gateway.call(lambda broker: broker.expire_idle_channels())``). The broker is
  not thread-safe, so nothing touches it from the test's thread.
* :class:`LogEvents` is a logging handler on the broker's own logger (``create_app(...,
  log=...)``): ``await gateway.events.wait("channel.close", channel=cid)`` resolves when
  the broker logs that event, from whichever thread.

Clients opened through :class:`Gateway` are closed before the server stops: Hypercorn would
otherwise wait out its graceful timeout for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import logging
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect

import asbp
from agents.credentials import mint_agent_token
from asbp import Command
from gateway.broker import Broker
from tests.support import (
    RunningServer,
    ServerName,
    T,
    TlsFiles,
    client_ssl_context,
)

R = TypeVar("R")

#: Both servers; parametrise ``server_name`` with this where the transport matters.
SERVERS: tuple[ServerName, ...] = ("hypercorn", "uvicorn")
#: The Application-Agent identities every test broker trusts.
AGENTS: tuple[str, ...] = ("billing", "search")
AUDIENCE = "asbp-broker"
BROKER_ID = "broker-under-test"


# --------------------------------------------------------------------------
# Windows into the broker


class BrokerProbe:
    """An ASGI wrapper that remembers the lifespan state and the serving loop."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._state: dict[str, Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_request: Callable[[Scope], None] | None = None
        self._on_finish: Callable[[Scope], None] | None = None
        #: Set: WebSocket requests wait on it before the app sees them (hold_websockets).
        self._hold: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self._state = scope["state"]
            self._loop = asyncio.get_running_loop()
            await self._app(scope, receive, send)
            return
        if self._on_request is not None:
            self._on_request(scope)
        hold = self._hold
        if hold is not None and scope["type"] == "websocket":
            await hold.wait()
        try:
            await self._app(scope, receive, send)
        finally:
            if self._on_finish is not None:
                self._on_finish(scope)

    def on_request(self, callback: Callable[[Scope], None] | None) -> None:
        """Call ``callback(scope)`` in the server's loop as each request enters the app."""
        self._on_request = callback

    def on_finish(self, callback: Callable[[Scope], None] | None) -> None:
        """Call ``callback(scope)`` in the server's loop as each request leaves the app.

        For a WebSocket, the app leaves after its reader saw the disconnect, so every
        frame the client sent before closing has been handed to the router by then.
        """
        self._on_finish = callback

    @property
    def state(self) -> dict[str, Any]:
        """The lifespan state (what the app's handlers find in ``scope["state"]``)."""
        assert self._state is not None, "the lifespan has not run"
        return self._state

    async def hold_websockets(self, held: bool) -> None:
        """Hold WebSocket requests (True) before the app sees them, so that their
        handshakes stay in flight in the server, or let every held one go (False)."""
        assert self._loop is not None, "the lifespan has not run"

        async def switch() -> None:
            if held:
                self._hold = self._hold or asyncio.Event()
            elif self._hold is not None:
                self._hold.set()
                self._hold = None

        future = asyncio.run_coroutine_threadsafe(switch(), self._loop)
        await asyncio.wait_for(asyncio.wrap_future(future), 5 * T)

    @contextlib.asynccontextmanager
    async def loop_stopped(self) -> AsyncIterator[None]:
        """Keep the server's event loop from running (it waits in a call of ours) while
        the block runs, as a server far behind its work is: what clients send meanwhile
        waits in the kernel, and is read all at once after the block."""
        assert self._loop is not None, "the lifespan has not run"
        stopped = threading.Event()
        go_on = threading.Event()

        def wait() -> None:
            stopped.set()
            go_on.wait(10 * T)

        self._loop.call_soon_threadsafe(wait)
        try:
            assert await asyncio.to_thread(stopped.wait, 5 * T), "the server's loop is busy"
            yield
        finally:
            go_on.set()

    async def call(self, function: Callable[[Broker], R]) -> R:
        """Run ``function(broker)`` in the server's event loop and return its result."""
        assert self._state is not None and self._loop is not None, "the lifespan has not run"
        broker: Broker = self._state["broker"]

        async def run() -> R:
            return function(broker)

        future = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), 5 * T)


class LogEvents(logging.Handler):
    """Every record the broker logs, and a way to await one."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(logging.DEBUG)
        self._loop = loop
        self._mutex = threading.Lock()
        self.records: list[logging.LogRecord] = []
        self._waiters: list[tuple[Callable[[logging.LogRecord], bool], asyncio.Future[Any]]] = []

    @staticmethod
    def _matcher(event: str, fields: Mapping[str, object]) -> Callable[[logging.LogRecord], bool]:
        def matches(record: logging.LogRecord) -> bool:
            return record.getMessage() == event and all(
                getattr(record, k, None) == v for k, v in fields.items()
            )

        return matches

    def emit(self, record: logging.LogRecord) -> None:
        with self._mutex:
            self.records.append(record)
            for matches, future in self._waiters:
                if matches(record):
                    self._loop.call_soon_threadsafe(_resolve, future, record)

    def find(self, event: str, **fields: object) -> list[logging.LogRecord]:
        """The records logged so far for ``event`` with these attributes."""
        matches = self._matcher(event, fields)
        with self._mutex:
            return [r for r in self.records if matches(r)]

    async def wait(
        self, event: str, *, timeout: float = 5 * T, **fields: object
    ) -> logging.LogRecord:
        """The first record for ``event`` with these attributes, waiting up to ``timeout``."""
        matches = self._matcher(event, fields)
        future: asyncio.Future[logging.LogRecord] = self._loop.create_future()
        entry = (matches, future)
        with self._mutex:
            for record in self.records:
                if matches(record):
                    return record
            self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            with self._mutex:
                self._waiters.remove(entry)


def _resolve(future: asyncio.Future[Any], value: object) -> None:
    if not future.done():
        future.set_result(value)


# --------------------------------------------------------------------------
# Clients


def decode(frame: str | bytes | bytearray) -> Command:
    """Decode a received WebSocket message or HTTP body."""
    return asbp.decode(frame.encode("utf-8") if isinstance(frame, str) else bytes(frame))


def assert_fault(command: Command, code: int, *, u: int | None = None) -> None:
    """``command`` is the broker's fault ``code``, carrying ``u`` exactly when given."""
    assert command.name == "asbp.fault", command
    assert command.get("code") == str(code), command
    assert command.get("u") == (None if u is None else str(u)), command
    assert command.get("e") == "UTF-8", command
    assert command.body, command  # a message for people


@dataclass(eq=False)
class Peer:
    """A WebSocket client: a User-Agent on a Channel, or an Application-Agent on a Tube."""

    ws: ClientConnection
    #: The first Command the broker sent (``asbp.channel`` or ``asbp.tube``).
    greeting: Command

    @property
    def id(self) -> str:
        """The Channel-Identifier (User-Agent) or verified identity (agent)."""
        value = self.greeting.get("i") or self.greeting.get("a")
        assert isinstance(value, str)
        return value

    async def send(self, command: Command | bytes | str) -> None:
        await self.ws.send(asbp.encode(command) if isinstance(command, Command) else command)

    async def recv_raw(self) -> str | bytes:
        return await asyncio.wait_for(self.ws.recv(), 5 * T)

    async def recv(self) -> Command:
        return decode(await self.recv_raw())

    async def request(self, command: Command | bytes | str) -> Command:
        """Send ``command`` and return the next Command received."""
        await self.send(command)
        return await self.recv()

    async def close(self) -> None:
        await self.ws.close()


async def agent_answers(user: Peer, agent: Peer, n: int) -> None:
    """A User-Agent's Command reaches the agent and its reply comes back (no engine needed)."""
    await user.send(Command(c="echo", u=n))
    command = await agent.recv()
    assert command.name == "echo", command
    await agent.send(Command(c="echo.reply", d=command.get("i"), u=n))
    reply = await user.recv()
    assert (reply.name, reply.get("u")) == ("echo.reply", str(n)), reply


@dataclass(eq=False)
class HttpChannel:
    """A stateless HTTP User-Agent over an ``httpx`` client."""

    client: httpx.AsyncClient
    url: str
    id: str = ""
    #: The highest ``ASBP-Seq`` read so far, sent back as ``after``.
    seen: int = 0
    #: The Channel's secret, from ``asbp.accepted``; sent as ``ASBP-Secret``.
    secret: str = ""

    def _headers(self) -> dict[str, str]:
        return {"ASBP-Secret": self.secret} if self.secret else {}

    async def post(self, frame: Command | bytes) -> tuple[int, Command]:
        response = await self.post_response(frame)
        return response.status_code, decode(response.content)

    async def post_response(self, frame: Command | bytes) -> httpx.Response:
        """The whole response to a POST of ``frame``, headers included."""
        body = asbp.encode(frame) if isinstance(frame, Command) else frame
        return await self.client.post(
            self.url,
            content=body,
            headers={"Content-Type": "application/asbp", **self._headers()},
        )

    async def open(self) -> HttpChannel:
        status, reply = await self.post(Command(c="asbp.channel"))
        assert status == 200, reply
        assert reply.name == "asbp.accepted"
        assert reply.channel_id is not None
        self.id = reply.channel_id
        secret = reply.get("secret")
        assert isinstance(secret, str), reply
        self.secret = secret
        return self

    async def poll_response(self, *, after: int | None = None, wait: float = 0) -> httpx.Response:
        params = {"i": self.id, "after": str(self.seen if after is None else after)}
        params["wait"] = f"{wait:g}"
        return await self.client.get(self.url, params=params, headers=self._headers())

    async def poll(
        self, *, after: int | None = None, wait: float = 5 * T
    ) -> list[tuple[int, Command]]:
        """Long-poll; return ``(ASBP-Seq, Command)`` pairs and remember the last seq."""
        response = await self.poll_response(after=after, wait=wait)
        if response.status_code == 204:
            return []
        assert response.status_code == 200, (response.status_code, response.content)
        parts = parse_multipart(response.headers["content-type"], response.content)
        if parts:
            self.seen = parts[-1][0]
            assert response.headers["asbp-last-seq"] == str(self.seen)
        return [(seq, decode(frame)) for seq, frame in parts]


def parse_multipart(content_type: str, body: bytes) -> list[tuple[int, bytes]]:
    """Read a ``multipart/mixed`` long-poll body with the standard library's MIME parser.

    Returns ``(ASBP-Seq, frame)`` per part, checking each part's headers on the way.
    """
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    assert message.get_content_type() == "multipart/mixed"
    assert message.is_multipart()
    parts: list[tuple[int, bytes]] = []
    for part in message.iter_parts():
        assert part.get_content_type() == "application/asbp"
        frame = part.get_payload(decode=True)
        assert isinstance(frame, bytes)
        assert int(part["Content-Length"]) == len(frame)
        parts.append((int(part["ASBP-Seq"]), frame))
    return parts


async def run_curl(*args: str, data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """Run ``curl -s -i``; return the status, headers (lowercase names) and body."""
    options = ["-s", "-S", "-i", "--max-time", f"{5 * T:g}"]
    if data is not None:
        options += ["--data-binary", "@-", "-H", "Content-Type: application/asbp"]
    process = await asyncio.create_subprocess_exec(
        "curl",
        *options,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(data), 10 * T)
    assert process.returncode == 0, stderr
    head, _, body = stdout.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


# --------------------------------------------------------------------------
# The broker under test


@dataclass(frozen=True)
class AgentKeys:
    """A private PEM per identity in :data:`AGENTS`, plus one nobody trusts."""

    private: Mapping[str, str]
    public: Mapping[str, str]
    stranger: str


@dataclass(eq=False)
class Gateway:
    """A running broker and the means to talk to it."""

    server: RunningServer
    probe: BrokerProbe
    events: LogEvents
    keys: AgentKeys
    tls: TlsFiles | None
    stack: contextlib.AsyncExitStack
    broker_id: str = BROKER_ID

    @property
    def url(self) -> str:
        """``http(s)://127.0.0.1:PORT/asbp``."""
        return f"{self.server.http_url}/asbp"

    def ssl(self) -> Any:
        return None if self.tls is None else client_ssl_context(self.tls)

    async def call(self, function: Callable[[Broker], R]) -> R:
        return await self.probe.call(function)

    def finished(self, ws: ClientConnection) -> asyncio.Event:
        """An event set once the app has finished with ``ws``'s connection."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        port = ws.local_address[1]

        def on_finish(scope: Scope) -> None:
            client = scope.get("client")
            if client and client[1] == port:
                loop.call_soon_threadsafe(done.set)

        self.probe.on_finish(on_finish)
        return done

    def token(self, identity: str = "billing", **options: Any) -> str:
        """A fresh credential for ``identity`` signed with its configured key."""
        key = options.pop("key", None) or self.keys.private[identity]
        return mint_agent_token(identity, key, audience=AUDIENCE, **options)

    async def websocket(self, path: str, **options: Any) -> ClientConnection:
        options.setdefault("ping_interval", None)
        options.setdefault("close_timeout", 2 * T)
        options.setdefault("open_timeout", 5 * T)
        if self.tls is not None:
            options.setdefault("ssl", self.ssl())
        ws = await connect(f"{self.server.ws_url}{path}", **options)
        self.stack.push_async_callback(ws.close)
        return ws

    async def channel(self, **options: Any) -> Peer:
        """Open a WebSocket Channel and read its ``asbp.channel`` greeting."""
        ws = await self.websocket("/asbp", **options)
        greeting = decode(await asyncio.wait_for(ws.recv(), 5 * T))
        assert greeting.name == "asbp.channel", greeting
        return Peer(ws, greeting)

    async def tube_connection(
        self, identity: str = "billing", *, token: str | None = None, **options: Any
    ) -> ClientConnection:
        """Open a Tube's WebSocket with a Bearer credential; no greeting read."""
        credential = self.token(identity) if token is None else token
        headers = {"Authorization": f"Bearer {credential}"}
        return await self.websocket("/tube", additional_headers=headers, **options)

    async def tube(
        self, identity: str = "billing", *, serves: tuple[str, ...] = (), **options: Any
    ) -> Peer:
        """Open a Tube, read its ``asbp.tube`` greeting and register ``serves``."""
        ws = await self.tube_connection(identity, **options)
        greeting = decode(await asyncio.wait_for(ws.recv(), 5 * T))
        assert greeting.name == "asbp.tube", greeting
        agent = Peer(ws, greeting)
        if serves:
            reply = await agent.request(Command(c="asbp.register", names=list(serves), u=0))
            assert reply.name == "asbp.accepted", reply
        return agent

    async def http_client(self, **options: Any) -> httpx.AsyncClient:
        if self.tls is not None:
            options.setdefault("verify", self.ssl())
        client = httpx.AsyncClient(timeout=10 * T, **options)
        await self.stack.enter_async_context(client)
        return client

    async def http_channel(self, **options: Any) -> HttpChannel:
        """Open a stateless HTTP Channel (``POST c=asbp.channel;``)."""
        return await HttpChannel(await self.http_client(**options), self.url).open()


#: ``make_gateway`` (tests/gateway/conftest.py): ``await make_gateway(server=..., **config)``.
GatewayFactory = Callable[..., Awaitable[Gateway]]


def small_receive_buffer_socket(port: int, size: int = 4096) -> socket.socket:
    """A connected client socket whose receive buffer is fixed at ``size`` bytes.

    Fixing ``SO_RCVBUF`` before ``connect`` turns off the kernel's receive-buffer
    autotuning (which on loopback grows to tens of MiB), so a client that stops reading
    makes the broker's writes block after a few KiB instead of many MiB.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        sock.settimeout(5 * T)
        sock.connect(("127.0.0.1", port))  # loopback: immediate, no need to await it
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock

"""Tubes, the agent side: one WebSocket per broker URL, kept open.

Theory of operation
-------------------
A :class:`TubeLink` owns one broker URL for the life of the agent (draft
§3.1.1: an Application-Agent is wired to several Brokers at once, and each
link lives and dies on its own). Its task loops::

    mint a fresh credential ─► dial ─► read the asbp.tube greeting
        ─► on_open(session)            (the agent registers its Respondents)
        ─► read Commands until the connection ends
        ─► wait backoff.delay(attempt) (after any Retry-After) ─► dial again

A credential is good for one handshake (the broker refuses a replayed
``jti``), so every attempt mints a new one. A refused handshake (HTTP 401 or
403) is retried like any other failure, because the usual cause (a key not
yet deployed to the broker) heals without restarting the agent, but it is
logged at ERROR each time so that nobody mistakes it for a network blip.
The attempt counter resets once a session has been greeted.

A :class:`TubeSession` is one greeted connection. It is what a request's
reply goes out on: a reply must leave on the Tube its request came in on,
and if that connection is gone the reply has nowhere to go (the broker has
already told the User-Agent, with fault 2102). ``session.call`` sends a
Command with a fresh ``u`` and awaits the Command that answers it:
``asbp.accepted``, ``asbp.pong``, ``asbp.commands`` or ``asbp.fault`` from the
broker, or an agent-to-agent answer arriving on the caller's inbox.

Matching by ``u`` alone is not enough. The ``u`` values the SDK picks for its
own Commands share one space with the ``u`` of User-Agent requests the agent
answers, and the broker's fault about a reply (2104: that Channel is gone)
carries the *User-Agent's* ``u``. So a fault resolves a pending call only if
its ``cause`` names the Command the call sent, and answers from the broker
must carry neither ``a`` nor ``i`` (the broker adds ``a`` to everything an
agent sends and ``i`` to everything a User-Agent sends, so neither can forge
one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

import asbp
from agents import control
from agents.backoff import Backoff
from agents.credentials import AgentCredentialSource
from agents.errors import AgentError, ConnectionLost, FaultError
from agents.retry_after import retry_after_in, wait_before
from asbp import Command, ProtocolError

__all__ = ["Greeting", "TubeLink", "TubeSession"]

#: The subprotocol the broker selects for ASBP.
SUBPROTOCOL: Final = Subprotocol("asbp")

#: HTTP statuses that mean the broker refused who we are, not that it is down.
_REFUSED: Final = frozenset({401, 403})
#: The close code of a handshake refused after the WebSocket was accepted.
_CLOSE_POLICY: Final = 1008


class _Refused(AgentError):
    """The broker refused the Tube without an HTTP status."""


@dataclass(frozen=True, slots=True)
class Greeting:
    """What the broker's ``asbp.tube`` told us: our verified identity and its own."""

    #: ``a``, the identity the broker verified from the credential.
    agent_id: str
    #: ``b``, the Broker-Identifier.
    broker_id: str
    #: ``tube``, the broker's name for this connection (for its logs and ours).
    tube_id: str
    #: ``bus``, the bus the broker belongs to with others (one Redis), if it says:
    #: one Tube per bus reaches every Channel and group on it.
    bus_id: str | None = None

    @classmethod
    def from_command(cls, command: Command) -> Greeting:
        """Read an ``asbp.tube`` Command.

        Raises:
            AgentError: it is not a greeting, or lacks ``a``, ``b`` or ``tube``.
        """
        tube_id = command.get("tube")
        if (
            command.name != control.TUBE
            or command.agent_id is None
            or command.broker_id is None
            or not isinstance(tube_id, str)
        ):
            raise AgentError(f"expected the broker's {control.TUBE} greeting, got {command!r}")
        bus_id = command.get("bus")
        return cls(
            command.agent_id,
            command.broker_id,
            tube_id,
            bus_id if isinstance(bus_id, str) and bus_id else None,
        )


@dataclass(eq=False, slots=True)
class _Pending:
    #: The name of the Command sent, to check a fault's ``cause`` against.
    name: str
    future: asyncio.Future[Command]
    #: For agent-to-agent requests: the inbox the answer arrives on.
    inbox: str | None = None


@dataclass(eq=False)
class TubeSession:
    """One greeted WebSocket connection to one broker."""

    websocket: ClientConnection
    greeting: Greeting
    logger: logging.Logger
    #: Command-Names the broker confirmed this session serves.
    registered: set[str] = field(default_factory=set)
    closed: bool = False
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _ids: control.CommandIds = field(default_factory=control.CommandIds)

    @property
    def broker_id(self) -> str:
        """The Broker-Identifier ``b`` of the broker at the other end."""
        return self.greeting.broker_id

    @property
    def pending(self) -> int:
        """Calls awaiting an answer on this session."""
        return len(self._pending)

    async def send(self, command: Command) -> None:
        """Send one Command.

        Raises:
            ConnectionLost: the connection is closed.
        """
        if self.closed:
            raise ConnectionLost(f"the Tube to broker {self.broker_id} is closed")
        try:
            await self.websocket.send(asbp.encode(command))
        except ConnectionClosed as exc:
            raise ConnectionLost(f"the Tube to broker {self.broker_id} closed") from exc

    async def call(
        self, command: Command, *, timeout: float | None, inbox: str | None = None
    ) -> Command:
        """Send ``command`` with a fresh ``u``; return the Command that answers it.

        Args:
            command: a Command with ``c`` and without ``u``.
            timeout: seconds to wait for the answer; None waits for ever.
            inbox: for an agent-to-agent request, the inbox its answer comes to.

        Raises:
            FaultError: the answer is a fault.
            ConnectionLost: the connection closed first.
            TimeoutError: no answer within ``timeout``.
        """
        name = command.name
        assert name is not None, "a call needs a Command-Name"
        command_id = self._ids.allocate(self._pending)
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = _Pending(name, future, inbox)
        try:
            await self.send(command.with_keys(u=command_id))
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._pending.pop(command_id, None)

    def resolve(self, command: Command) -> bool:
        """Hand ``command`` to the call it answers; False if it answers none."""
        command_id = command.command_id
        if command_id is None:
            return False
        pending = self._pending.get(command_id)
        if pending is None or pending.future.done():
            return False
        header = command  # ``key in command``: no read-only view per test
        name = command.name
        if pending.inbox is not None and name == pending.inbox:
            if "a" not in header or "i" in header:
                return False  # not from an agent: a forgery, or a stray
            return self._settle(pending, _unwrap_inbox(command))
        if "a" in header or "i" in header:
            return False
        if name == control.FAULT:
            cause = command.get("cause")
            if cause is not None and cause != pending.name:
                return False  # the broker's fault about some other Command with this u
            pending.future.set_exception(FaultError.from_command(command))
            return True
        expected = _ANSWERS.get(pending.name, control.ACCEPTED)
        if name != expected:
            return False
        if name == control.ACCEPTED and command.get("cause") not in (None, pending.name):
            return False
        pending.future.set_result(command)
        return True

    @staticmethod
    def _settle(pending: _Pending, answer: Command) -> bool:
        if answer.name == control.FAULT:
            pending.future.set_exception(FaultError.from_command(answer))
        else:
            pending.future.set_result(answer)
        return True

    def abort(self, reason: str) -> None:
        """The connection is gone: every pending call fails with ConnectionLost."""
        self.closed = True
        self.registered.clear()
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(ConnectionLost(reason))
                # Its caller may be cancelled before it wakes (the link cancels the
                # registration it started as the Tube closes): then nobody reads the
                # exception, and asyncio reports it as never retrieved.
                pending.future.exception()
        self._pending.clear()

    async def close(self) -> None:
        """Close the connection (the link will dial again unless it is stopping)."""
        await self.websocket.close()


#: The broker answers each built-in with this name (default: ``asbp.accepted``).
_ANSWERS: Final = {control.PING: control.PONG, control.COMMANDS: control.COMMANDS}


def _unwrap_inbox(command: Command) -> Command:
    """An inbox answer as the Command it stands for (``c`` from ``reply``)."""
    reply = command.get(control.REPLY_KEY)
    unwrapped = command.without_keys(control.REPLY_KEY, control.INBOX_KEY)
    if isinstance(reply, str):
        try:
            return unwrapped.with_keys(c=reply)
        except ProtocolError:
            pass
    return unwrapped


OnOpen = Callable[[TubeSession], Coroutine[Any, Any, None]]
OnCommand = Callable[[TubeSession, Command], None]


class TubeLink:
    """Keeps one Tube to one broker URL open, reconnecting with backoff.

    Args:
        url: the broker's Tube endpoint, ``wss://host/tube``.
        credentials: mints a fresh credential for every attempt.
        ssl: TLS context for ``wss://`` (None: the system defaults).
        backoff: reconnect delays.
        timeout: seconds for the handshake and the greeting.
        logger: where to log.
        on_open: awaited in its own task once a session is greeted (the agent
            registers its Respondents there); the session is open meanwhile.
        on_command: every Command that answers no pending call.
        server_hostname: the name TLS verifies the broker's certificate against,
            when ``url`` names an address (a discovered broker: agents.discovery).
    """

    def __init__(
        self,
        url: str,
        credentials: AgentCredentialSource,
        *,
        ssl: ssl_module.SSLContext | None,
        backoff: Backoff,
        timeout: float,
        logger: logging.Logger,
        on_open: OnOpen,
        on_command: OnCommand,
        server_hostname: str | None = None,
    ) -> None:
        self.url = url
        self._server_hostname = server_hostname
        self._credentials = credentials
        self._ssl = ssl
        self._backoff = backoff
        self._timeout = timeout
        self._log = logger
        self._on_open = on_open
        self._on_command = on_command
        #: The current greeted session, if any.
        self.session: TubeSession | None = None
        #: How many sessions have been greeted (1 after the first connect).
        self.sessions_opened = 0
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start dialling in the background."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"asbp-tube {self.url}")

    async def stop(self) -> None:
        """Close the connection and stop reconnecting."""
        self._stopping.set()
        session = self.session
        if session is not None:
            with contextlib.suppress(Exception):  # best effort; we leave anyway
                await session.close()
        if self._task is not None:
            task, self._task = self._task, None
            try:
                async with asyncio.timeout(self._timeout):
                    await task
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            opened = self.sessions_opened
            retry_after: float | None = None
            try:
                await self._connect_once()
            except InvalidStatus as exc:
                # A broker busy (503, fault 2115) says when to come back: not before.
                retry_after = retry_after_in(exc.response.headers, exc.response.status_code)
                self._log_refusal(exc)
            except _Refused as exc:
                self._log_refused(str(exc))
            except (OSError, TimeoutError, ConnectionClosed, AgentError) as exc:
                self._log.warning(
                    "tube %s: cannot connect: %s", self.url, str(exc) or type(exc).__name__
                )
            except Exception as exc:
                # websockets raises InvalidHandshake subclasses and friends for
                # a peer that is not an ASBP broker; retrying is the right call.
                self._log.warning(
                    "tube %s: connection failed: %s: %s", self.url, type(exc).__name__, exc
                )
            if self.sessions_opened > opened:
                attempt = 0  # it was greeted: the next failure starts a new series
            if self._stopping.is_set():
                break
            delay = wait_before(retry_after, self._backoff.delay(attempt))
            attempt += 1
            self._log.info("tube %s: reconnecting in %.2f s", self.url, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stopping.wait()

    def _log_refusal(self, exc: InvalidStatus) -> None:
        response = exc.response
        detail = ""
        with contextlib.suppress(ProtocolError):
            if response.body:
                detail = ": " + str(FaultError.from_command(asbp.decode(bytes(response.body))))
        if response.status_code in _REFUSED:
            self._log_refused(f"HTTP {response.status_code}{detail}")
        else:
            self._log.warning(
                "tube %s: handshake refused with HTTP %d%s", self.url, response.status_code, detail
            )

    def _log_refused(self, how: str) -> None:
        self._log.error(
            "tube %s: the broker REFUSED this agent (%s). Check the agent's identity and "
            "key against the broker's [agents] table, the audience, the clock, and that "
            "the URL is wss://. Retrying with backoff.",
            self.url,
            how,
        )

    def _tls_name(self) -> dict[str, Any]:
        """``server_hostname`` for a discovered broker's ``wss://`` address, else nothing."""
        if self._server_hostname is not None and self.url.startswith("wss:"):
            return {"server_hostname": self._server_hostname}
        return {}

    async def _connect_once(self) -> None:
        """Dial, greet and serve one connection until it ends."""
        websocket = await connect(
            self.url,
            additional_headers=self._credentials.headers(),
            subprotocols=[SUBPROTOCOL],
            ssl=self._ssl if self.url.startswith("wss:") else None,
            **self._tls_name(),
            open_timeout=self._timeout,
            close_timeout=self._timeout,
        )
        try:
            try:
                async with asyncio.timeout(self._timeout):
                    first = await websocket.recv(decode=False)
            except ConnectionClosed as exc:
                # A server that cannot send an HTTP status from a WebSocket
                # handler refuses by closing with 1008 (policy violation).
                if exc.rcvd is not None and exc.rcvd.code == _CLOSE_POLICY:
                    raise _Refused(f"closed with {_CLOSE_POLICY} before the greeting") from exc
                raise
            greeting = Greeting.from_command(asbp.decode(first))
            expected = self._credentials.identity
            if greeting.agent_id != expected:
                self._log.error(
                    "tube %s: broker %s verified us as %r, not %r",
                    self.url,
                    greeting.broker_id,
                    greeting.agent_id,
                    expected,
                )
            session = TubeSession(websocket, greeting, self._log)
            self.session = session
            self.sessions_opened += 1
            self._log.info(
                "tube %s: open to broker %s as %r (tube %s)",
                self.url,
                greeting.broker_id,
                greeting.agent_id,
                greeting.tube_id,
            )
            opener = asyncio.create_task(self._on_open(session), name=f"asbp-open {self.url}")
            try:
                await self._read(session)
            finally:
                session.abort(f"the Tube to broker {greeting.broker_id} closed")
                if self.session is session:
                    self.session = None
                opener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await opener
        finally:
            await websocket.close()

    async def _read(self, session: TubeSession) -> None:
        try:
            async for message in session.websocket:
                frame = message.encode("utf-8") if isinstance(message, str) else message
                try:
                    command = asbp.decode(frame)
                except ProtocolError as exc:
                    self._log.warning(
                        "tube %s: dropped a frame the codec refused: %s", self.url, exc
                    )
                    continue
                if not session.resolve(command):
                    self._on_command(session, command)
        except ConnectionClosed as exc:
            self._log.warning("tube %s: connection lost: %s", self.url, exc)
        else:
            close = session.websocket.close_code
            self._log.info("tube %s: closed (code %s)", self.url, close)

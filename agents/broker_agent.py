"""The Broker-Agent: a small embedded broker that serves its own Respondents (draft §2.5).

::

    broker = BrokerAgent("shop")

    @broker.respondent("echo")
    async def echo(request: Request) -> bytes:
        return request.body

    async with broker.serving("127.0.0.1", 8080):     # ws://127.0.0.1:8080/asbp
        await broker.closed()

Theory of operation
-------------------
§1.2: "A Broker-Agent is a combination of a Broker and an Application-Agent
for three tier implementations"; §3.2.1 draws it: User-Agent → Broker-Agent →
storage. So a :class:`BrokerAgent` accepts User-Agent Channels itself, over
WebSocket (``websockets``' server, the codec from ``asbp``; it never imports
the broker), and runs the SDK's Respondents in process, with the very
``Request`` API an :class:`~agents.agent.ApplicationAgent` gives them: the
same handler serves in a three-tier deployment here and in a four-tier one
behind a broker (§3.3: "the great majority of Application Agent code can be
simply moved to a four tier deployment"). A Respondent may itself be an
Intermediary (``agents.intermediary.forward_to``) that carries the Command on
to another bus.

What a User-Agent gets is what the broker gives it (docs/protocol.md), for the
part a Broker-Agent does:

* the greeting ``c=asbp.channel,i=<uuid hex>,b=<broker id>;`` first;
* ``asbp.ping`` → ``asbp.pong`` (same ``u`` and body), ``asbp.commands`` → the
  JSON array of the names it may send;
* a Command for a served name goes to its handler with ``i`` and ``b`` added
  and ``a`` removed; the answer comes back with ``a`` (this Broker-Agent's
  identity) and the same ``u``, ``d`` removed;
* the same faults, codes and messages as the broker: a frame the codec refuses
  (1101 over ``max_frame_bytes``, 1104 to 1106, 1201, 1203; with the ``u`` sniffed
  from the frame, :mod:`asbp.sniff`), no ``c`` (1201), a name nobody serves
  (2101, ``asbp.`` names included), ``s`` (3201: no Subject belongs to a
  Channel here), more than ``max_in_flight`` awaiting answers (2106), no answer
  within ``respondent_timeout`` (2103), a handler that raised (2107), shutting
  down (2102), too many Channels (2108, then close 1008), a reader too slow
  for its outbox (close 1008 ``2105 Slow consumer``). The Channel stays open
  after every fault but the last two.

What it does not do (docs/tiers.md lists it too): HTTP Channels and
long-polling, Tubes (its Respondents are in process; use a broker for remote
Application-Agents), Subjects and the Authenticate-Command, topics and queues,
groups (``g``, ``asbp.join``), the access-control lists, the event log,
metrics, several processes sharing Channels, or resuming a Channel. Those are
what the four-tier deployment with a broker is for, which §2.5 recommends.

Browsers: a WebSocket handshake with an ``Origin`` header is refused (403)
unless that origin is in ``allowed_origins`` (none by default), as the broker
refuses one not in its ``cors_origins``: browsers apply no CORS to WebSockets,
so a page elsewhere could otherwise drive a user's browser into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Final, TypeVar

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HttpRequest
from websockets.http11 import Response as HttpResponse
from websockets.typing import Origin, Subprotocol

import asbp
from agents import control
from agents.addressing import ChannelMemory
from agents.broker_channel import ChannelConnection, InFlight, OutboxLimits
from agents.dispatch import Dispatcher
from agents.errors import AgentError, FaultError
from agents.respondent import Handler, RespondentTable
from asbp import ChannelId, Command, FaultCode, Limits, ProtocolError
from asbp.names import LOGOUT, MESSAGING
from asbp.sniff import sniff_command_id

__all__ = ["BrokerAgent", "OutboxLimits"]

_H = TypeVar("_H", bound=Handler)

_SUBPROTOCOL: Final = Subprotocol("asbp")
#: The built-ins a Broker-Agent answers for a User-Agent.
_BUILTINS: Final = (control.COMMANDS, control.PING)
#: The close code and reason of a Channel over ``max_channels`` (as the broker's).
_POLICY: Final = 1008
_TOO_MANY: Final = f"{int(FaultCode.TOO_MANY_CHANNELS)} Too many Channels"
#: The close code when the Broker-Agent stops.
_GOING_AWAY: Final = 1001


class _Session:
    """The way back from a Respondent: a Request's :class:`~agents.respondent.RequestSession`."""

    __slots__ = ("_agent",)

    def __init__(self, agent: BrokerAgent) -> None:
        self._agent = agent

    @property
    def broker_id(self) -> str:
        return self._agent.broker_id

    async def send(self, command: Command) -> None:
        self._agent._from_respondent(command)

    async def call(
        self, command: Command, *, timeout: float | None, inbox: str | None = None
    ) -> Command:
        # Request.join and Request.leave: a Broker-Agent has no groups.
        raise FaultError(
            FaultCode.NO_RESPONDENT,
            f"a Broker-Agent does not answer {command.name!r}: it has no groups",
            cause=command.name,
        )


class BrokerAgent:
    """A Broker and an Application-Agent in one process, for three tiers (§2.5).

    Args:
        broker_id: ``b``, sent in the greeting and to every Respondent;
            ``ba-<random hex>`` by default.
        identity: ``a`` on every answer (the broker sets the answering
            agent's verified identity there); ``broker_id`` by default.
        limits: the codec's limits for incoming frames (the broker's defaults).
        max_in_flight: Commands with ``u`` awaiting an answer, per Channel
            (fault 2106 past it).
        respondent_timeout: seconds a Respondent has to answer (fault 2103).
        max_channels: open Channels (fault 2108 past it, then close).
        outbox: what may wait for one User-Agent (close 2105 past it).
        max_concurrency: handlers running at once; the rest wait their turn.
        max_pending: handlers running or waiting at once; past it the
            Broker-Agent stops reading from the Channel that sent the last
            one until one finishes, so TCP holds that sender back (a Command
            without ``u`` has no in-flight limit, so this is what bounds them).
        allowed_origins: the web origins whose pages may open Channels; a
            handshake with any other ``Origin`` is refused with 403.
        ssl: a server TLS context for ``wss://``; None serves ``ws://``.
        logger: where to log; ``logging.getLogger("asbp.broker_agent")``.

    Raises:
        ValueError: a limit below 1, or a ``broker_id`` no header can carry.
    """

    def __init__(
        self,
        broker_id: str | None = None,
        *,
        identity: str | None = None,
        limits: Limits | None = None,
        max_in_flight: int = 256,
        respondent_timeout: float = 60.0,
        max_channels: int = 1000,
        outbox: OutboxLimits | None = None,
        max_concurrency: int = 100,
        max_pending: int = 10_000,
        allowed_origins: Iterable[str] = (),
        ssl: ssl_module.SSLContext | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if min(max_in_flight, max_channels, max_pending) < 1 or respondent_timeout <= 0:
            raise ValueError(
                "max_in_flight, max_channels, max_pending and respondent_timeout must be positive"
            )
        self.broker_id = broker_id or f"ba-{uuid.uuid4().hex[:12]}"
        try:
            Command(b=self.broker_id)
        except ProtocolError as exc:
            raise ValueError(f"broker_id {self.broker_id!r} cannot be sent as 'b': {exc}") from exc
        self.identity = identity or self.broker_id
        self._limits = limits or Limits()
        self._max_in_flight = max_in_flight
        self._timeout = respondent_timeout
        self._max_channels = max_channels
        self._max_pending = max_pending
        self._outbox = outbox or OutboxLimits()
        self._origins: list[Origin | None] = [
            None,
            *(Origin(o.rstrip("/")) for o in allowed_origins),
        ]
        self._ssl = ssl
        self._log = logger or logging.getLogger("asbp.broker_agent")
        self._respondents = RespondentTable()
        self._dispatcher = Dispatcher(
            self.identity,
            self._respondents,
            ChannelMemory(),
            max_concurrency=max_concurrency,
            logger=self._log,
        )
        self._session = _Session(self)
        self._channels: dict[ChannelId, ChannelConnection] = {}
        self._server: Server | None = None
        self._stopped = asyncio.Event()

    def __repr__(self) -> str:
        return f"<BrokerAgent {self.broker_id!r} channels={len(self._channels)}>"

    # -- Respondents (as ApplicationAgent) ---------------------------------------------

    def respondent(self, name: str) -> Callable[[_H], _H]:
        """Decorator: serve ``name`` with the decorated handler."""

        def decorate(handler: _H) -> _H:
            self.add_respondent(name, handler)
            return handler

        return decorate

    def add_respondent(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler`` from now on.

        Raises:
            ValueError: ``name`` is reserved (``asbp.``), not a valid
                Command-Name, or already served.
        """
        self._respondents.add(name, handler)

    async def remove_respondent(self, name: str) -> None:
        """Stop serving ``name``; requests already taken are still answered.

        Raises:
            KeyError: ``name`` is not served.
        """
        self._respondents.begin_removal(name)
        self._respondents.end_removal(name)

    @property
    def respondent_names(self) -> frozenset[str]:
        """The Command-Names served right now."""
        return self._respondents.names

    # -- serving ---------------------------------------------------------------------

    @property
    def channels(self) -> int:
        """Open Channels."""
        return len(self._channels)

    @property
    def port(self) -> int:
        """The port it listens on (useful after asking for port 0).

        Raises:
            AgentError: not started.
        """
        if self._server is None:
            raise AgentError("the Broker-Agent is not serving")
        for sock in self._server.sockets:
            port: int = sock.getsockname()[1]
            return port
        raise AgentError("the Broker-Agent has no listening socket")  # pragma: no cover

    def url(self, host: str = "127.0.0.1") -> str:
        """The Channel URL User-Agents connect to: ``ws(s)://host:port/asbp``."""
        scheme = "wss" if self._ssl is not None else "ws"
        return f"{scheme}://{host}:{self.port}/asbp"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen for Channels on ``host``:``port``; returns once listening.

        Raises:
            AgentError: already started.
            OSError: the address cannot be bound.
        """
        if self._server is not None:
            raise AgentError("the Broker-Agent is already serving")
        self._server = await serve(
            self._serve_channel,
            host,
            port,
            ssl=self._ssl,
            subprotocols=[_SUBPROTOCOL],
            select_subprotocol=_select_subprotocol,
            origins=self._origins,
            process_request=_only_asbp_path,
            # As the broker: messages up to 4x the frame limit reach the codec,
            # which answers 1101 with the Channel open; longer ones close with 1009.
            max_size=4 * self._limits.max_frame_bytes,
            server_header=None,
        )
        self._log.info("broker agent %s: listening on %s", self.broker_id, self.url(host))

    @contextlib.asynccontextmanager
    async def serving(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[BrokerAgent]:
        """``start`` on entry, ``close`` on exit."""
        await self.start(host, port)
        try:
            yield self
        finally:
            await self.close()

    async def closed(self) -> None:
        """Wait until :meth:`close` has finished."""
        await self._stopped.wait()

    async def close(self, timeout: float = 10.0) -> None:
        """Stop: refuse new Channels and requests, let handlers finish, then close Channels.

        Requests still in flight when ``timeout`` is up get fault 2102, as a
        broker's User-Agent gets when an Application-Agent leaves.
        """
        server = self._server
        if server is None or self._stopped.is_set():
            return
        server.close(close_connections=False)
        self._dispatcher.accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await self._dispatcher.drain(timeout)
        for channel in list(self._channels.values()):
            for command_id, entry in channel.end_all():
                channel.fault(
                    FaultCode.RESPONDENT_LEFT,
                    "the Broker-Agent is shutting down",
                    command_id=command_id,
                    cause=entry.name,
                )
        await asyncio.gather(
            *(
                self._close_channel(channel, max(0.0, deadline - loop.time()))
                for channel in list(self._channels.values())
            )
        )
        await server.wait_closed()
        self._stopped.set()
        self._log.info("broker agent %s: stopped", self.broker_id)

    async def _close_channel(self, channel: ChannelConnection, timeout: float) -> None:
        await channel.finish(timeout)
        await channel.websocket.close(_GOING_AWAY, "the Broker-Agent is stopping")

    async def __aenter__(self) -> BrokerAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- pushing -----------------------------------------------------------------

    def send(self, command: Command) -> None:
        """Deliver ``command`` to the Channels in its ``d`` (a push, as an agent's ``send``).

        Each Channel gets it once, with ``a`` set and ``d`` removed.

        Raises:
            ValueError: ``command`` has no ``d``.
            FaultError: 2104, some Channels in ``d`` are not open here (the
                others still got it).
        """
        if not command.destinations:
            raise ValueError("send() needs a Command with 'd'")
        unknown = self._deliver(command)
        if unknown:
            raise FaultError(
                FaultCode.UNKNOWN_CHANNEL,
                f"no Channel {', '.join(unknown)} at this Broker-Agent",
                command_id=command.command_id,
                cause=command.name,
            )

    # -- internals: Channels ---------------------------------------------------------

    async def _serve_channel(self, websocket: ServerConnection) -> None:
        if not self._dispatcher.accepting:  # a handshake that raced close()
            await websocket.close(_GOING_AWAY, "the Broker-Agent is stopping")
            return
        if len(self._channels) >= self._max_channels:
            refusal = control.fault_command(
                FaultCode.TOO_MANY_CHANNELS,
                f"this Broker-Agent holds {len(self._channels)} Channels, its limit",
            )
            with contextlib.suppress(ConnectionClosed):
                await websocket.send(asbp.encode(refusal).decode())
                await websocket.close(_POLICY, _TOO_MANY)
            return
        channel = ChannelConnection(ChannelId(uuid.uuid4().hex), websocket, self._outbox, self._log)
        self._channels[channel.id] = channel
        channel.start()
        channel.send(Command(c=control.CHANNEL, i=channel.id, b=self.broker_id))
        self._log.debug("broker agent %s: channel %s open", self.broker_id, channel.id)
        try:
            async for message in websocket:
                self._frame(channel, message)
                await self._dispatcher.wait_for_room(self._max_pending)
        except ConnectionClosed:
            pass  # the User-Agent left; what it had in flight has nowhere to go
        finally:
            del self._channels[channel.id]
            channel.end_all()
            await channel.finish(0.0)
            self._log.debug("broker agent %s: channel %s closed", self.broker_id, channel.id)

    def _frame(self, channel: ChannelConnection, message: str | bytes) -> None:
        if isinstance(message, str):
            channel.text = True
            frame = message.encode("utf-8")
        else:
            channel.text = False
            frame = message
        try:
            command = asbp.decode(frame, limits=self._limits)
        except ProtocolError as exc:
            channel.fault(exc.code, exc.message, command_id=sniff_command_id(frame))
            return
        self._route(channel, command)

    def _route(self, channel: ChannelConnection, command: Command) -> None:
        """docs/protocol.md, "Routing", from a User-Agent, for what a Broker-Agent does."""
        name = command.name
        command_id = command.command_id
        if name is None:
            channel.fault(
                FaultCode.INVALID_MESSAGE_FORMAT,
                "a Command from a User-Agent needs a Command-Name 'c'",
                command_id=command_id,
            )
            return
        if name == control.PING:
            channel.send(_numbered(Command({"c": control.PONG}, command.body), command_id))
            return
        if name == control.COMMANDS:
            names = [*_BUILTINS, *sorted(self._respondents.names)]
            answer = Command({"c": control.COMMANDS, "m": "application/json"}, orjson.dumps(names))
            channel.send(_numbered(answer, command_id))
            return
        if name in MESSAGING or name == LOGOUT:
            what = "topics and queues are" if name in MESSAGING else "Subjects are"
            channel.fault(
                FaultCode.NO_RESPONDENT,
                f"{what} not enabled at this broker",
                command_id=command_id,
                cause=name,
            )
            return
        if "s" in command:
            channel.fault(
                FaultCode.ACCESS_DENIED,
                "Subject-Identifier 's' does not belong to this Channel",
                command_id=command_id,
                cause=name,
            )
            return
        served = not name.startswith(control.PREFIX) and name != self._respondents.inbox
        if not served or self._respondents.lookup(name) is None:
            channel.fault(
                FaultCode.NO_RESPONDENT,
                f"no Command-Respondent serves {name!r}",
                command_id=command_id,
                cause=name,
            )
            return
        if command_id is not None:
            in_flight = channel.in_flight
            if command_id not in in_flight and len(in_flight) >= self._max_in_flight:
                channel.fault(
                    FaultCode.TOO_MANY_IN_FLIGHT,
                    f"{len(in_flight)} Commands already await an answer on this Channel",
                    command_id=command_id,
                    cause=name,
                )
                return
            channel.begin(command_id, name, self._timeout, self._timed_out)
        request = command.without_keys("a").with_keys(i=channel.id, b=self.broker_id)
        self._dispatcher.dispatch(self._session, request)

    def _timed_out(self, channel: ChannelConnection, command_id: int, entry: InFlight) -> None:
        if channel.in_flight.get(command_id) is not entry:
            return  # answered or replaced meanwhile
        del channel.in_flight[command_id]
        channel.fault(
            FaultCode.RESPONDENT_TIMEOUT,
            f"no answer to {entry.name!r} within {self._timeout:g} seconds",
            command_id=command_id,
            cause=entry.name,
        )

    # -- internals: what Respondents send ----------------------------------------------

    def _from_respondent(self, command: Command) -> None:
        """A Respondent's answer or push (a Request's ``send``), addressed by ``d``."""
        if not command.destinations:
            # Request.authenticate / refuse, or a delivery to groups: not here.
            raise AgentError(
                f"a Broker-Agent delivers only to Channels in 'd'; it cannot take {command!r} "
                "(no Subjects, no groups)"
            )
        unknown = self._deliver(command)
        if unknown:
            # As an agent hears fault 2104 from a broker: the User-Agent has left.
            self._log.info(
                "broker agent %s: %r: no Channel %s (it has left)",
                self.broker_id,
                command.name,
                ", ".join(unknown),
            )

    def _deliver(self, command: Command) -> list[str]:
        """Queue ``command`` for each Channel in ``d``; returns those not open here."""
        outbound = command.without_keys("d").with_keys(a=self.identity)
        unknown: list[str] = []
        for channel_id in dict.fromkeys(command.destinations):
            channel = self._channels.get(channel_id)
            if channel is None:
                unknown.append(channel_id)
                continue
            channel.answered(outbound, self._timeout, self._timed_out)
            channel.send(outbound)
        return unknown


def _numbered(command: Command, command_id: int | None) -> Command:
    return command if command_id is None else command.with_keys(u=command_id)


def _select_subprotocol(
    connection: ServerConnection, subprotocols: Sequence[Subprotocol]
) -> Subprotocol | None:
    """``asbp`` when offered; none is required (as the broker)."""
    return _SUBPROTOCOL if _SUBPROTOCOL in subprotocols else None


def _only_asbp_path(connection: ServerConnection, request: HttpRequest) -> HttpResponse | None:
    """Channels live at ``/asbp`` (as at the broker); any other path is 404."""
    if request.path.split("?", 1)[0] == "/asbp":
        return None
    body = asbp.encode(
        control.fault_command(FaultCode.NO_RESPONDENT, "a Broker-Agent serves Channels at /asbp")
    )
    headers = Headers([("Content-Type", "application/asbp"), ("Content-Length", str(len(body)))])
    return HttpResponse(404, "Not Found", headers, body)

"""The Application-Agent: Respondents served over Tubes to one or more brokers.

Theory of operation
-------------------
An :class:`ApplicationAgent` holds three things and wires them together:

* its **Respondents**, Command-Name → handler (``agents.respondent``), which
  can be added and removed at run time (§2.7: "Application-Agents MUST be
  able to add or remove Command-Respondents at runtime");
* one :class:`~agents.tube.TubeLink` per broker URL (§3.1.1: every agent is
  wired to several brokers at once, and each link reconnects on its own):
  the URLs given, and with a :class:`~agents.discovery.BrokerDiscovery`, one
  per address its name resolves to, re-resolved on an interval: a Tube is
  opened to each broker that appears and let go of when it disappears;
* a **dispatcher** (``agents.dispatch``) that runs handlers, at most
  ``max_concurrency`` at once, and turns their results into answers.

Registration is per Tube (the broker forgets a Tube's registrations when it
closes), so the agent registers every Respondent on every Tube as soon as
the Tube is greeted, again after every reconnect, and on every open Tube
when a Respondent is added. Removing one unregisters it everywhere first and
only then drops the handler, so Commands already on their way are still
served.

Every broker → agent Command is accounted for: ``asbp.tube`` is the
greeting (``agents.tube``); ``asbp.accepted``, ``asbp.pong``,
``asbp.commands`` and ``asbp.fault`` that carry the ``u`` of a Command the
SDK sent resolve that call (the SDK numbers its own Commands); everything
else goes to the dispatcher (``agents.dispatch``), which runs handlers and
turns a handler's exception into fault 2107.

Shutdown (:meth:`ApplicationAgent.close`) runs in order: refuse new
requests (fault 2102), unregister every name on every Tube and wait for the
broker's ``asbp.accepted``, let in-flight handlers finish (bounded by the
timeout, then cancelled), and only then close the Tubes, so the last
replies still have a way out.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl as ssl_module
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agents import control
from agents.addressing import ChannelMemory
from agents.backoff import Backoff
from agents.credentials import AgentCredentialSource
from agents.discovery import BrokerDiscovery
from agents.dispatch import Dispatcher
from agents.errors import AgentError, ConnectionLost, FaultError, NotConnected
from agents.respondent import Handler, RespondentTable
from agents.tube import TubeLink, TubeSession
from asbp import Command, HeaderInput

__all__ = ["AgentState", "ApplicationAgent", "TubeStatus"]


_H = TypeVar("_H", bound=Handler)


class AgentState(enum.Enum):
    """Where an agent is in its life."""

    #: Built, not started.
    NEW = "new"
    #: Connecting and serving.
    RUNNING = "running"
    #: ``close()`` is under way: no new requests are taken.
    CLOSING = "closing"
    #: Every Tube is closed.
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class TubeStatus:
    """A snapshot of one Tube, for health checks and tests."""

    url: str
    #: Whether a greeted connection is open right now.
    connected: bool
    #: ``b`` of the broker at the other end, while connected.
    broker_id: str | None
    #: The broker's id for this connection, while connected.
    tube_id: str | None
    #: Names the broker confirmed for this connection.
    registered: frozenset[str]
    #: How many connections have been greeted so far (reconnects + 1).
    sessions_opened: int


class ApplicationAgent:
    """An Application-Agent serving Respondents to one or more brokers.

    Args:
        identity: the agent's identity; must match ``credentials``.
        credentials: mints a fresh credential for every connection attempt.
        urls: the brokers' Tube endpoints (``wss://host/tube``), one Tube each.
        discovery: follow the brokers behind a name (the headless
            ``asbp-broker-peers`` Service): one Tube per address it resolves
            to, kept in step every ``discovery.interval`` seconds.
        ssl: TLS context for ``wss://`` URLs; None uses the system's defaults.
        backoff: delays between reconnect attempts.
        max_concurrency: handlers running at once; later requests wait their
            turn (their number is bounded by the brokers' in-flight limits).
        timeout: seconds for a handshake, a greeting or a broker
            acknowledgement, and the default for :meth:`request`.
        logger: where to log; ``logging.getLogger("asbp.agent")`` by default.

    Raises:
        ValueError: no URLs and no discovery, a non-positive ``max_concurrency``,
            or an ``identity`` other than the credentials'.
    """

    def __init__(
        self,
        identity: str,
        credentials: AgentCredentialSource,
        urls: Sequence[str] = (),
        *,
        discovery: BrokerDiscovery | None = None,
        ssl: ssl_module.SSLContext | None = None,
        backoff: Backoff | None = None,
        max_concurrency: int = 100,
        timeout: float = 10.0,
        logger: logging.Logger | None = None,
    ) -> None:
        if isinstance(urls, str) or not (urls or discovery):
            raise ValueError("urls must be a non-empty sequence of broker Tube URLs")
        if identity != credentials.identity:
            raise ValueError(
                f"identity {identity!r} does not match the credentials' {credentials.identity!r}"
            )
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.identity = identity
        self._log = logger or logging.getLogger("asbp.agent")
        self._timeout = timeout
        self._respondents = RespondentTable()
        self._control: set[asyncio.Task[None]] = set()
        self._channels = ChannelMemory()
        self._dispatcher = Dispatcher(
            identity,
            self._respondents,
            self._channels,
            max_concurrency=max_concurrency,
            logger=self._log,
        )
        self._changed = asyncio.Event()
        self._closed = asyncio.Event()
        self._state = AgentState.NEW
        #: Set once :meth:`start` has started the Tubes.
        self.started = asyncio.Event()
        self._credentials = credentials
        self._ssl = ssl
        self._backoff = backoff
        self._discovery = discovery
        self._follower: asyncio.Task[None] | None = None
        #: The Tubes to discovered brokers, by URL (also in ``_links``).
        self._discovered: dict[str, TubeLink] = {}
        self._links = [self._new_link(url) for url in urls]

    def __repr__(self) -> str:
        return f"<ApplicationAgent {self.identity!r} {self._state.value}>"

    def _new_link(self, url: str, server_hostname: str | None = None) -> TubeLink:
        return TubeLink(
            url,
            self._credentials,
            ssl=self._ssl,
            backoff=self._backoff or Backoff(),
            timeout=self._timeout,
            logger=self._log,
            on_open=self._on_open,
            on_command=self._dispatcher.dispatch,
            server_hostname=server_hostname,
        )

    # -- Respondents ---------------------------------------------------------

    def respondent(self, name: str) -> Callable[[_H], _H]:
        """Decorator: serve ``name`` with the decorated handler.

        ::

            @agent.respondent("chat.send")
            async def send(request: Request) -> str: ...
        """

        def decorate(handler: _H) -> _H:
            self.add_respondent(name, handler)
            return handler

        return decorate

    def add_respondent(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler``, registering it on every open Tube.

        Registration completes in the background; :meth:`wait_registered`
        waits for it.

        Raises:
            ValueError: ``name`` is reserved (``asbp.``), not a valid
                Command-Name, or already served.
        """
        self._respondents.add(name, handler)
        for session in self._sessions():
            self._spawn_control(self._register(session, [name]))
        self._notify()

    async def remove_respondent(self, name: str) -> None:
        """Stop serving ``name``: unregister it on every Tube, then drop the handler.

        Requests already on their way when this is called are still served.

        Raises:
            KeyError: ``name`` is not served.
        """
        self._respondents.begin_removal(name)
        try:
            await self._unregister(self._sessions(), [name])
        finally:
            self._respondents.end_removal(name)
            self._notify()

    @property
    def respondent_names(self) -> frozenset[str]:
        """The Command-Names served right now."""
        return self._respondents.names

    # -- life cycle ----------------------------------------------------------

    @property
    def state(self) -> AgentState:
        """Where the agent is in its life."""
        return self._state

    @property
    def tubes(self) -> tuple[TubeStatus, ...]:
        """One snapshot per broker URL: those given, in order, then discovered ones."""
        result = []
        for link in self._links:
            session = link.session
            live = session is not None and not session.closed
            result.append(
                TubeStatus(
                    url=link.url,
                    connected=live,
                    broker_id=session.broker_id if session and live else None,
                    tube_id=session.greeting.tube_id if session and live else None,
                    registered=frozenset(session.registered) if session and live else frozenset(),
                    sessions_opened=link.sessions_opened,
                )
            )
        return tuple(result)

    async def start(self) -> None:
        """Start connecting to every broker; returns at once.

        Raises:
            AgentError: the agent was closed.
        """
        if self._state is AgentState.RUNNING:
            return
        if self._state is not AgentState.NEW:
            raise AgentError("a closed agent cannot be started again")
        self._state = AgentState.RUNNING
        for link in self._links:
            link.start()
        if self._discovery is not None:
            self._follower = asyncio.create_task(
                self._follow(self._discovery), name=f"asbp-discovery {self._discovery.url}"
            )
        self.started.set()

    async def wait_tubes(
        self, predicate: Callable[[tuple[TubeStatus, ...]], bool], timeout: float | None = None
    ) -> None:
        """Wait until ``predicate(self.tubes)`` holds (checked at every change).

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while not predicate(self.tubes):
                changed = self._changed
                await changed.wait()

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Wait until every Tube is open and every Respondent registered on it.

        Raises:
            AgentError: the agent is closing or closed.
            TimeoutError: not within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while not self._all_registered():
                if self._state in (AgentState.CLOSING, AgentState.CLOSED):
                    raise AgentError("the agent is closing")
                changed = self._changed
                await changed.wait()

    async def run(self) -> None:
        """Start, then serve until :meth:`close` is called or this is cancelled.

        A cancelled ``run()`` (Ctrl-C under ``asyncio.run``) closes the agent
        gracefully before it returns.
        """
        await self.start()
        try:
            await self._closed.wait()
        except asyncio.CancelledError:
            await self.close()
            raise

    async def close(self, timeout: float = 10.0) -> None:
        """Shut down gracefully; see the module docstring for the order.

        Args:
            timeout: seconds for the whole shutdown; handlers still running
                when it is up are cancelled (their requesters get fault 2102
                from the broker).
        """
        if self._state is AgentState.CLOSED:
            return
        if self._state is AgentState.CLOSING:
            await self._closed.wait()
            return
        self._state = AgentState.CLOSING
        self._dispatcher.accepting = False
        if self._follower is not None:
            await _cancel({self._follower})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            names = self._respondents.wanted()
            sessions = self._sessions()
            if names and sessions:
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._unregister(sessions, sorted(names))
                except TimeoutError:
                    self._log.warning("agent %s: unregistering timed out", self.identity)
            late = await self._dispatcher.drain(deadline - loop.time())
            if late:
                self._log.warning("agent %s: cancelled %d late handlers", self.identity, late)
            await _cancel(self._control)
            await asyncio.gather(*(link.stop() for link in self._links))
        finally:
            self._state = AgentState.CLOSED
            self._closed.set()
            self._notify()

    async def __aenter__(self) -> ApplicationAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- sending ---------------------------------------------------------------

    async def send(
        self, command: Command, *, broker: str | None = None, confirm: float | None = None
    ) -> None:
        """Deliver ``command`` to the Channels in ``d`` and the groups in ``g``.

        Brokers on one bus (their greeting says ``bus``) route ``d`` and ``g``
        across it, so the Command goes out on one Tube per bus: a group spans
        the bus, and a Channel on any of its brokers is reached; one that exists
        nowhere on the bus gets fault 2104 as a Command, which ``confirm`` turns
        into an error. To brokers that are not on a bus, groups are per broker
        (§1.3.4.2 g), so a Command with ``g`` goes out on each such Tube, and a
        Channel in ``d`` goes only to the broker the agent has seen it through,
        or to each if it has not seen it (the others answer fault 2104, which is
        logged).

        Args:
            command: the Command; ``a`` is set by the broker.
            broker: send only to the broker with this ``b``.
            confirm: wait up to this many seconds for the broker's fault about
                this Command (matched by its ``c`` and ``u``) and raise it; the
                broker answers a delivery with silence, so a ``send`` that waited
                the whole time without a fault was delivered. None: return at once.

        Raises:
            ValueError: ``command`` has neither ``d`` nor ``g``.
            NotConnected: no Tube is open (to ``broker``).
            ConnectionLost: every Tube closed while sending.
            FaultError: ``confirm`` was given and the broker faulted the Command
                (2104: no such Channel on the bus).
        """
        await self._confirmed(command, self._send(command, broker), confirm)

    async def send_for(
        self,
        subject_id: str,
        command: Command,
        *,
        broker: str | None = None,
        confirm: float | None = None,
    ) -> None:
        """Send ``command``, addressed by ``r`` (``alice*example.org``, docs/courses.md),
        for the Subject ``subject_id`` that this agent signed in.

        The broker stamps ``p`` with that Subject's Conversation-Address, so the
        recipients' replies (addressed by ``r`` to that ``p``) go to the Subject's
        User-Agent, not to this agent. Only an agent that authenticated the
        Subject may speak for it (fault 3201 otherwise), at the broker holding the
        Subject: ``broker``, the ``b`` of its Authenticate-Command
        (``request.command.get("b")``). It goes out on the Tube to that broker if
        there is one, else on another Tube, whose broker passes it to ``broker``
        when both are on one bus.

        Args:
            subject_id: the Subject's ``s``.
            command: the Command, with ``r``; ``s`` (and ``b``) are set for it, and
                any ``p`` is dropped: the broker stamps it.
            broker: the broker holding the Subject; None: the Tube's own.
            confirm: as in :meth:`send`: wait this long for a fault and raise it
                (2201 for an unknown address of this bus, 2202 for a domain no
                Course reaches, 3201 for a Subject not this agent's).

        Raises:
            ValueError: ``command`` has no ``r``.
            NotConnected: no Tube is open (to ``broker``).
            ConnectionLost: the Tube closed while sending.
            FaultError: ``confirm`` was given and the broker faulted the Command.
        """
        if not command.recipients:
            raise ValueError("send_for() needs a Command with 'r'")
        addressed = command.without_keys("p").with_keys(s=subject_id)
        sessions = self._sessions()
        if broker is not None:
            addressed = addressed.with_keys(b=broker)
            there = [session for session in sessions if session.broker_id == broker]
            sessions = there or sessions
        if not sessions:
            raise NotConnected("no Tube is open")
        await self._confirmed(addressed, sessions[0].send(addressed), confirm)

    async def _confirmed(
        self, command: Command, sending: Coroutine[Any, Any, None], confirm: float | None
    ) -> None:
        """Run ``sending``; with ``confirm``, then wait that long for the broker's
        fault about ``command`` (its ``c`` and ``u``) and raise it."""
        if confirm is None:
            await sending
            return
        key = (command.name, command.command_id)
        waiter = self._dispatcher.expect_fault(*key)
        try:
            await sending
            done, _ = await asyncio.wait([waiter], timeout=confirm)
        finally:
            self._dispatcher.forget(*key)
        if done:
            raise waiter.result()

    async def _send(self, command: Command, broker: str | None) -> None:
        destinations = command.destinations
        groups = command.groups
        if not destinations and not groups:
            raise ValueError("send() needs a Command with 'd' or 'g'; use request() otherwise")
        sessions = self._sessions(broker)
        sent = 0
        lost: ConnectionLost | None = None
        for candidates in _by_bus(sessions):
            # On a bus, the first Tube that takes it: the bus routes d and g across it.
            for session in candidates:
                outbound = (
                    command
                    if session.greeting.bus_id is not None
                    else self._channels.outbound(command, session.broker_id)
                )
                if outbound is None:
                    break
                try:
                    await session.send(outbound)
                except ConnectionLost as exc:
                    lost = exc
                    continue
                sent += 1
                break
        if not sent and lost is not None:
            raise lost

    async def join(
        self, groups: Collection[str], channels: Collection[str], *, broker: str | None = None
    ) -> frozenset[str]:
        """Add ``channels`` to ``groups`` (``asbp.join``) and wait for the broker.

        On a bus of brokers, one Tube's broker joins Channels on any of them.

        Returns:
            The Broker-Identifiers that accepted. A broker where some of the
            Channels are unknown joins none of them (fault 2104; on a bus, it
            joins those that exist); that is only an error if no broker accepted.

        Raises:
            ValueError: no groups or no channels.
            NotConnected: no Tube is open (to ``broker``).
            FaultError: no broker accepted; the first broker's fault.
        """
        return await self._membership(control.JOIN, groups, channels, broker)

    async def leave(
        self, groups: Collection[str], channels: Collection[str], *, broker: str | None = None
    ) -> frozenset[str]:
        """Remove ``channels`` from ``groups`` (``asbp.leave``); see :meth:`join`."""
        return await self._membership(control.LEAVE, groups, channels, broker)

    async def request(
        self,
        name: str,
        body: bytes | str = b"",
        *,
        timeout: float | None = None,
        **keys: HeaderInput,
    ) -> Command:
        """Ask another Application-Agent's Respondent and return its answer.

        The broker routes a Command without ``d`` or ``g`` to another Tube
        that serves its name, but cannot address an answer to a Tube; so the
        first call registers a private inbox name on every Tube and the
        request carries it (``inbox``, see ``agents.control``). Only the
        first Command of a streamed answer is returned.

        Raises:
            FaultError: the Respondent answered with a fault, or no other
                agent serves ``name`` (2101).
            NotConnected: no Tube is open.
            ConnectionLost: the Tube closed before the answer came.
            TimeoutError: no answer within ``timeout`` (default: the agent's).
        """
        inbox = await self._ensure_inbox()
        sessions = [s for s in self._sessions() if inbox in s.registered]
        if not sessions:
            raise NotConnected("no Tube has the inbox registered yet")
        session = min(sessions, key=lambda s: s.pending)
        data = control.text_body(body, keys)
        keys["c"] = name
        keys[control.INBOX_KEY] = inbox
        command = Command(keys, data)
        return await session.call(
            command, timeout=self._timeout if timeout is None else timeout, inbox=inbox
        )

    async def ping(self) -> dict[str, float]:
        """Round-trip ``asbp.ping`` on every open Tube; seconds by Broker-Identifier.

        Raises:
            NotConnected: no Tube is open.
        """
        sessions = self._sessions()
        if not sessions:
            raise NotConnected("no Tube is open")
        loop = asyncio.get_running_loop()

        async def one(session: TubeSession) -> tuple[str, float]:
            started = loop.time()
            await session.call(Command(c=control.PING), timeout=self._timeout)
            return session.broker_id, loop.time() - started

        return dict(await asyncio.gather(*(one(s) for s in sessions)))

    # -- internals: sessions and registration ----------------------------------

    def _sessions(self, broker: str | None = None) -> list[TubeSession]:
        sessions = [
            link.session
            for link in self._links
            if link.session is not None and not link.session.closed
        ]
        if broker is not None:
            sessions = [s for s in sessions if s.broker_id == broker]
            if not sessions:
                raise NotConnected(f"no Tube to broker {broker!r} is open")
        return sessions

    def _all_registered(self) -> bool:
        if self._state is not AgentState.RUNNING:
            return False
        wanted = self._respondents.wanted()
        for link in self._links:
            session = link.session
            if session is None or session.closed or not wanted <= session.registered:
                return False
        return True

    async def _follow(self, discovery: BrokerDiscovery) -> None:
        """Keep one Tube per broker behind the name: resolve, apply, wait, again."""
        while True:
            try:
                urls = await discovery.resolve()
            except OSError as exc:
                # Keep the Tubes there are: a name missing for a moment (or DNS
                # down) must not cut the agent off.
                self._log.warning("discovery %s: cannot resolve: %s", discovery.host, exc)
            else:
                self._follow_urls(urls, discovery.host)
            await asyncio.sleep(discovery.interval)

    def _follow_urls(self, urls: list[str], host: str) -> None:
        if self._state is not AgentState.RUNNING:
            return
        if not urls:
            self._log.warning("discovery %s: no brokers; keeping the Tubes there are", host)
            return
        wanted = set(urls)
        for url in urls:
            if url not in self._discovered:
                link = self._new_link(url, server_hostname=host)
                self._discovered[url] = link
                self._links.append(link)
                link.start()
                self._log.info("discovery %s: broker %s joined", host, url)
        for url in list(self._discovered):
            if url not in wanted:
                link = self._discovered.pop(url)
                self._links.remove(link)
                self._spawn_control(link.stop())
                self._log.info("discovery %s: broker %s left", host, url)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn_control(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._control.add(task)
        task.add_done_callback(self._control.discard)

    async def _on_open(self, session: TubeSession) -> None:
        """A Tube was greeted: register everything wanted on it."""
        if self._state is not AgentState.RUNNING:
            return
        names = sorted(self._respondents.wanted())
        if names:
            await self._register(session, names)
        else:
            self._notify()

    async def _register(self, session: TubeSession, names: list[str]) -> None:
        command = Command(c=control.REGISTER, names=names)
        try:
            await session.call(command, timeout=self._timeout)
        except FaultError as exc:
            self._log.error(
                "agent %s: broker %s refused to register %s: %s",
                self.identity,
                session.broker_id,
                names,
                exc,
            )
            return
        except ConnectionLost:
            return  # the link dials again and registers then
        except TimeoutError:
            self._log.warning(
                "agent %s: broker %s did not confirm registration; reconnecting",
                self.identity,
                session.broker_id,
            )
            await session.close()
            return
        # A name removed meanwhile was unregistered after this registration
        # was sent; keep only what is still wanted.
        session.registered.update(n for n in names if n in self._respondents.wanted())
        self._log.info("agent %s: serving %s at broker %s", self.identity, names, session.broker_id)
        self._notify()

    async def _unregister(self, sessions: list[TubeSession], names: list[str]) -> None:
        command = Command(c=control.UNREGISTER, names=names)

        async def one(session: TubeSession) -> None:
            try:
                await session.call(command, timeout=self._timeout)
            except (ConnectionLost, FaultError, TimeoutError) as exc:
                # A closed Tube has no registrations left to remove.
                self._log.warning(
                    "agent %s: unregistering %s at broker %s: %s",
                    self.identity,
                    names,
                    session.broker_id,
                    str(exc) or type(exc).__name__,
                )
            else:
                self._log.info(
                    "agent %s: no longer serving %s at broker %s",
                    self.identity,
                    names,
                    session.broker_id,
                )
            session.registered.difference_update(names)

        await asyncio.gather(*(one(s) for s in sessions))

    async def _ensure_inbox(self) -> str:
        inbox = self._respondents.make_inbox()
        missing = [s for s in self._sessions() if inbox not in s.registered]
        await asyncio.gather(*(self._register(s, [inbox]) for s in missing))
        return inbox

    # -- internals: groups -------------------------------------------------

    async def _membership(
        self, name: str, groups: Collection[str], channels: Collection[str], broker: str | None
    ) -> frozenset[str]:
        if isinstance(groups, str) or isinstance(channels, str):
            raise TypeError("groups and channels are collections of names, not one str")
        if not groups or not channels:
            raise ValueError("name at least one group and one Channel")
        sessions = self._sessions(broker)
        if not sessions:
            raise NotConnected("no Tube is open")
        if broker is None:
            sessions = _one_per_bus(sessions)
        targets = [
            (session, here)
            for session in sessions
            if (
                here := list(channels)
                if session.greeting.bus_id is not None
                else self._channels.located(channels, session.broker_id)
            )
        ]
        if not targets:
            raise NotConnected("none of these Channels is at an open broker")
        results = await asyncio.gather(
            *(
                session.call(
                    Command(c=name, groups=list(groups), channels=here), timeout=self._timeout
                )
                for session, here in targets
            ),
            return_exceptions=True,
        )
        accepted = frozenset(
            session.broker_id
            for (session, _), result in zip(targets, results, strict=True)
            if not isinstance(result, BaseException)
        )
        if not accepted:
            first = results[0]
            assert isinstance(first, BaseException)
            raise first
        return accepted


def _by_bus(sessions: list[TubeSession]) -> list[list[TubeSession]]:
    """``sessions`` in groups that each need the Command once: those on one bus
    together (any of them reaches all of it, and a group Command sent on two would
    reach each member twice), every other alone."""
    buses: dict[str, list[TubeSession]] = {}
    groups: list[list[TubeSession]] = []
    for session in sessions:
        bus_id = session.greeting.bus_id
        if bus_id is None:
            groups.append([session])
        elif bus_id in buses:
            buses[bus_id].append(session)
        else:
            buses[bus_id] = [session]
            groups.append(buses[bus_id])
    return groups


def _one_per_bus(sessions: list[TubeSession]) -> list[TubeSession]:
    """The first session of each group of :func:`_by_bus`."""
    return [group[0] for group in _by_bus(sessions)]


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)

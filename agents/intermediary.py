"""Intermediary-Agents: Respondents on one bus that are User-Agents of the next (draft §3.4).

::

    downstream = Downstream("wss://inner.example/asbp")        # a User-Agent of the inner bus
    agent = ApplicationAgent("gate", credentials, ["wss://outer.example/tube"])
    async with IntermediaryAgent(upstream=agent, downstream=downstream, names=["echo"]):
        ...                                                     # serve until done

    # or one Respondent at a time, in an ApplicationAgent or a BrokerAgent:
    agent.add_respondent("echo", forward_to(downstream))

Theory of operation
-------------------
§3.4: "Intermediary-Agent, which is simply a Application-Agent that is also a
User-Agent in this context"; its diagram chains User-Agent → Broker →
Intermediary-Agent → Broker → etc., without limit. So an Intermediary is two
SDK pieces joined by one handler:

* **upstream**, whatever serves Respondents: an
  :class:`~agents.agent.ApplicationAgent` on a Tube to a broker, or a
  :class:`~agents.broker_agent.BrokerAgent` that User-Agents reach directly;
* **downstream**, a :class:`Downstream`: one User-Agent Channel or more
  (:class:`~agents.user_agent.UserAgent`) to a broker of the next bus (or to
  the same bus's other broker, or to a Broker-Agent), kept open and dialled
  again with backoff when they drop;
* :func:`forward_to`: the handler that sends each request down the Channel
  and each answer back up.

**``u`` end to end.** ``u`` is per Channel (§1.3.4.2: "unique to the User
Agent Channel"), so the Command going down cannot keep the sender's ``u``: two
upstream Channels may both be using ``u=1`` at once. The downstream
User-Agent gives it a fresh ``u`` of its own Channel, and the handler, which
holds the upstream request, answers that request, so every answer goes back
with the sender's original ``u`` and to its Channel. A streamed answer keeps
``t`` and ``o``; parts go up in ``o`` order as they arrive.

**Faults, never silence.** Whatever stops the answer reaches the original
sender as ``asbp.fault`` with its ``u``:

==========================================  ==========================================
downstream                                  the original sender gets
==========================================  ==========================================
a fault (2101, 2102, 2103, 2106, 2107, …)   the same code and message
no answer within ``timeout``                2103
the Channel closed with the Command in      2102
flight
not connected (dialling again)              2101 (and the names are withdrawn upstream,
                                            see :class:`IntermediaryAgent`)
more than ``max_in_flight`` awaiting        2106
==========================================  ==========================================

Keep ``timeout`` below the upstream broker's Respondent timeout (60 s by
default; the default here is 50 s), so that the sender hears this tier's 2103,
whose message says where the time went, rather than its own broker's.

**Which keys cross.** Going down, the keys that name the upstream hop are
dropped: ``a``, ``b``, ``i``, ``s`` and ``u`` (the downstream broker sets its
own; an upstream Subject means nothing on another bus, and knowing an ``s`` is
never enough to act as its owner), and ``p`` and ``r``, the Conversation
Protocol's addressing, which this tier does not route (a Course does). Every
other key and the body cross as they are. Coming back, ``a``, ``b``, ``d``,
``i``, ``s`` and ``u`` are dropped and the answer is addressed to the
requester. So the Respondent at the far end sees the Intermediary's Channel,
not the sender's: identity does not cross tiers unless the application puts
it in a key of its own.

Commands without ``u`` are sent down and nothing is awaited. Commands the
downstream bus sends unasked (pushes to the Intermediary's Channel) have no
sender to go back to: they are logged at DEBUG, or handed to ``on_push``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from agents.backoff import Backoff
from agents.errors import AgentError, ConnectionLost, FaultError
from agents.respondent import Handler, Request
from agents.user_agent import UserAgent
from asbp import Command, FaultCode, HeaderInput

__all__ = ["DOWN_DROPPED", "UP_DROPPED", "Downstream", "IntermediaryAgent", "forward_to"]

#: Keys not sent down: the upstream hop's, and CP's addressing (see the module docstring).
DOWN_DROPPED: Final = frozenset({"a", "b", "i", "s", "u", "p", "r"})
#: Keys of a downstream answer not sent back up.
UP_DROPPED: Final = frozenset({"a", "b", "d", "i", "s", "u"})


@dataclass(eq=False)
class _Link:
    """One Channel of a :class:`Downstream`: its User-Agent while open, its requests."""

    index: int
    user_agent: UserAgent | None = None
    in_flight: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def open(self) -> bool:
        return self.user_agent is not None and not self.user_agent.closed


class Downstream:
    """User-Agent Channels to the next bus, kept open, that forward requests down them.

    Args:
        target: the next broker's Channel URL (``ws(s)://host/asbp``), or a
            callable that makes a new, unconnected :class:`UserAgent` per attempt
            (to choose HTTP, TLS or timeouts).
        timeout: seconds to wait for an answer (and for each next part of a
            stream) before the sender gets fault 2103.
        max_in_flight: requests awaiting answers at once *per Channel*; more
            get fault 2106. The default is a broker's per-Channel limit, which a
            larger value would only meet one tier down.
        channels: Channels to open; each request goes down the open one with
            the fewest in flight, so ``channels * max_in_flight`` requests
            may await answers at once, and one Channel lost costs only its own.
        backoff: delays between dialling attempts (each Channel dials alone).
        on_push: called with each Command the next bus sends unasked.
        logger: where to log; ``logging.getLogger("asbp.intermediary")``.

    Raises:
        ValueError: a ``timeout``, ``max_in_flight`` or ``channels`` below the minimum.
    """

    def __init__(
        self,
        target: str | Callable[[], UserAgent],
        *,
        timeout: float = 50.0,
        max_in_flight: int = 256,
        channels: int = 1,
        backoff: Backoff | None = None,
        on_push: Callable[[Command], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if timeout <= 0 or max_in_flight < 1 or channels < 1:
            raise ValueError("timeout must be positive, and max_in_flight and channels at least 1")
        if isinstance(target, str):
            url = target
            # The Downstream redials itself (withdrawing its names upstream meanwhile),
            # so its User-Agents must not reconnect on their own.
            self._make: Callable[[], UserAgent] = lambda: UserAgent.websocket(
                url, logger=logger, reconnect=None
            )
            self.target = url
        else:
            self._make = target
            self.target = getattr(target, "__name__", repr(target))
        self.timeout = timeout
        self._max_in_flight = max_in_flight
        self._backoff = backoff or Backoff()
        self._on_push = on_push
        self._log = logger or logging.getLogger("asbp.intermediary")
        self._links = [_Link(n) for n in range(channels)]
        self._connected = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()
        #: Set (and replaced) whenever a Channel opens or closes.
        self._state = asyncio.Event()
        self._stopping = asyncio.Event()
        self._started = False
        #: How many Channels have been opened so far (reconnects included).
        self.channels_opened = 0

    def __repr__(self) -> str:
        open_links = sum(link.open for link in self._links)
        return (
            f"<Downstream {self.target} {open_links}/{len(self._links)} connected "
            f"in flight={self.in_flight}>"
        )

    @property
    def connected(self) -> bool:
        """Whether a Channel to the next bus is open right now."""
        return any(link.open for link in self._links)

    @property
    def in_flight(self) -> int:
        """Requests awaiting their answers from the next bus, on every Channel."""
        return sum(link.in_flight for link in self._links)

    @property
    def user_agent(self) -> UserAgent | None:
        """The first open Channel's User-Agent, if any."""
        for link in self._links:
            if link.open:
                return link.user_agent
        return None

    async def start(self) -> None:
        """Start dialling in the background; returns at once."""
        if self._started:
            return
        self._started = True
        self._stopping.clear()
        for link in self._links:
            link.task = asyncio.create_task(
                self._run(link), name=f"asbp-downstream {self.target} #{link.index}"
            )

    async def wait_connected(self, timeout: float | None = None, *, channels: int = 1) -> None:
        """Wait until ``channels`` Channels (one, by default) are open.

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while sum(link.open for link in self._links) < channels:
                changed = self._state
                await changed.wait()

    async def wait_disconnected(self, timeout: float | None = None) -> None:
        """Wait until no Channel is open (they closed; dialling again, or stopped).

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            await self._disconnected.wait()

    async def stop(self) -> None:
        """Close the Channels and stop dialling; requests still awaiting get fault 2102."""
        self._stopping.set()
        self._started = False
        await asyncio.gather(*(self._stop_link(link) for link in self._links))

    async def _stop_link(self, link: _Link) -> None:
        user_agent = link.user_agent
        if user_agent is not None:
            with contextlib.suppress(Exception):  # best effort: we leave anyway
                await user_agent.close()
        task, link.task = link.task, None
        if task is None:
            return
        if user_agent is None:
            # Dialling or backing off: nothing is in flight, and a dial to a host
            # that does not answer would hold the stop for its whole timeout.
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def __aenter__(self) -> Downstream:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def _changed(self) -> None:
        self._state.set()
        self._state = asyncio.Event()
        if self.connected:
            self._disconnected.clear()
            self._connected.set()
        else:
            self._connected.clear()
            self._disconnected.set()

    async def _run(self, link: _Link) -> None:
        attempt = 0
        while not self._stopping.is_set():
            user_agent = self._make()
            try:
                await user_agent.connect()
            except Exception as exc:  # any failure to dial is retried, as a Tube's is
                self._log.warning(
                    "downstream %s: cannot connect: %s", self.target, str(exc) or type(exc).__name__
                )
                with contextlib.suppress(Exception):
                    await user_agent.close()
            else:
                attempt = 0
                link.user_agent = user_agent
                self.channels_opened += 1
                self._changed()
                self._log.info(
                    "downstream %s: channel %s open at broker %s",
                    self.target,
                    user_agent.channel_id,
                    user_agent.broker_id,
                )
                try:
                    async for command in user_agent:
                        self._push(command)
                finally:
                    link.user_agent = None
                    self._changed()
                self._log.warning("downstream %s: the Channel closed", self.target)
            if self._stopping.is_set():
                break
            delay = self._backoff.delay(attempt)
            attempt += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # a backoff delay that a stop() cuts short
                    await self._stopping.wait()

    def _push(self, command: Command) -> None:
        if self._on_push is not None:
            self._on_push(command)
        else:
            self._log.debug("downstream %s: unsolicited %r", self.target, command)

    def _pick(self) -> _Link | None:
        """The open Channel with the fewest requests in flight."""
        best: _Link | None = None
        for link in self._links:
            if link.open and (best is None or link.in_flight < best.in_flight):
                best = link
        return best

    async def forward(self, request: Request) -> None:
        """Send ``request`` down the Channel and its answer (or a fault) back up.

        Raises:
            ConnectionLost: the way back up has closed (nothing can be answered).
        """
        name = request.name
        command_id = request.command_id
        link = self._pick()
        user_agent = link.user_agent if link is not None else None
        if link is None or user_agent is None:
            if command_id is None:
                self._log.info("downstream %s: not open; dropped %r", self.target, request)
            else:
                await request.fault(
                    FaultCode.NO_RESPONDENT,
                    f"no Command-Respondent serves {name!r} right now: "
                    "the Intermediary's Channel to the next bus is not open",
                )
            return
        keys: dict[str, HeaderInput] = {
            key: value for key, value in request.command.header.items() if key not in DOWN_DROPPED
        }
        if command_id is None:
            try:
                await user_agent.send(Command(keys, request.body))
            except AgentError as exc:
                self._log.info("downstream %s: could not send %r: %s", self.target, request, exc)
            return
        if link.in_flight >= self._max_in_flight:
            await request.fault(
                FaultCode.TOO_MANY_IN_FLIGHT,
                f"{self.in_flight} Commands already await an answer from the next bus",
            )
            return
        del keys["c"]
        link.in_flight += 1
        try:
            await self._relay(request, user_agent, keys)
        finally:
            link.in_flight -= 1

    async def _relay(
        self, request: Request, user_agent: UserAgent, keys: dict[str, HeaderInput]
    ) -> None:
        name = request.name
        code: FaultCode | int
        # Only what the downstream side raises becomes a fault for the sender; an
        # error sending upstream (the Tube gone) propagates: there is no way back.
        async with contextlib.aclosing(
            user_agent.stream(name, request.body, timeout=self.timeout, **keys)
        ) as parts:
            while True:
                try:
                    part = await anext(parts)
                except StopAsyncIteration:
                    return
                except FaultError as exc:
                    code, message = exc.code, exc.message
                except TimeoutError:
                    code = FaultCode.RESPONDENT_TIMEOUT
                    message = (
                        f"no answer to {name!r} from the next bus within {self.timeout:g} seconds"
                    )
                except ConnectionLost:
                    code = FaultCode.RESPONDENT_LEFT
                    message = f"the Channel to the next bus closed with {name!r} in flight"
                except AgentError as exc:  # parts that do not form one answer
                    code = FaultCode.RESPONDENT_FAILED
                    message = f"the next bus's answer to {name!r}: {exc}"
                else:
                    await request.send(part.without_keys(*UP_DROPPED))
                    continue
                break
        await request.fault(code, message)


def forward_to(downstream: Downstream) -> Handler:
    """A Respondent that passes each request down ``downstream`` and the answer back.

    ::

        agent.add_respondent("echo", forward_to(downstream))
    """

    async def forward(request: Request) -> None:
        await downstream.forward(request)

    return forward


class RespondentHost(Protocol):
    """What serves an Intermediary's names upstream: an ApplicationAgent or a BrokerAgent."""

    def add_respondent(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler``."""
        ...

    async def remove_respondent(self, name: str) -> None:
        """Stop serving ``name``; requests already on their way are still served."""
        ...

    async def start(self) -> None:
        """Start serving."""
        ...

    async def close(self, timeout: float = 10.0) -> None:
        """Stop serving, letting handlers finish."""
        ...


class IntermediaryAgent:
    """An Application-Agent of one bus that is a User-Agent of the next (§3.4).

    While the Channel to the next bus is down, the names are withdrawn
    upstream (``remove_respondent``: an Application-Agent unregisters them at
    its brokers) and served again once it is back. §3.1: "The Subjects SHOULD
    only see errors if a Broker receives Commands which are not know by any
    attached Application-Agents": with several Intermediaries for the same
    names, the broker sends every Command to one that can pass it on, and
    only when none can does the sender get 2101, from the broker. Commands
    already on their way to a withdrawn one still get their fault (2101 or
    2102) from it.

    Args:
        upstream: where the names are served (its Respondents are added here).
        downstream: the Channel to the next bus.
        names: the Command-Names to pass through.
        withdraw: withdraw the names while the next bus is unreachable (see
            above); False keeps them served and answers 2101 meanwhile.
        logger: where to log; ``logging.getLogger("asbp.intermediary")``.

    Raises:
        ValueError: no names, or a name ``upstream`` refuses.
    """

    def __init__(
        self,
        *,
        upstream: RespondentHost,
        downstream: Downstream,
        names: Iterable[str],
        withdraw: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        self.names = tuple(dict.fromkeys(names))
        if isinstance(names, str) or not self.names:
            raise ValueError("names must be a non-empty collection of Command-Names")
        self.upstream = upstream
        self.downstream = downstream
        self._withdraw = withdraw
        self._log = logger or logging.getLogger("asbp.intermediary")
        self._handler = forward_to(downstream)
        self._watcher: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        for name in self.names:
            upstream.add_respondent(name, self._handler)
        #: Whether the names are served upstream right now.
        self.serving = True

    async def start(self, timeout: float | None = None) -> None:
        """Open the downstream Channel, then start serving upstream.

        Serving starts only once the next bus is reachable, so that the first
        requests do not all fail with 2101.

        Raises:
            TimeoutError: the downstream Channel did not open within ``timeout``.
        """
        await self.downstream.start()
        await self.downstream.wait_connected(timeout)
        await self.upstream.start()
        if self._withdraw and self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="asbp-intermediary")

    async def wait_serving(self, serving: bool = True, timeout: float | None = None) -> None:
        """Wait until the names are served upstream (or, ``serving=False``, withdrawn).

        Raises:
            TimeoutError: not within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while self.serving is not serving:
                changed = self._changed
                await changed.wait()

    async def _watch(self) -> None:
        downstream = self.downstream
        while True:
            await downstream.wait_disconnected()
            await asyncio.gather(*(self.upstream.remove_respondent(n) for n in self.names))
            self._set_serving(False)
            self._log.warning(
                "intermediary: withdrew %s upstream until %s is back",
                ", ".join(self.names),
                downstream.target,
            )
            await downstream.wait_connected()
            for name in self.names:
                self.upstream.add_respondent(name, self._handler)
            self._set_serving(True)
            self._log.info("intermediary: serving %s upstream again", ", ".join(self.names))

    def _set_serving(self, serving: bool) -> None:
        self.serving = serving
        self._changed.set()
        self._changed = asyncio.Event()

    async def close(self, timeout: float = 10.0) -> None:
        """Stop serving upstream (answering what is in flight), then close downstream."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await self.upstream.close(timeout)
        await self.downstream.stop()

    async def __aenter__(self) -> IntermediaryAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

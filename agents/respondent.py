"""Command-Respondents: the handler type and the Request it receives.

A Respondent is an ``async def handler(request: Request) -> Reply``. The
agent calls it for every Command whose name it registered. What it returns
is the answer:

=====================  ================================================
returned               sent to the requester
=====================  ================================================
``bytes`` or ``str``   a reply with that body (``str``: UTF-8, ``e=UTF-8``)
``Command``            that Command, with ``c`` filled in if missing
``None``               nothing more (see below)
=====================  ================================================

A reply's Command-Name defaults to the request's plus ``.reply``
(``echo`` → ``echo.reply``), so a User-Agent can tell an answer from a
request and a log line says what it is.

Addressing is the SDK's job: to a User-Agent an answer goes with ``d`` = the
request's ``i`` and the same ``u``, on the Tube the request came in on (the
broker only knows that Channel there). To another agent it goes to the
asker's inbox (see ``agents.control``).

A handler that returns ``None`` without having answered a request that
carries ``u`` gets an empty reply sent for it: the User-Agent is waiting,
and silence would cost it the broker's Respondent timeout. A handler that
answers itself (``request.reply``, ``request.stream``, ``request.fault``)
may return ``None``.

:class:`RespondentTable` is the agent's list of what it serves: the handlers
by name, the ones being removed (still serving Commands already on their
way, never registered again), and the private inbox name used for
agent-to-agent answers.

A :class:`Request` answers through a :class:`RequestSession`: the Tube it came
in on (``agents.tube.TubeSession``) in an Application-Agent, the embedded
broker in a Broker-Agent (``agents.broker_agent``). The same handler serves in
either, which is what §3.3 asks of three-tier code ("the great majority of
Application Agent code can be simply moved to a four tier deployment").
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Protocol, TypeAlias

from agents import control
from agents.errors import AgentError
from asbp import (
    ApplicationAgentId,
    ChannelId,
    Command,
    FaultCode,
    HeaderInput,
    ProtocolError,
    SubjectId,
)
from asbp.names import AUTHENTICATED, REFUSED

__all__ = ["Handler", "Part", "Reply", "Request", "RequestSession", "RespondentTable"]

#: What a handler may return.
Reply: TypeAlias = Command | bytes | str | None
#: A handler: ``async def handler(request: Request) -> Reply``.
Handler: TypeAlias = Callable[["Request"], Awaitable[Reply]]
#: One part of a streamed answer.
Part: TypeAlias = Command | bytes | str


class RequestSession(Protocol):
    """Where a :class:`Request` came from and its answers go: one Tube, or a Broker-Agent."""

    @property
    def broker_id(self) -> str:
        """``b`` of the broker the request came through."""
        ...

    async def send(self, command: Command) -> None:
        """Send ``command`` toward the broker as it is (``d`` addresses a Channel).

        Raises:
            ConnectionLost: the way back has closed.
        """
        ...

    async def call(
        self, command: Command, *, timeout: float | None, inbox: str | None = None
    ) -> Command:
        """Send a built-in with a fresh ``u`` and return the broker's answer.

        Raises:
            FaultError: the broker refused.
            ConnectionLost, TimeoutError: no answer.
        """
        ...


class Request:
    """A Command for one of the agent's Respondents, and how to answer it.

    Attributes:
        command: the Command as the broker delivered it.
        answered: whether anything has been sent in answer yet.
    """

    __slots__ = ("_session", "answered", "command")

    def __init__(self, command: Command, session: RequestSession) -> None:
        self.command = command
        self._session = session
        self.answered = False

    def __repr__(self) -> str:
        return f"<Request {self.name!r} u={self.command_id} from {self.origin}>"

    # -- what was asked ------------------------------------------------------

    @property
    def name(self) -> str:
        """``c``, the Command-Name the Respondent was registered for."""
        name = self.command.name
        assert name is not None  # only named Commands are dispatched
        return name

    @property
    def body(self) -> bytes:
        """The request's body."""
        return self.command.body

    @property
    def channel_id(self) -> ChannelId | None:
        """``i``: the User-Agent's Channel; None for a request from an agent."""
        return self.command.channel_id

    @property
    def subject_id(self) -> SubjectId | None:
        """``s``: the Subject the request is about (signing in) or sent as."""
        return self.command.subject_id

    @property
    def command_id(self) -> int | None:
        """``u``: the requester's Command-Identifier, if it wants an answer."""
        return self.command.command_id

    @property
    def agent_id(self) -> ApplicationAgentId | None:
        """``a``: the asking Application-Agent, for agent-to-agent requests."""
        if self.channel_id is not None:
            return None  # the broker strips a from User-Agents; be doubly sure
        return self.command.agent_id

    @property
    def broker_id(self) -> str:
        """The broker the request came through (and the answer goes back through)."""
        return self._session.broker_id

    @property
    def origin(self) -> str:
        """Who asked, for logs: ``channel <i>`` or ``agent <a>``."""
        if self.channel_id is not None:
            return f"channel {self.channel_id}"
        return f"agent {self.agent_id}"

    @property
    def reply_name(self) -> str:
        """The default Command-Name of a reply: the request's plus ``.reply``."""
        return self.name + control.REPLY_SUFFIX

    @property
    def answerable(self) -> bool:
        """Whether an answer can be addressed: from a Channel, or with an inbox."""
        return self.channel_id is not None or isinstance(self.command.get(control.INBOX_KEY), str)

    # -- answering -----------------------------------------------------------

    async def reply(self, body: bytes | str = b"", **keys: HeaderInput) -> None:
        """Send one reply: ``c`` defaults to :attr:`reply_name`.

        Args:
            body: the reply's body; a ``str`` is sent as UTF-8 with ``e=UTF-8``.
            **keys: more header keys (``c`` to choose another name, ``m``...).

        Raises:
            AgentError: the request cannot be answered (it came from an agent
                without an inbox).
            ConnectionLost: the Tube it came in on has closed.
        """
        data = control.text_body(body, keys)
        keys.setdefault("c", self.reply_name)
        await self.send(Command(keys, data))

    async def stream(
        self,
        parts: Iterable[Part] | AsyncIterable[Part],
        *,
        total: int | None = None,
    ) -> None:
        """Answer in several Commands: ``t`` on the first, ``o`` (1-based) on each.

        §1.3.4.2: ``t`` is "the total number of ASBP messages that are
        expected for a large response" and "should only be included with the
        first"; ``o`` identifies "the order and place of this Command". All
        parts carry the request's ``u``; parts without ``c`` get
        :attr:`reply_name`.

        Args:
            parts: the parts, as for a handler's return value. Without
                ``total`` they are collected first, to count them.
            total: how many parts there will be; lets ``parts`` be produced
                lazily (an async generator, say).

        Raises:
            ValueError: no parts, or not ``total`` of them (the stream is then
                incomplete and the User-Agent will see the broker's timeout).
            AgentError, ConnectionLost: as for :meth:`reply`.
        """
        if total is None:
            collected: list[Part] = []
            if isinstance(parts, AsyncIterable):
                collected.extend([part async for part in parts])
            else:
                collected.extend(parts)
            total = len(collected)
            parts = collected
        if total < 1:
            raise ValueError("a stream needs at least one part")
        position = 0
        if isinstance(parts, AsyncIterable):
            async for part in parts:
                position += 1
                await self._send_part(part, position, total)
        else:
            for part in parts:
                position += 1
                await self._send_part(part, position, total)
        if position != total:
            raise ValueError(f"the stream announced {total} parts but had {position}")

    async def _send_part(self, part: Part, position: int, total: int) -> None:
        if position > total:
            raise ValueError(f"the stream announced {total} parts but has more")
        command = self.as_reply(part)
        keys: dict[str, HeaderInput] = {"o": position}
        if position == 1:
            keys["t"] = total
        await self.send(command.with_keys(keys))

    async def fault(self, code: int | FaultCode, message: str) -> None:
        """Answer with an ``asbp.fault`` carrying ``code`` and ``message``.

        Raises:
            AgentError, ConnectionLost: as for :meth:`reply`.
        """
        await self.send(control.fault_command(int(code), message, cause=self.name))

    async def authenticate(self, *roles: str, address: str | None = None) -> None:
        """Sign the Subject of this Authenticate-Command in (docs/protocol.md "Subjects").

        Sends ``c=asbp.authenticated,s=<s>,roles=[...][,p=address]`` to the broker,
        which answers the User-Agent; the Subject's later Authenticated-Commands
        come to this agent with ``s``.

        Args:
            roles: the Subject's roles, for the access-control ``ROLE`` condition.
            address: its Conversation-Address ``p`` (``alice*example.org``), if any.

        Raises:
            AgentError: the request carries no ``s`` (it is not the
                Authenticate-Command, or the broker has Subjects off).
            ProtocolError: a role or the address cannot be carried (code 1203).
            ConnectionLost: the Tube it came in on has closed.
        """
        keys: dict[str, HeaderInput] = {"c": AUTHENTICATED, "s": self._signing_in(), "roles": roles}
        if address is not None:
            keys["p"] = address
        await self.send_to_broker(Command(keys))

    async def refuse(self, reason: str) -> None:
        """Refuse the Subject of this Authenticate-Command; ``reason`` reaches the User-Agent.

        Sends ``c=asbp.refused,s=<s>,e=UTF-8;<reason>``. When every agent asked
        refuses, the User-Agent gets fault 3101 with the reasons.

        Raises:
            AgentError, ConnectionLost: as for :meth:`authenticate`.
        """
        command = Command({"c": REFUSED, "s": self._signing_in(), "e": "UTF-8"}, reason.encode())
        await self.send_to_broker(command)

    def _signing_in(self) -> SubjectId:
        subject = self.subject_id
        if subject is None:
            raise AgentError(f"{self!r} carries no Subject-Identifier s: not a sign-in")
        return subject

    async def send_to_broker(self, command: Command) -> None:
        """Send ``command`` on the Tube the request came in on, exactly as given.

        Unlike :meth:`send`, nothing is added: no ``d``, no ``u``. For the
        Commands an agent sends the broker itself about a request (what
        :meth:`authenticate` and :meth:`refuse` send), or a delivery addressed
        by hand through the same broker.

        Raises:
            ConnectionLost: the Tube it came in on has closed.
        """
        await self._session.send(command)
        self.answered = True

    async def send(self, command: Command) -> None:
        """Send ``command`` to the requester, exactly as given but addressed.

        Raises:
            AgentError, ConnectionLost: as for :meth:`reply`.
        """
        await self._session.send(self.address(command))
        self.answered = True

    def as_reply(self, value: Part) -> Command:
        """A handler's return value (or a stream part) as a reply Command."""
        if isinstance(value, Command):
            return value if "c" in value else value.with_keys(c=self.reply_name)
        keys: dict[str, HeaderInput] = {"c": self.reply_name}
        data = control.text_body(value, keys)
        return Command(keys, data)

    def address(self, command: Command) -> Command:
        """``command`` addressed to the requester, with its ``u``.

        Raises:
            AgentError: there is no way back to the requester.
        """
        keys: dict[str, HeaderInput] = {}
        command_id = self.command_id
        if command_id is not None:
            keys["u"] = command_id
        channel_id = self.channel_id
        if channel_id is not None:
            keys["d"] = channel_id
            return command.with_keys(keys)
        inbox = self.command.get(control.INBOX_KEY)
        if isinstance(inbox, str):
            keys["c"] = inbox
            if command.name is not None:
                keys[control.REPLY_KEY] = command.name
            return command.without_keys("d", "g").with_keys(keys)
        raise AgentError(f"{self!r} cannot be answered: it names no Channel and no inbox")

    # -- groups ----------------------------------------------------------------

    async def join(self, *groups: str, timeout: float | None = 10.0) -> None:
        """Add the requesting Channel to ``groups`` at the broker it came through.

        Raises:
            AgentError: the request did not come from a Channel.
            FaultError: the broker refused.
            ConnectionLost, TimeoutError: no answer from the broker.
        """
        await self._membership(control.JOIN, groups, timeout)

    async def leave(self, *groups: str, timeout: float | None = 10.0) -> None:
        """Remove the requesting Channel from ``groups``; see :meth:`join`."""
        await self._membership(control.LEAVE, groups, timeout)

    async def _membership(self, name: str, groups: tuple[str, ...], timeout: float | None) -> None:
        channel_id = self.channel_id
        if channel_id is None:
            raise AgentError(f"{self!r} did not come from a Channel")
        if not groups:
            raise ValueError("name at least one group")
        command = Command(c=name, groups=list(groups), channels=[channel_id])
        await self._session.call(command, timeout=timeout)


class RespondentTable:
    """Command-Name → handler, plus the names on their way out and the inbox."""

    __slots__ = ("_handlers", "_inbox", "_leaving")

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._leaving: dict[str, Handler] = {}
        self._inbox: str | None = None

    @property
    def names(self) -> frozenset[str]:
        """The Command-Names served (not those being removed, not the inbox)."""
        return frozenset(self._handlers)

    @property
    def inbox(self) -> str | None:
        """The private Command-Name agent-to-agent answers arrive on, once made."""
        return self._inbox

    def make_inbox(self) -> str:
        """The inbox name, made on first use: ``_inbox.<random hex>``."""
        if self._inbox is None:
            self._inbox = f"_inbox.{uuid.uuid4().hex}"
        return self._inbox

    def wanted(self) -> set[str]:
        """Every name that should be registered on every Tube."""
        names = set(self._handlers)
        if self._inbox is not None:
            names.add(self._inbox)
        return names

    def add(self, name: str, handler: Handler) -> None:
        """Serve ``name`` with ``handler``.

        Raises:
            ValueError: ``name`` is the broker's (``asbp.``), cannot be carried
                in a header, or is already served.
        """
        try:
            Command(c=name)  # the name must be a valid header value
        except ProtocolError as exc:
            raise ValueError(f"{name!r} cannot be a Command-Name: {exc}") from exc
        if name.startswith(control.PREFIX):
            raise ValueError(f"Command-Names starting with {control.PREFIX!r} are the broker's")
        if name in self._handlers or name in self._leaving or name == self._inbox:
            raise ValueError(f"{name!r} is already served")
        self._handlers[name] = handler

    def begin_removal(self, name: str) -> None:
        """Stop registering ``name``; its handler still serves until :meth:`end_removal`.

        Raises:
            KeyError: ``name`` is not served.
        """
        self._leaving[name] = self._handlers.pop(name)

    def end_removal(self, name: str) -> None:
        """Forget ``name``'s handler."""
        self._leaving.pop(name, None)

    def lookup(self, name: str) -> Handler | None:
        """The handler for ``name``, including one being removed."""
        return self._handlers.get(name) or self._leaving.get(name)

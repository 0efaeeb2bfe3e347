"""The built-in Commands the broker answers itself (names in asbp.names).

A User-Agent may send ``asbp.ping``, ``asbp.commands`` and, while Subjects are
on, ``asbp.logout``; an Application-Agent may send ``asbp.ping``,
``asbp.commands``, ``asbp.register``, ``asbp.unregister``, ``asbp.join``,
``asbp.leave`` and, while Subjects are on, ``asbp.authenticated`` and
``asbp.refused``. Both may send the messaging requests while topics and queues
are on. The router decides that a Command is one of these (see
gateway.routing.router) and hands it to :meth:`Management.answer`, which answers it,
or passes it on to gateway.messaging or gateway.routing.subject_auth, or faults.

One code path serves both sides: a built-in answered to a Channel and the same
one answered to a Tube differ only in how the reply and faults are sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final

import orjson

from asbp import Command, FaultCode
from asbp.names import (
    ACCEPTED,
    AUTHENTICATED,
    COMMANDS,
    JOIN,
    LEAVE,
    LOGOUT,
    MESSAGING,
    NOTICE,
    NOTIFICATION,
    PING,
    PONG,
    PREFIX,
    REFUSED,
    REGISTER,
    UNREGISTER,
)
from gateway.acl import AccessContext, Privilege
from gateway.connections.channels import Channel, ChannelRegistry
from gateway.connections.tubes import RespondentTable, Tube
from gateway.routing.subject_auth import Authenticator
from gateway.types import MessagingHooks, Replies

__all__ = [
    "CHANNEL_BUILTINS",
    "SUBJECT_BUILTINS",
    "TUBE_BUILTINS",
    "Elsewhere",
    "Management",
    "Permitted",
]

#: Whether the ACL lets an access context send (WRITE) or serve (READ) a Command-Name:
#: ``permitted(who, access, name, privilege, command_id)`` (gateway.routing.router).
Permitted = Callable[[str, AccessContext, str, Privilege, int | None], bool]
#: ``asbp.join`` or ``asbp.leave`` (name, groups, Channel-Identifiers) for Channels
#: at other brokers, and the acceptance to send ``tube`` once the bus has it.
Elsewhere = Callable[[Tube, str, list[str], list[str], Command], None]

#: The built-ins the broker answers for a User-Agent, besides messaging.
CHANNEL_BUILTINS: Final = frozenset({PING, COMMANDS, LOGOUT})
#: The built-ins the broker answers for an Application-Agent, besides messaging.
TUBE_BUILTINS: Final = frozenset(
    {
        PING,
        COMMANDS,
        REGISTER,
        UNREGISTER,
        JOIN,
        LEAVE,
        AUTHENTICATED,
        REFUSED,
    }
)
#: Built-ins that exist only while Subjects are on.
SUBJECT_BUILTINS: Final = frozenset({LOGOUT, AUTHENTICATED, REFUSED})
#: The messaging built-ins a sender may use (notifications and notices only
#: ever come from the broker).
_MESSAGING_REQUESTS: Final = MESSAGING - {
    NOTIFICATION,
    NOTICE,
}


class Management:
    """Answers the built-ins for the router it belongs to.

    Args:
        replies: where answers and faults go.
        channels: the Channels that groups are made of.
        respondents: the Tubes and the Command-Names they serve.
        auth: Subject authentication; None while Subjects are off.
        messaging: topics and queues; None while they are off.
        permitted: asks the ACL; None while it is off.
        may_serve: whether an agent identity may register a Command-Name.
        log: where registrations and refusals are logged.
        directory_written: on a bus of several brokers, the plane's ``written``
            (gateway.plane.base): ``asbp.register`` is accepted once the bus-wide
            directory holds the names, so no Command sent after the acceptance,
            at any broker, can find the name unserved. None: accepted at once.
        elsewhere: on a bus of several brokers, ``asbp.join`` and ``asbp.leave``
            for Channels not at this broker (gateway.routing.remote): it sends the
            acceptance, or fault 2104 for those nowhere on the bus. None: they
            are unknown here (fault 2104, nothing joined).
    """

    def __init__(
        self,
        replies: Replies,
        *,
        channels: ChannelRegistry,
        respondents: RespondentTable,
        auth: Authenticator | None,
        messaging: MessagingHooks | None,
        permitted: Permitted | None,
        may_serve: Callable[[str, str], bool],
        log: logging.Logger,
        directory_written: Callable[[], asyncio.Future[None]] | None = None,
        elsewhere: Elsewhere | None = None,
    ) -> None:
        self._directory_written = directory_written
        self._elsewhere = elsewhere
        self._replies = replies
        self._channels = channels
        self._respondents = respondents
        self._auth = auth
        self._messaging = messaging
        self._permitted = permitted
        self._may_serve = may_serve
        self._log = log

    def answer(self, peer: Channel | Tube, command: Command, name: str) -> None:
        """Answer ``command``, the built-in ``name`` from ``peer``.

        ``name`` is in :data:`CHANNEL_BUILTINS` (from a Channel) or
        :data:`TUBE_BUILTINS` (from a Tube), or in ``MESSAGING``.
        """
        command_id = command.command_id
        if name in MESSAGING:
            messaging = self._messaging
            if messaging is None:
                self._fault(
                    peer,
                    FaultCode.NO_RESPONDENT,
                    "topics and queues are not enabled at this broker",
                    command_id,
                    name,
                )
            elif isinstance(peer, Tube):
                messaging.tube_command(peer, command, name)
            elif "s" not in command:
                messaging.channel_command(peer, peer.access, command, name)
            else:
                access = self._subject_access(peer, command, name)
                if access is not None:
                    messaging.channel_command(peer, access, command, name)
            return
        if name in SUBJECT_BUILTINS:
            auth = self._auth
            if auth is None:
                self._fault(
                    peer,
                    FaultCode.NO_RESPONDENT,
                    "Subjects are not enabled at this broker",
                    command_id,
                    name,
                )
            elif isinstance(peer, Tube):
                auth.answer(peer, command, name)
            else:
                auth.logout(peer, command)
            return
        reply: Command | None
        if name == PING:
            reply = Command({"c": PONG}, command.body)
        elif name == COMMANDS:
            reply = self._commands(TUBE_BUILTINS if isinstance(peer, Tube) else CHANNEL_BUILTINS)
        elif not isinstance(peer, Tube):
            # The router hands a Channel only CHANNEL_BUILTINS and messaging.
            raise AssertionError(f"{name!r} is not a User-Agent built-in")
        elif name in (REGISTER, UNREGISTER):
            reply = self._registration(peer, command, name)
        else:
            reply = self._membership(peer, command, name)
        if reply is None:
            return  # refused with a fault
        if command_id is not None:
            reply = reply.with_keys(u=command_id)
        if isinstance(peer, Tube):
            if name == REGISTER and self._directory_written is not None:
                self._accept_when_written(peer, reply)
                return
            self._replies.send_tube(peer, reply)
        else:
            self._replies.send(peer, reply)

    def _accept_when_written(self, tube: Tube, acceptance: Command) -> None:
        """Send ``acceptance`` of ``asbp.register`` once the directory holds the names.

        The names serve Commands from this broker's Channels at once; only the
        acceptance waits (one Redis round trip, shared with other writes), so an
        agent that sends or advertises after it is never ahead of the bus.
        """

        def accept(future: asyncio.Future[None]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                # Served here already; the plane announces again once Redis is back.
                self._log.warning(
                    "tube.register_unannounced", extra={"tube": tube.id, "error": str(error)}
                )
            if not tube.closed:
                self._replies.send_tube(tube, acceptance)

        assert self._directory_written is not None
        self._directory_written().add_done_callback(accept)

    def _subject_access(
        self, channel: Channel, command: Command, name: str
    ) -> AccessContext | None:
        """The access of the Subject ``s`` names, or None after a fault (3201)."""
        auth = self._auth
        if auth is None:
            # Subjects are off, so no Subject-Identifier belongs to this Channel.
            self._replies.fault(
                channel,
                FaultCode.ACCESS_DENIED,
                "Subject-Identifier 's' does not belong to this Channel",
                command_id=command.command_id,
                cause=name,
            )
            return None
        subject = auth.resolve(channel, command)
        return None if subject is None else subject.access

    def _fault(
        self,
        peer: Channel | Tube,
        code: FaultCode,
        message: str,
        command_id: int | None,
        cause: str,
    ) -> None:
        if isinstance(peer, Tube):
            self._replies.fault_tube(peer, code, message, command_id=command_id, cause=cause)
        else:
            self._replies.fault(peer, code, message, command_id=command_id, cause=cause)

    def _commands(self, side: frozenset[str]) -> Command:
        """COMMANDS: every Command-Name the sender may use right now."""
        usable = side if self._auth else side - SUBJECT_BUILTINS
        if self._messaging is not None:
            usable = usable | _MESSAGING_REQUESTS
        names = sorted(usable) + self._respondents.names()
        return Command({"c": COMMANDS, "m": "application/json"}, orjson.dumps(names))

    def _registration(self, tube: Tube, command: Command, name: str) -> Command | None:
        """REGISTER or UNREGISTER: which Command-Names (``names``) ``tube`` serves."""
        replies = self._replies
        permitted = self._permitted
        command_id = command.command_id
        names_value = command.get("names")
        if not names_value:
            replies.fault_tube(
                tube,
                FaultCode.INVALID_HEADER_VALUE,
                f"{name} needs the Command-Names in 'names'",
                command_id=command_id,
                cause=name,
            )
            return None
        names = [names_value] if isinstance(names_value, str) else list(names_value)
        reserved = [n for n in names if n.startswith(PREFIX)]
        if reserved:
            replies.fault_tube(
                tube,
                FaultCode.ACCESS_DENIED,
                f"Command-Names starting with {PREFIX!r} belong to the broker: "
                f"{', '.join(reserved)}",
                command_id=command_id,
                cause=name,
            )
            return None
        if name == REGISTER:
            forbidden = [
                n
                for n in names
                if not self._may_serve(tube.agent_id, n)
                or (
                    permitted is not None
                    and not permitted(tube.id, tube.access, n, Privilege.READ, command_id)
                )
            ]
            if forbidden:
                # Nothing is registered: an agent that asks for a name it may
                # not serve is misconfigured or spoofing, and must not get the
                # rest by accident either.
                self._log.warning(
                    "tube.register_refused",
                    extra={"tube": tube.id, "agent": tube.agent_id, "names": forbidden},
                )
                replies.fault_tube(
                    tube,
                    FaultCode.ACCESS_DENIED,
                    f"this Application-Agent may not serve {', '.join(forbidden)}",
                    command_id=command_id,
                    cause=name,
                )
                return None
            self._respondents.register(tube, names)
        else:
            self._respondents.unregister(tube, names)
        self._log.info(
            "tube." + name.removeprefix(PREFIX),
            extra={"tube": tube.id, "agent": tube.agent_id, "names": names},
        )
        return Command({"c": ACCEPTED, "cause": name, "names": names})

    def _membership(self, tube: Tube, command: Command, name: str) -> Command | None:
        """JOIN or LEAVE: which Channels (``channels``) belong to which ``groups``."""
        replies = self._replies
        command_id = command.command_id
        groups = command.get("groups")
        group_names = [groups] if isinstance(groups, str) else list(groups or ())
        channel_ids = command.get("channels")
        ids = [channel_ids] if isinstance(channel_ids, str) else list(channel_ids or ())
        if not group_names or not ids:
            replies.fault_tube(
                tube,
                FaultCode.INVALID_HEADER_VALUE,
                f"{name} needs group names in 'groups' and Channel-Identifiers in 'channels'",
                command_id=command_id,
                cause=name,
            )
            return None
        # An HTTP Channel merely visiting here (gateway.routing.http_bus) has its
        # groups at its home broker: the bus takes the join or leave there.
        found = [
            None if channel is None or channel.visitor else channel
            for channel in (self._channels.get(i) for i in ids)
        ]
        channels = [c for c in found if c is not None]
        missing = [i for i, c in zip(ids, found, strict=True) if c is None]
        elsewhere = self._elsewhere
        if missing and elsewhere is not None:
            # Those here change now, the others at their brokers; the answer waits
            # for the bus (an acceptance, or 2104 for any Channel nowhere on it).
            join = self._channels.join if name == JOIN else self._channels.leave
            for group in group_names:
                join(group, channels)
            acceptance = Command({"c": ACCEPTED, "cause": name})
            if command_id is not None:
                acceptance = acceptance.with_keys(u=command_id)
            elsewhere(tube, name, group_names, missing, acceptance)
            return None
        if name == JOIN:
            if missing:
                replies.fault_tube(
                    tube,
                    FaultCode.UNKNOWN_CHANNEL,
                    f"no Channel {', '.join(missing)} at this broker; nothing joined",
                    command_id=command_id,
                    cause=name,
                )
                return None
            for group in group_names:
                self._channels.join(group, channels)
        else:
            for group in group_names:
                self._channels.leave(group, channels)
        return Command({"c": ACCEPTED, "cause": name})

"""The broker's own Commands: names, shapes and the faults it sends.

Every built-in Command-Name starts with ``asbp.``; that prefix is reserved
for the broker, so no Application-Agent may register a name in it. The
extension keys used here (``code``, ``cause``, ``names``, ``tube``) are
unknown keys to the codec and are documented in docs/protocol.md.
"""

from __future__ import annotations

import re
from typing import Final

import asbp
from asbp import Command, FaultCode

__all__ = [
    "ACCEPTED",
    "ACK",
    "AUTHENTICATED",
    "CHANNEL",
    "COMMANDS",
    "FAULT",
    "JOIN",
    "LEAVE",
    "LOGOUT",
    "MESSAGING",
    "NOTICE",
    "NOTIFICATION",
    "PING",
    "POLL",
    "PONG",
    "PREFIX",
    "PUBLISH",
    "REFUSED",
    "REGISTER",
    "SUBJECT_ENDED",
    "SUBSCRIBE",
    "TUBE",
    "UNREGISTER",
    "UNSUBSCRIBE",
    "fault_command",
    "sniff_command_id",
]

#: Reserved for the broker's own Command-Names.
PREFIX: Final = "asbp."
#: Broker → User-Agent, first on a WebSocket Channel: carries ``i`` and ``b``.
CHANNEL: Final = "asbp.channel"
#: Broker → Application-Agent, first on a Tube: carries the verified ``a``,
#: ``b`` and ``tube``.
TUBE: Final = "asbp.tube"
#: Either way: something went wrong; ``code`` is the fault code, the body the
#: message (UTF-8), ``u`` the Command it answers, ``cause`` its name.
FAULT: Final = "asbp.fault"
#: Broker → sender: the broker took responsibility for a Command.
ACCEPTED: Final = "asbp.accepted"
#: Anyone → broker: answered with PONG carrying the same ``u`` and body.
PING: Final = "asbp.ping"
PONG: Final = "asbp.pong"
#: Anyone → broker: answered with the same name and a JSON array body of
#: every Command-Name the sender may use right now.
COMMANDS: Final = "asbp.commands"
#: Application-Agent → broker: start or stop serving the Command-Names in
#: ``names``; acknowledged with ACCEPTED.
REGISTER: Final = "asbp.register"
UNREGISTER: Final = "asbp.unregister"
#: Application-Agent → broker: add the Channels in ``d`` to the groups in
#: ``g`` (JOIN) or remove them (LEAVE); acknowledged with ACCEPTED.
JOIN: Final = "asbp.join"
LEAVE: Final = "asbp.leave"

#: Application-Agent → broker: the Subject ``s`` is authenticated, with its
#: ``roles`` (a list) and optionally its Conversation-Address ``p``. The broker
#: then tells the User-Agent with the same name, ``s``, ``roles`` and the ``u``
#: of its Authenticate-Command.
AUTHENTICATED: Final = "asbp.authenticated"
#: Application-Agent → broker: the Subject ``s`` is refused; the body says why.
REFUSED: Final = "asbp.refused"
#: User-Agent → broker: end the Subject ``s``; answered with ACCEPTED.
LOGOUT: Final = "asbp.logout"
#: Broker → Application-Agent: the Subject ``s`` it authenticated has ended.
SUBJECT_ENDED: Final = "asbp.subject.ended"

# Topics and queues (docs/protocol.md, "Topics and queues"); gateway.messaging
# handles them, for User-Agents and Application-Agents alike.

#: Anyone → broker: publish the body to ``destination`` (``type`` TOPIC or QUEUE).
PUBLISH: Final = "asbp.publish"
#: Anyone → broker: receive what is published to ``destination`` (TOPIC: a name or
#: a regular expression; QUEUE; VIRTUAL_QUEUE: ``name@pattern``).
SUBSCRIBE: Final = "asbp.subscribe"
#: Anyone → broker: end a subscription made with SUBSCRIBE.
UNSUBSCRIBE: Final = "asbp.unsubscribe"
#: Anyone → broker: take up to ``count`` messages from a queue now (pull).
POLL: Final = "asbp.poll"
#: Anyone → broker: a queue message was handled (``receipt``); it leaves the queue.
ACK: Final = "asbp.ack"
#: Broker → subscriber: one message, for one of its subscriptions.
NOTIFICATION: Final = "asbp.notification"
#: Broker → publisher: a delivery notice (``event`` queued or dequeued).
NOTICE: Final = "asbp.notice"
#: The names gateway.messaging answers: the five requests, and the two names only
#: the broker sends (a client that sends one gets fault 1202, as in Sapo).
MESSAGING: Final = frozenset({PUBLISH, SUBSCRIBE, UNSUBSCRIBE, POLL, ACK, NOTIFICATION, NOTICE})

_U_SNIFF: Final = re.compile(rb"(?:^|,)u=(0|[1-9][0-9]{0,4})(?=[,;])")


def fault_command(
    code: FaultCode, message: str, *, command_id: int | None = None, cause: str | None = None
) -> Command:
    """Build the fault Command for ``code``.

    ``cause`` (the name of the Command that failed) is left out when no header
    could carry it; the message names it anyway.
    """
    header: dict[str, asbp.HeaderInput] = {"c": FAULT, "code": int(code), "e": "UTF-8"}
    if command_id is not None:
        header["u"] = command_id
    if cause and "'" not in cause and "\r" not in cause and "\n" not in cause:
        header["cause"] = cause
    return Command(header, message.encode("utf-8", "replace"))


def sniff_command_id(frame: bytes) -> int | None:
    """Best-effort ``u`` of a frame the codec refused, so its fault can carry it.

    Only the first 1 KiB is searched: a frame is refused before this is
    called, and a fault must not cost more than the frame did.
    """
    match = _U_SNIFF.search(frame, 0, 1024)
    if match is None:
        return None
    value = int(match.group(1))
    return value if value <= 65535 else None

"""The broker's built-in Command-Names and the other names both sides speak.

The broker answers these names and the SDK sends them, so they live here, in
the protocol core, and ``gateway`` and ``agents`` both import them (as a
websockets client and server share ``websockets.frames``, never each other).
docs/protocol.md ("Built-in Commands", "Topics and queues", "Subjects") says
what each one carries.

Every built-in Command-Name starts with :data:`PREFIX`; that prefix is
reserved for the broker, so no Application-Agent may register a name in it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACCEPTED",
    "ACK",
    "AUTHENTICATED",
    "BEARER_SUBPROTOCOL_PREFIX",
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
    "RESUME",
    "RESUMED",
    "SECRET_HEADER",
    "SECRET_KEY",
    "SUBJECT_ENDED",
    "SUBSCRIBE",
    "TUBE",
    "UNREGISTER",
    "UNSUBSCRIBE",
]

#: Reserved for the broker's own Command-Names.
PREFIX: Final = "asbp."
#: Broker → User-Agent, first on a WebSocket Channel: carries ``i`` and ``b``.
CHANNEL: Final = "asbp.channel"
#: User-Agent → broker, first on a WebSocket opened at ``/asbp?resume=<i>``:
#: take the Channel ``i`` back with its ``secret`` and the count of frames
#: ``received`` after its greeting (docs/protocol.md, "Resuming a Channel").
RESUME: Final = "asbp.resume"
#: Broker → User-Agent, in place of the greeting on a resumed Channel: ``i``,
#: ``b``, ``received`` (the count the frames that follow continue from) and
#: ``lost`` (Commands past the log's retention).
RESUMED: Final = "asbp.resumed"
#: Broker → Application-Agent, first on a Tube: carries the verified ``a``,
#: ``b`` and ``tube``.
TUBE: Final = "asbp.tube"
#: Either way: something went wrong; ``code`` is the fault code, the body the
#: message (UTF-8), ``u`` the Command it answers, ``cause`` its name
#: (:mod:`asbp.fault_commands` builds and reads one).
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

# Topics and queues (docs/protocol.md, "Topics and queues"), for User-Agents
# and Application-Agents alike.

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
#: The messaging names: the five requests, and the two names only the broker
#: sends (a client that sends one gets fault 1202, as in Sapo).
MESSAGING: Final = frozenset({PUBLISH, SUBSCRIBE, UNSUBSCRIBE, POLL, ACK, NOTIFICATION, NOTICE})

#: An Application-Agent whose WebSocket client cannot set an ``Authorization``
#: header offers its credential as the subprotocol ``asbp.bearer.<JWT>``,
#: beside the real subprotocol (docs/protocol.md, "Tubes"). Not a
#: Command-Name, but a name both ends must spell alike.
BEARER_SUBPROTOCOL_PREFIX: Final = "asbp.bearer."

#: The Channel secret (docs/protocol.md, "The Channel secret"): the key that
#: carries it in ``asbp.accepted`` (HTTP) and in the ``asbp.channel`` greeting
#: (WebSocket), and the HTTP header a client presents it in (or the cookie
#: ``asbp-<i>``). Only the client that opened the Channel ever sees it.
SECRET_KEY: Final = "secret"
SECRET_HEADER: Final = "ASBP-Secret"

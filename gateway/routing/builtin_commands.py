"""The broker's own Commands: names, shapes and the faults it sends.

Every built-in Command-Name starts with ``asbp.``; that prefix is reserved
for the broker, so no Application-Agent may register a name in it. The
extension keys used here (``code``, ``cause``, ``names``, ``tube``) are
unknown keys to the codec and are documented in docs/protocol.md.

The names and the fault Command's shape are protocol vocabulary that the SDK
speaks too, so they are defined in :mod:`asbp.names` and
:mod:`asbp.fault_commands` and re-exported here: ``builtin_commands.PING`` *is*
``asbp.names.PING``, and the broker's modules keep their one import.
"""

from __future__ import annotations

import re
from typing import Final

from asbp.fault_commands import fault_command
from asbp.grammar import MAX_COMMAND_ID
from asbp.names import (
    ACCEPTED,
    ACK,
    AUTHENTICATED,
    CHANNEL,
    COMMANDS,
    FAULT,
    JOIN,
    LEAVE,
    LOGOUT,
    MESSAGING,
    NOTICE,
    NOTIFICATION,
    PING,
    POLL,
    PONG,
    PREFIX,
    PUBLISH,
    REFUSED,
    REGISTER,
    SUBJECT_ENDED,
    SUBSCRIBE,
    TUBE,
    UNREGISTER,
    UNSUBSCRIBE,
)

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

_U_SNIFF: Final = re.compile(rb"(?:^|,)u=(0|[1-9][0-9]{0,4})(?=[,;])")


def sniff_command_id(frame: bytes) -> int | None:
    """Best-effort ``u`` of a frame the codec refused, so its fault can carry it.

    Only the first 1 KiB is searched: a frame is refused before this is
    called, and a fault must not cost more than the frame did.
    """
    match = _U_SNIFF.search(frame, 0, 1024)
    if match is None:
        return None
    value = int(match.group(1))
    return value if value <= MAX_COMMAND_ID else None

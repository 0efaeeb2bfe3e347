"""The broker's built-in Command-Names, as the SDK speaks them, and a few builders.

The names and the fault Command are protocol vocabulary (:mod:`asbp.names`,
:mod:`asbp.fault_commands`; docs/protocol.md, "Built-in Commands"), re-exported
here so the SDK's modules keep one import; the broker imports the same objects,
and the SDK never imports the broker.

Two extension keys are the SDK's own, for agent-to-agent requests (the
broker has no way to address a Tube, so the answer travels as an ordinary
Command to a private Command-Name the asking agent registers, its *inbox*):

``inbox``
    on a request: the Command-Name to send the answer to.
``reply``
    on that answer: the Command-Name the answer would have had if sent to a
    User-Agent (``echo.reply``, or ``asbp.fault`` for a fault).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Final

from asbp import HeaderInput
from asbp.fault_commands import fault_command
from asbp.grammar import MAX_COMMAND_ID
from asbp.names import (
    ACCEPTED,
    CHANNEL,
    COMMANDS,
    FAULT,
    JOIN,
    LEAVE,
    PING,
    PONG,
    PREFIX,
    REGISTER,
    TUBE,
    UNREGISTER,
)

__all__ = [
    "ACCEPTED",
    "CHANNEL",
    "COMMANDS",
    "FAULT",
    "INBOX_KEY",
    "JOIN",
    "LEAVE",
    "MAX_COMMAND_ID",
    "PING",
    "PONG",
    "PREFIX",
    "REGISTER",
    "REPLY_KEY",
    "REPLY_SUFFIX",
    "TUBE",
    "UNREGISTER",
    "CommandIds",
    "fault_command",
    "text_body",
]

#: The SDK's agent-to-agent keys (see the module docstring).
INBOX_KEY: Final = "inbox"
REPLY_KEY: Final = "reply"

#: A reply's default Command-Name is the request's plus this suffix.
REPLY_SUFFIX: Final = ".reply"


def text_body(body: bytes | str, keys: dict[str, HeaderInput]) -> bytes:
    """``body`` as bytes; a ``str`` is UTF-8 and sets ``e`` unless ``keys`` has one."""
    if isinstance(body, str):
        keys.setdefault("e", "UTF-8")
        return body.encode("utf-8")
    return body


class CommandIds:
    """Hands out ``u`` values 0..65535, wrapping, skipping those still in use.

    §1.3.4.2 u: "The User Agent provides this number and should wrap back to
    0 after using all ... identifiers."
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def allocate(self, in_use: Container[int]) -> int:
        """The next ``u`` not in ``in_use``.

        Raises:
            RuntimeError: all 65,536 identifiers are in use.
        """
        for _ in range(MAX_COMMAND_ID + 1):
            command_id = self._next
            self._next = (command_id + 1) % (MAX_COMMAND_ID + 1)
            if command_id not in in_use:
                return command_id
        raise RuntimeError("all 65,536 Command-Identifiers are awaiting answers")

"""The broker's built-in Command-Names, as the SDK speaks them, and a few builders.

These mirror ``gateway.routing.builtin_commands`` (docs/protocol.md, "Built-in Commands");
the SDK must not import the broker's code, so a test keeps the two equal.

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

from asbp import Command, HeaderInput

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

#: Reserved for the broker's own Command-Names.
PREFIX: Final = "asbp."
CHANNEL: Final = "asbp.channel"
TUBE: Final = "asbp.tube"
FAULT: Final = "asbp.fault"
ACCEPTED: Final = "asbp.accepted"
PING: Final = "asbp.ping"
PONG: Final = "asbp.pong"
COMMANDS: Final = "asbp.commands"
REGISTER: Final = "asbp.register"
UNREGISTER: Final = "asbp.unregister"
JOIN: Final = "asbp.join"
LEAVE: Final = "asbp.leave"

#: The SDK's agent-to-agent keys (see the module docstring).
INBOX_KEY: Final = "inbox"
REPLY_KEY: Final = "reply"

#: A reply's default Command-Name is the request's plus this suffix.
REPLY_SUFFIX: Final = ".reply"

#: §1.3.4.2 u: the largest Command-Identifier (the draft's "65,563" is a typo;
#: see docs/protocol.md).
MAX_COMMAND_ID: Final = 65535


def text_body(body: bytes | str, keys: dict[str, HeaderInput]) -> bytes:
    """``body`` as bytes; a ``str`` is UTF-8 and sets ``e`` unless ``keys`` has one."""
    if isinstance(body, str):
        keys.setdefault("e", "UTF-8")
        return body.encode("utf-8")
    return body


def fault_command(code: int, message: str, *, cause: str | None = None) -> Command:
    """An ``asbp.fault`` with ``code`` and ``message``, shaped like the broker's."""
    header: dict[str, HeaderInput] = {"c": FAULT, "code": int(code), "e": "UTF-8"}
    if cause and "'" not in cause and "\r" not in cause and "\n" not in cause:
        header["cause"] = cause
    return Command(header, message.encode("utf-8", "replace"))


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

"""``asbp.fault`` Commands: the one shape both ends build and read.

A fault travels as an ordinary Command named :data:`asbp.names.FAULT` with
the extension keys ``code`` (the fault code) and ``cause`` (the name of the
Command that failed), ``u`` of the Command it answers, and the message as a
UTF-8 body (docs/protocol.md, "Faults on the wire"). The broker sends them
for its own refusals, an Application-Agent for a Respondent's, and both read
them, so the shape is defined once, here.
"""

from __future__ import annotations

from dataclasses import dataclass

from asbp.command import Command, HeaderInput
from asbp.names import FAULT

__all__ = ["FaultReport", "fault_command", "read_fault"]

#: A ``code`` longer than this is not a number any fault table uses; reading it
#: as 0 keeps a hostile peer from handing us a thousand-digit int.
_MAX_CODE_DIGITS = 9


def fault_command(
    code: int, message: str, *, command_id: int | None = None, cause: str | None = None
) -> Command:
    """Build the ``asbp.fault`` Command for ``code``.

    Args:
        code: the fault code (a ``FaultCode``, or any int a peer may use).
        message: what went wrong; unencodable characters become U+FFFD.
        command_id: the ``u`` of the Command it answers, if any.
        cause: the name of the Command that failed. It is left out when no
            header value could carry it (a quote, CR or LF in it); the
            message names it anyway.
    """
    header: dict[str, HeaderInput] = {"c": FAULT, "code": int(code), "e": "UTF-8"}
    if command_id is not None:
        header["u"] = command_id
    if cause and "'" not in cause and "\r" not in cause and "\n" not in cause:
        header["cause"] = cause
    return Command(header, message.encode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class FaultReport:
    """What an ``asbp.fault`` Command says.

    Attributes:
        code: the fault code as sent; 0 when it is missing or not a number.
            A plain ``int``: a peer may send a code our ``FaultCode`` lacks.
        message: the body, decoded as UTF-8 (bad bytes become U+FFFD).
        command_id: the ``u`` it answers, if any.
        cause: the Command-Name it is about, if the sender said.
    """

    code: int
    message: str
    command_id: int | None
    cause: str | None


def read_fault(command: Command) -> FaultReport:
    """Read an ``asbp.fault`` Command; a missing or bad ``code`` reads as 0.

    The name is not checked: a caller that has matched the ``u`` of an answer
    reads it whatever it is called.
    """
    raw = command.get("code")
    code = 0
    # isascii: str.isdigit() also accepts digits such as '²' that int() refuses.
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= _MAX_CODE_DIGITS:
        code = int(raw)
    cause = command.get("cause")
    return FaultReport(
        code=code,
        message=command.body.decode("utf-8", "replace"),
        command_id=command.command_id,
        cause=cause if isinstance(cause, str) else None,
    )

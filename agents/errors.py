"""Errors the agent SDK raises.

::

    Exception
     ├── AgentError              anything the SDK raises on purpose
     │    ├── FaultError         the peer answered with ``asbp.fault``
     │    │                      .code: int  .fault: FaultCode | None
     │    │                      .message  .command_id  .cause
     │    ├── ConnectionLost     the Tube or Channel closed before the answer came
     │    └── NotConnected       no open Tube or Channel to send on
     └── TimeoutError            (built-in) no answer within the timeout

``AgentError`` is deliberately not an ``asbp.AsbpError``: that tree is for
errors *this* process maps to a fault code it sends, and its ``code`` is a
``FaultCode``. A ``FaultError`` is the other direction: a code some peer sent,
which may be one our table does not know, so its ``code`` is a plain ``int``
and ``fault`` is the ``FaultCode`` when the number is one of ours.
"""

from __future__ import annotations

from asbp import Command, FaultCode

__all__ = ["AgentError", "ConnectionLost", "FaultError", "NotConnected"]


class AgentError(Exception):
    """The root of every error the agent SDK raises on purpose."""


class FaultError(AgentError):
    """The peer answered with an ``asbp.fault``.

    Attributes:
        code: the fault code as sent (``FaultCode`` values compare equal).
        message: the fault's body, decoded as UTF-8.
        command_id: the ``u`` it answers, if any.
        cause: the Command-Name it is about, if the peer said.
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = int(code)
        self.message = message
        self.command_id = command_id
        self.cause = cause

    @property
    def fault(self) -> FaultCode | None:
        """The code as a ``FaultCode``, or None for a code our table lacks."""
        try:
            return FaultCode(self.code)
        except ValueError:
            return None

    def __str__(self) -> str:
        about = f" ({self.cause})" if self.cause else ""
        return f"{self.code}{about}: {self.message}"

    @classmethod
    def from_command(cls, command: Command) -> FaultError:
        """Read an ``asbp.fault`` Command; a missing or bad ``code`` reads as 0."""
        raw = command.get("code")
        code = 0
        if isinstance(raw, str) and raw.isdigit() and len(raw) <= 9:
            code = int(raw)
        cause = command.get("cause")
        return cls(
            code,
            command.body.decode("utf-8", "replace"),
            command_id=command.command_id,
            cause=cause if isinstance(cause, str) else None,
        )


class ConnectionLost(AgentError):
    """The Tube or Channel closed while a Command awaited its answer."""


class NotConnected(AgentError):
    """There is no open Tube or Channel to send on."""

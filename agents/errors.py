"""Errors the agent SDK raises.

::

    asbp.AsbpError               the one root (asbp/errors.py draws the rest)
     └── AgentError              anything the SDK raises on purpose
          ├── FaultError         the peer answered with ``asbp.fault``
          │    │                 .code: int  .fault: FaultCode | None
          │    │                 .message  .command_id  .cause
          │    └── BrokerBusy    HTTP 503 or 429: not now (2115, 2108, 2109)
          │                      .retry_after: seconds the broker asked for, or None
          ├── ConnectionLost     the Tube or Channel closed before the answer came
          │    └── ChannelLost   (agents.user_agent) the broker lost the Channel;
          │                      the UserAgent reconnects
          ├── NotConnected       no open Tube or Channel to send on
          ├── MultipartError     (agents.multipart) a long-poll response we cannot read
          ├── StreamError        (agents.streams) parts that do not form one answer
          ├── PublishError       (agents.spark.analytics_publish) no Tube for the summary
          └── SparkError         (agents.spark.errors) the Spark side; its docstring
                                 draws that branch
    TimeoutError                 (built-in) no answer within the timeout

Why under ``AsbpError``: one ``except AsbpError`` then catches anything the
bus stack raises on purpose, and each error carries a ``code`` a Respondent
can answer with. An error the SDK raises inside a handler means the
Respondent failed, so ``AgentError.code`` is ``RESPONDENT_FAILED`` (2107);
a :class:`FaultError` carries the code the peer sent, so re-raising it from a
handler passes the peer's fault on. Unlike the rest of the tree, an
``AgentError`` prints as its message alone: it is read by the SDK's caller,
not sent, and the code of a lost connection would only mislead.
"""

from __future__ import annotations

from asbp import AsbpError, Command, FaultCode, ProtocolError, decode
from asbp.fault_commands import read_fault

__all__ = [
    "AgentError",
    "BrokerBusy",
    "ChannelLost",
    "ConnectionLost",
    "FaultError",
    "NotConnected",
]


class AgentError(AsbpError):
    """The root of every error the agent SDK raises on purpose.

    Attributes:
        code: the fault code a Respondent answers with if this escapes its
            handler (2107, the Respondent failed, unless a subclass knows better).
        message: what went wrong.
    """

    code = FaultCode.RESPONDENT_FAILED

    def __str__(self) -> str:
        return self.message


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
        super().__init__(message)
        # A plain int where the root has a FaultCode: a peer may send a code our
        # table lacks, and refusing to represent it would hide what it said.
        # FaultCode is an IntEnum, so every caller that treats .code as a number
        # (the fault Command builders, comparisons) reads either alike.
        self.code = int(code)  # type: ignore[assignment]  # see above
        # As before this class joined AsbpError, so pickling rebuilds it.
        self.args = (self.code, message)
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
        report = read_fault(command)
        return cls(report.code, report.message, command_id=report.command_id, cause=report.cause)


class BrokerBusy(FaultError):
    """The broker turned the attempt away for now (HTTP 503 or 429) and may have
    said when to come back (``Retry-After``; see :mod:`agents.retry_after`).

    Attributes:
        retry_after: seconds to wait at least before trying again (capped at
            ``agents.retry_after.MAX_RETRY_AFTER``), or None if it did not say.
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        retry_after: float | None = None,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(code, message, command_id=command_id, cause=cause)
        self.retry_after = retry_after

    @classmethod
    def from_response(
        cls, status: int, body: bytes, retry_after: float | None, *, default: int
    ) -> BrokerBusy:
        """From a refusal's body (an ``asbp.fault``, or anything else: code ``default``)."""
        try:
            fault = FaultError.from_command(decode(body))
        except ProtocolError:
            return cls(default, f"HTTP {status}", retry_after=retry_after)
        return cls(
            fault.code,
            fault.message,
            retry_after=retry_after,
            command_id=fault.command_id,
            cause=fault.cause,
        )


class ConnectionLost(AgentError):
    """The Tube or Channel closed while a Command awaited its answer."""


class ChannelLost(ConnectionLost):
    """The User-Agent's Channel ended without ``close()`` (its broker went away).

    A Command awaiting its answer may or may not have been acted on; the
    :class:`~agents.user_agent.UserAgent` reconnects on its own (see
    ``agents.reconnect``), and a request sent meanwhile gets this error too.
    """


class NotConnected(AgentError):
    """There is no open Tube or Channel to send on."""

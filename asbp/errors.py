"""The error tree: every error raised on purpose, by the core or the gateway, has one root.

::

    AsbpError                      .code: FaultCode, .message: str
     ├── ProtocolError             a frame or Command breaks draft section 1.3.4
     │    ├── FrameTooLarge        1101  frame longer than max_frame_bytes
     │    ├── HeaderTooLarge       1104  header longer than max_header_bytes
     │    ├── TooManyKeys          1105  more pairs than max_keys
     │    ├── TooManyListItems     1106  a list longer than max_list_items
     │    ├── MalformedHeader      1201  the grammar is broken
     │    └── InvalidHeaderValue   1203  a reserved key holds a bad value
     ├── GatewayError              the broker's errors, drawn in gateway/errors.py:
     │    │                        faults (AccessDenied 3201, CredentialRefused 3101,
     │    │                        EngineUnavailable 2005, ...) and
     │    └── LocalError           errors never sent to a peer (ConfigError,
     │                             AclConfigError, CredentialConfigError, ...)
     └── AgentError                the SDK's and Spark's errors, drawn below

``asbp`` imports nothing from the gateway, so its branch is drawn here only in outline;
``gateway/errors.py`` holds the full drawing. One ``except AsbpError`` catches any of
them; a fault's ``code`` is what the broker reports to the peer.

The SDK's branch (agents/errors.py and agents/spark/errors.py draw it whole)::

    AsbpError
     └── AgentError                agents: .code 2107 (the Respondent failed)
          ├── FaultError           a fault a peer sent: .code as sent, an int
          ├── ConnectionLost, NotConnected, MultipartError, StreamError
          └── SparkError           agents.spark: EventSourceError, QueryError,
                                   OptionError (also a ValueError), WalError, PublishError
"""

from __future__ import annotations

from asbp.faults import FaultCode

__all__ = [
    "AsbpError",
    "FrameTooLarge",
    "HeaderTooLarge",
    "InvalidHeaderValue",
    "MalformedHeader",
    "ProtocolError",
    "TooManyKeys",
    "TooManyListItems",
]


class AsbpError(Exception):
    """The root of every error the core or the gateway raises on purpose.

    Attributes:
        code: the fault code to report to the peer (errors that never reach a peer,
            gateway's ``LocalError``, keep the default and say so).
        message: what went wrong, for a human.
    """

    code: FaultCode = FaultCode.INVALID_MESSAGE_FORMAT

    def __init__(self, message: str, *, code: FaultCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{int(self.code)}: {self.message}"


class ProtocolError(AsbpError):
    """A frame or Command that the grammar or a reserved key's rule forbids.

    Attributes:
        offset: the byte offset in the frame where the fault was found, or
            ``None`` when the fault is not tied to a position (a Command
            built in code, say).
    """

    def __init__(
        self, message: str, *, offset: int | None = None, code: FaultCode | None = None
    ) -> None:
        self.offset = offset
        if offset is not None:
            message = f"{message} at byte {offset}"
        super().__init__(message, code=code)


class FrameTooLarge(ProtocolError):
    """The whole frame is longer than the frame-size limit."""

    code = FaultCode.INVALID_MESSAGE_SIZE


class HeaderTooLarge(ProtocolError):
    """No header terminator within the header-size limit."""

    code = FaultCode.HEADER_TOO_LARGE


class TooManyKeys(ProtocolError):
    """The header holds more key/value pairs than the key limit."""

    code = FaultCode.TOO_MANY_KEYS


class TooManyListItems(ProtocolError):
    """A bracketed list holds more Value-Tokens than the list limit."""

    code = FaultCode.TOO_MANY_LIST_ITEMS


class MalformedHeader(ProtocolError):
    """The header breaks the grammar of draft section 1.3.4.1."""

    code = FaultCode.INVALID_MESSAGE_FORMAT


class InvalidHeaderValue(ProtocolError):
    """A key is well formed but its value breaks that key's rule.

    Attributes:
        key: the offending key.
    """

    code = FaultCode.INVALID_HEADER_VALUE

    def __init__(self, key: str, message: str, *, offset: int | None = None) -> None:
        self.key = key
        super().__init__(f"key {key!r}: {message}", offset=offset)

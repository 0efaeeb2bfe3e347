"""ASBP, the Asynchronous Services Bus Protocol: a sans-I/O codec.

``decode`` turns one frame into a ``Command``; ``encode`` turns it back. This
package does no I/O of any kind (no sockets, files or event loops), so the
broker, the SDK and the tests all share one exact reading of the draft.

The vocabulary both sides speak lives here too, so the broker (``gateway``)
and the SDK (``agents``) import it and never each other: ``asbp.names`` (the
built-in Command-Names), ``asbp.fault_commands`` (``asbp.fault`` Commands) and
``asbp.eventlog`` (the event log's fields).
"""

from __future__ import annotations

from asbp.codec import decode, encode
from asbp.command import Command, HeaderInput
from asbp.errors import (
    AsbpError,
    FrameTooLarge,
    HeaderTooLarge,
    InvalidHeaderValue,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
)
from asbp.fault_commands import FaultReport, fault_command, read_fault
from asbp.faults import FaultCode
from asbp.grammar import DEFAULT_LIMITS, MAX_COMMAND_ID, KiB, Limits
from asbp.header import (
    RESERVED_KEYS,
    ApplicationAgentId,
    ChannelId,
    ConversationAddress,
    HeaderValue,
    SubjectId,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_COMMAND_ID",
    "RESERVED_KEYS",
    "ApplicationAgentId",
    "AsbpError",
    "ChannelId",
    "Command",
    "ConversationAddress",
    "FaultCode",
    "FaultReport",
    "FrameTooLarge",
    "HeaderInput",
    "HeaderTooLarge",
    "HeaderValue",
    "InvalidHeaderValue",
    "KiB",
    "Limits",
    "MalformedHeader",
    "ProtocolError",
    "SubjectId",
    "TooManyKeys",
    "TooManyListItems",
    "decode",
    "encode",
    "fault_command",
    "read_fault",
]

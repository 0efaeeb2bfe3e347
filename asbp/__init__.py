"""ASBP, the Asynchronous Services Bus Protocol: a sans-I/O codec.

``decode`` turns one frame into a ``Command``; ``encode`` turns it back. This
package does no I/O of any kind (no sockets, files or event loops), so the
broker, the SDK and the tests all share one exact reading of the draft.
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
from asbp.faults import FaultCode
from asbp.grammar import DEFAULT_LIMITS, KiB, Limits
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
    "RESERVED_KEYS",
    "ApplicationAgentId",
    "AsbpError",
    "ChannelId",
    "Command",
    "ConversationAddress",
    "FaultCode",
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
]

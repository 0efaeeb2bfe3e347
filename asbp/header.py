"""The reserved header keys of draft section 1.3.4.2 and their rules.

Each reserved key has an arity (one value, or one-or-more values that may be
written as a single token or a bracketed list) and a rule for each value. The
table ``RESERVED_KEYS`` drives validation, the typed accessors on Command and
the key table in docs/protocol.md (a test keeps the two in step).

Unknown keys are allowed and carried through unchanged: the draft reserves
single letters for itself and says nothing against other keys, and the
broker must be able to forward extension keys between agents it does not
understand. They get the grammar's checks only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, NewType

from asbp.grammar import MAX_COMMAND_ID

__all__ = [
    "RESERVED_KEYS",
    "ApplicationAgentId",
    "Arity",
    "ChannelId",
    "ConversationAddress",
    "HeaderValue",
    "ReservedKey",
    "SubjectId",
    "check_value",
    "format_uint",
    "parse_uint",
]

#: A value in a decoded header: one token, or the tokens of a bracketed list.
HeaderValue = str | tuple[str, ...]

#: §1.3.4.2 i: "A single UUID (without dashes) that is created by the Broker".
ChannelId = NewType("ChannelId", str)
#: §1.3.4.2 s: "A single UUID (without dashes) that uniquely identifies an
#: authenticated User-Agent's subject at the Broker".
SubjectId = NewType("SubjectId", str)
#: §1.3.4.2 a: "uniquely identifies an Application-Agent".
ApplicationAgentId = NewType("ApplicationAgentId", str)
#: §1.2: "A address similar to a email address which has a * instead of an @".
ConversationAddress = NewType("ConversationAddress", str)


class Arity(Enum):
    """How many values a reserved key takes."""

    #: Exactly one token; a bracketed list is refused, even with one item.
    ONE = "one"
    #: One or more tokens, written as one token or as a non-empty list.
    ONE_OR_MORE = "one or more"


# A UUID without dashes, as Python's uuid.UUID.hex writes it: we take the
# lowercase form only, so that one channel has one spelling and a header
# value can be compared as a string.
_UUID_HEX: Final = re.compile(r"[0-9a-f]{32}")
_UINT: Final = re.compile(r"0|[1-9][0-9]*")
_POSITIVE: Final = re.compile(r"[1-9][0-9]*")
_OID: Final = re.compile(r"(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))+")
# RFC 6838 restricted-name on both sides of the slash, optional parameters.
_RESTRICTED_NAME: Final = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MIME: Final = re.compile(rf"{_RESTRICTED_NAME}/{_RESTRICTED_NAME}(?:\s*;.*)?", re.DOTALL)
# §1.3.4.2 z: "if the MIME type name starts with 'application/' the value MAY
# be abbreviated to include the value after the slash".
_COMPRESSION: Final = re.compile(rf"(?:{_RESTRICTED_NAME}/)?{_RESTRICTED_NAME}")
# RFC 2978 mime-charset-chars, plus "." and ":" which registered names use
# (ANSI_X3.4-1968, ISO_8859-1:1987); "'" cannot appear in any token anyway.
_CHARSET: Final = re.compile(r"[A-Za-z0-9!#$%&+\-^_`{}~.:]{1,64}")
# §1.2: Conversation-Addresses "MUST NOT include the single quote character".
# One "*" splits a non-empty local part from a non-empty domain; neither side
# may hold whitespace, controls or another "*".
_ADDRESS_PART: Final = r"[^*'\s\x00-\x1f\x7f-\x9f]+"
_ADDRESS: Final = re.compile(rf"{_ADDRESS_PART}\*{_ADDRESS_PART}")


def _nonempty(value: str) -> str | None:
    return None if value else "must not be empty"


def _uuid_hex(value: str) -> str | None:
    if _UUID_HEX.fullmatch(value):
        return None
    return "must be a UUID as 32 lowercase hex digits without dashes"


def _command_id(value: str) -> str | None:
    if _UINT.fullmatch(value) and len(value) <= 5 and int(value) <= MAX_COMMAND_ID:
        return None
    return f"must be an integer from 0 to {MAX_COMMAND_ID} without leading zeros"


def _one_based(value: str) -> str | None:
    if _POSITIVE.fullmatch(value):
        return None
    return "must be a one-based unsigned integer without leading zeros"


def _unsigned(value: str) -> str | None:
    if _UINT.fullmatch(value):
        return None
    return "must be an unsigned integer without leading zeros"


def _oid(value: str) -> str | None:
    return None if _OID.fullmatch(value) else "must be an OID such as 1.3.6.1.4.1"


def _mime(value: str) -> str | None:
    return None if _MIME.fullmatch(value) else "must be a MIME type such as text/plain"


def _compression(value: str) -> str | None:
    if _COMPRESSION.fullmatch(value):
        return None
    return "must be a MIME type or its part after 'application/', such as x-gzip"


def _charset(value: str) -> str | None:
    return None if _CHARSET.fullmatch(value) else "must be a charset name such as UTF-8"


def _address(value: str) -> str | None:
    if _ADDRESS.fullmatch(value):
        return None
    return "must be a Conversation-Address such as bob*example.org"


@dataclass(frozen=True, slots=True)
class ReservedKey:
    """One row of the draft's reserved-key table (§1.3.4.2)."""

    #: The key itself, one letter.
    key: str
    #: The draft's name for it.
    name: str
    #: One value, or one or more.
    arity: Arity
    #: Returns why a single value is invalid, or None if it is valid.
    check: Callable[[str], str | None]
    #: What we accept, for docs/protocol.md.
    rule: str


RESERVED_KEYS: Final[Mapping[str, ReservedKey]] = {
    k.key: k
    for k in (
        ReservedKey("a", "Application-Agent-Identifier", Arity.ONE, _nonempty, "non-empty text"),
        ReservedKey("b", "Broker-Identifier", Arity.ONE, _nonempty, "non-empty text"),
        ReservedKey("c", "Command-Name", Arity.ONE, _nonempty, "non-empty text"),
        ReservedKey(
            "d",
            "Destination",
            Arity.ONE_OR_MORE,
            _uuid_hex,
            "Channel-Identifiers: 32 lowercase hex digits each",
        ),
        ReservedKey("e", "Encoding", Arity.ONE, _charset, "a charset name (RFC 2978)"),
        ReservedKey("f", "Format", Arity.ONE, _oid, "an OID, dotted decimal"),
        ReservedKey("g", "Group", Arity.ONE_OR_MORE, _nonempty, "non-empty group names"),
        ReservedKey("i", "Channel-Identifier", Arity.ONE, _uuid_hex, "32 lowercase hex digits"),
        ReservedKey(
            "o",
            "Of-Total",
            Arity.ONE,
            _one_based,
            "an integer from 1 up, no leading zeros, any size",
        ),
        ReservedKey("m", "Mime Type", Arity.ONE, _mime, "type/subtype[;parameters]"),
        ReservedKey(
            "r",
            "Recipient",
            Arity.ONE_OR_MORE,
            _address,
            "Conversation-Addresses local*domain",
        ),
        ReservedKey("p", "Publisher", Arity.ONE, _address, "a Conversation-Address local*domain"),
        ReservedKey("s", "Subject-Identifier", Arity.ONE, _uuid_hex, "32 lowercase hex digits"),
        ReservedKey(
            "t", "Total", Arity.ONE, _unsigned, "an integer from 0 up, no leading zeros, any size"
        ),
        ReservedKey(
            "u",
            "User-Agent to Channel Command-Identifier",
            Arity.ONE,
            _command_id,
            "an integer 0..65535, no leading zeros",
        ),
        ReservedKey("x", "Exchange-Command-Name", Arity.ONE, _nonempty, "non-empty text"),
        ReservedKey(
            "z",
            "Compression",
            Arity.ONE,
            _compression,
            "a MIME type, or its subtype alone for application/*",
        ),
    )
}


def check_value(key: str, value: HeaderValue) -> str | None:
    """Return why ``value`` is not allowed for ``key``, or None if it is.

    Only the rules of the reserved keys are checked here; the grammar (which
    characters a token may hold) is the codec's and Command's business.
    """
    spec = RESERVED_KEYS.get(key)
    if spec is None:
        return None
    if type(value) is str:
        return spec.check(value)
    if spec.arity is Arity.ONE:
        return "takes a single value, not a list"
    if not value:
        return "takes one or more values, not an empty list"
    for item in value:
        reason = spec.check(item)
        if reason is not None:
            return reason
    return None


# Python refuses int() on strings past 4300 digits (CVE-2020-10735), but the
# draft gives o and t "any size"; the header limit bounds the length, so a
# chunked conversion costs little and keeps the accessor total.
_INT_CHUNK: Final = 4000
#: 10**_INT_CHUNK, computed once: it is a 13,000-bit number.
_INT_CHUNK_BASE: Final = 10**_INT_CHUNK


def parse_uint(text: str) -> int:
    """Convert an already validated unsigned decimal string of any length."""
    if len(text) <= _INT_CHUNK:
        return int(text)
    result = 0
    for start in range(0, len(text), _INT_CHUNK):
        chunk = text[start : start + _INT_CHUNK]
        result = result * 10 ** len(chunk) + int(chunk)
    return result


def format_uint(value: int) -> str:
    """Decimal text of a non-negative int of any size (the inverse of parse_uint)."""
    if value < _INT_CHUNK_BASE:
        return int.__str__(value)
    chunks: list[str] = []
    base = _INT_CHUNK_BASE
    while value:
        value, chunk = divmod(value, base)
        chunks.append(f"{chunk:0{_INT_CHUNK}d}")
    return chunks[-1].lstrip("0") + "".join(reversed(chunks[:-1]))

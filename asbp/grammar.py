"""The header grammar of draft-adligo-hybi-asbp-02, section 1.3.4, in one place.

Every rule below quotes the draft (../shared/reference/asbp-draft-02.txt) and,
where the draft is silent or ambiguous, says which reading we chose. Each such
choice has an entry in docs/protocol.md ("Ambiguities and choices").

The ABNF we implement (also in docs/protocol.md)::

    frame       = header ";" body
    header      = [ "+" ] pair *( "," pair )
    pair        = key "=" value
    key         = 1*bare-char
    value       = token / list
    list        = "[" [ token *( "," token ) ] "]"
    token       = bare / quoted
    bare        = 1*bare-char
    quoted      = "'" *quoted-char "'"
    bare-char   = any character except reserved, whitespace and controls
    quoted-char = any character except "'", CR and LF
    reserved    = ";" / "=" / "," / "'" / "[" / "]" / "+"
    body        = *OCTET

Without the leading "+" the header is ASCII; with it, UTF-8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_COMMAND_ID",
    "QUOTE",
    "RESERVED",
    "TERMINATOR",
    "UTF8_MARKER",
    "KiB",
    "Limits",
    "is_bare",
]

#: One kibibyte, for readable limits.
KiB: Final = 1024

# §1.3.4.1: reserved = ";" / "=" / "," / "'" / "[" / "]" / "+"
RESERVED: Final = frozenset(";=,'[]+")
#: §1.3.4: "may be upgraded to the UTF-8 character encoding by starting the
#: header with the '+' character". Anywhere else "+" is a reserved character
#: out of place (see the "+d=" ambiguity in docs/protocol.md).
UTF8_MARKER: Final = "+"
#: §1.3.4.1: "Key Value-Token(s) pairs followed by a semicolon which
#: terminates the header".
TERMINATOR: Final = ";"
#: §1.3.4: "Value-Tokens may be wrapped in single quotes". There is no
#: escaping, so a quote can never appear inside a quoted token.
QUOTE: Final = "'"
#: §1.3.4.2 u: "The value should be between 0 and 65,563"; 65,563 is a typo for
#: 65,535, the largest 16-bit value (docs/protocol.md, "65,563" in ``u``). A
#: User-Agent wraps back to 0 after it.
MAX_COMMAND_ID: Final = 65535

# §1.3.4.1: "All whitespace characters MUST NOT be included in a ASBP header
# outside of a Value-Token wrapped by single quotes." We read "whitespace" as
# Unicode whitespace (Python's str.isspace, which is what `\s` matches), and we
# also keep control characters (C0, DEL, C1) out of bare tokens: they are
# invisible in logs and the draft gives no reason to allow them. Quoted tokens
# take them, as the draft says ("anything except ', CR and LF").
_BARE_CHAR: Final = r"[^;=,'\[\]+\s\x00-\x1f\x7f-\x9f\ud800-\udfff]"
_BARE: Final = _BARE_CHAR + "+"
# §1.3.4.1: "Value-Tokens MUST NOT contain Carriage-Return (CR) or Line-Feed
# (LF) characters." Lone surrogates are not text and cannot be UTF-8 encoded.
_QUOTED: Final = r"'[^'\r\n\ud800-\udfff]*'"
_TOKEN: Final = rf"(?:{_BARE}|{_QUOTED})"
_LIST: Final = rf"\[(?:{_TOKEN}(?:,{_TOKEN})*)?\]"
_PAIR: Final = rf"{_BARE}=(?:{_TOKEN}|{_LIST})"

#: The whole header text (after the UTF-8 marker, before the terminator).
HEADER_RE: Final = re.compile(rf"{_PAIR}(?:,{_PAIR})*")
#: One pair, with groups (key, token-with-quotes, list-with-brackets). Used
#: with findall on text that HEADER_RE already accepted, so it never has to
#: reject anything itself.
PAIR_RE: Final = re.compile(rf"({_BARE})=(?:({_TOKEN})|({_LIST}))")
#: One list item (quotes kept), for findall inside an accepted list.
ITEM_RE: Final = re.compile(_TOKEN)
#: A single bare token, for the encoder's choice of bare or quoted form.
BARE_RE: Final = re.compile(_BARE)
#: One character that a bare token may hold, for the diagnostic scanner.
BARE_CHAR_RE: Final = re.compile(_BARE_CHAR)
#: Characters no Value-Token can carry, quoted or not.
UNCARRIABLE_RE: Final = re.compile(r"['\r\n\ud800-\udfff]")
#: Finds where the header ends in the raw frame when quotes come before the
#: first ";": quoted tokens hide ";" and UTF-8 continuation bytes are never
#: 0x27 or 0x3B, so a byte-level scan is exact for ASCII and UTF-8 alike.
HEADER_END_RE: Final = re.compile(rb"(?:[^;']+|'[^']*')*")


def is_bare(value: str) -> bool:
    """Whether ``value`` can be written as a bare (unquoted) token."""
    return BARE_RE.fullmatch(value) is not None


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits that keep a hostile frame from costing more than it should.

    Every limit is inclusive: a value equal to the limit is accepted. Breaching
    one raises a ProtocolError subclass with its own fault code; nothing is
    ever truncated.
    """

    #: The whole frame: header, terminator and body. 256 KiB is Sapo-Broker's
    #: message size limit ("a message size limit is set at 256KB").
    max_frame_bytes: int = 256 * KiB
    #: Header bytes before the ";", counting the "+" marker.
    max_header_bytes: int = 8 * KiB
    #: Key/value pairs in one header.
    max_keys: int = 64
    #: Value-Tokens in one bracketed list.
    max_list_items: int = 1024

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_header_bytes", "max_keys", "max_list_items"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")


#: The limits ``decode`` and ``encode`` use unless told otherwise.
DEFAULT_LIMITS: Final = Limits()

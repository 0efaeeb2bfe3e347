"""decode and encode: frames to Commands and back, with no I/O.

ASBP has no length field: the body runs to the end of the frame. So every
transport frame (a WebSocket message, an HTTP body, one part of a multipart
response) carries exactly one Command, and the codec works on whole frames.

Theory of operation for ``decode``, which every inbound Command crosses:

1. Size checks that cost nothing: the frame limit, then the header
   terminator, found with ``bytes.find`` (a quote before it sends us to a
   quote-aware scan, since quoted tokens may hold ";").
2. The header bytes become text: ASCII, or UTF-8 after a leading "+".
3. One regular expression accepts or rejects the whole header. Accepting is
   the fast path; only on rejection does ``_diagnose`` walk the text by
   hand to say what is wrong and at which byte.
4. ``findall`` splits the accepted text into pairs, the reserved keys get
   their rules checked, and the Command is built without checking again.

The hand-written scanner is the reference reading of the grammar; the tests
check with Hypothesis that it and the regular expression agree.
"""

from __future__ import annotations

from typing import NoReturn

from asbp.command import Command
from asbp.errors import (
    FrameTooLarge,
    HeaderTooLarge,
    InvalidHeaderValue,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
)
from asbp.grammar import (
    BARE_CHAR_RE,
    BARE_RE,
    DEFAULT_LIMITS,
    HEADER_END_RE,
    HEADER_RE,
    ITEM_RE,
    PAIR_RE,
    QUOTE,
    RESERVED,
    UTF8_MARKER,
    Limits,
)
from asbp.header import RESERVED_KEYS, HeaderValue, check_value

__all__ = ["decode", "encode"]

_SEMICOLON = 0x3B
_PLUS = 0x2B


def decode(frame: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Command:
    """Read one Command from one frame.

    Args:
        frame: the whole transport frame (bytes-like).
        limits: the size limits to enforce.

    Raises:
        ProtocolError: the frame is too large or the header is malformed or
            breaks a reserved key's rule; ``.code`` says which, ``.offset``
            says where.
    """
    if type(frame) is not bytes:
        frame = bytes(frame)
    size = len(frame)
    if size > limits.max_frame_bytes:
        raise FrameTooLarge(
            f"frame of {size} bytes exceeds the limit of {limits.max_frame_bytes}",
            offset=limits.max_frame_bytes,
        )
    header_limit = limits.max_header_bytes
    end = frame.find(b";", 0, header_limit + 1)
    if end == -1 or frame.find(b"'", 0, end) != -1:
        end = _quoted_header_end(frame, header_limit)
    if frame[0] == _PLUS:
        base = 1
        raw = frame[1:end]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedHeader(
                f"header is not valid UTF-8 ({exc.reason})", offset=base + exc.start
            ) from None
    else:
        base = 0
        raw = frame[:end]
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as exc:
            raise MalformedHeader(
                f"byte 0x{raw[exc.start]:02x} is not ASCII and the header does not start "
                "with '+', the UTF-8 marker",
                offset=exc.start,
            ) from None
    if HEADER_RE.fullmatch(text) is None:
        _diagnose(text, base)
    pairs = PAIR_RE.findall(text)
    if len(pairs) > limits.max_keys:
        raise TooManyKeys(
            f"header has {len(pairs)} keys, more than the limit of {limits.max_keys}",
            offset=_key_offset(text, base, limits.max_keys),
        )
    header: dict[str, HeaderValue] = {}
    max_items = limits.max_list_items
    for key, token, items in pairs:
        if key in header:
            raise MalformedHeader(
                f"duplicate key {key!r}", offset=_key_offset(text, base, len(header))
            )
        value: HeaderValue
        if token:
            value = token[1:-1] if token[0] == QUOTE else token
        else:
            tokens = ITEM_RE.findall(items)
            if len(tokens) > max_items:
                raise TooManyListItems(
                    f"list of {key!r} has {len(tokens)} items, more than the limit of {max_items}",
                    offset=_key_offset(text, base, len(header)),
                )
            value = tuple([t[1:-1] if t[0] == QUOTE else t for t in tokens])
        if key in RESERVED_KEYS:
            reason = check_value(key, value)
            if reason is not None:
                raise InvalidHeaderValue(key, reason, offset=_key_offset(text, base, len(header)))
        header[key] = value
    return Command._trusted(header, frame[end + 1 :])


def _quoted_header_end(frame: bytes, header_limit: int) -> int:
    """Find the terminator when quotes may hide a ";" (or none was found)."""
    match = HEADER_END_RE.match(frame, 0, header_limit + 1)
    assert match is not None  # the pattern matches the empty string
    end = match.end()
    if end <= header_limit and end < len(frame):
        if frame[end] == _SEMICOLON:
            return end
        # HEADER_END_RE stops only at ";" or at a quote it cannot close in
        # the window; a quote closed past the window is a header too long.
        if frame.find(b"'", end + 1) == -1:
            raise MalformedHeader("quoted token is never closed", offset=end)
    elif end == len(frame):
        raise MalformedHeader("no ';' ends the header", offset=end)
    raise HeaderTooLarge(
        f"no ';' ends the header within the limit of {header_limit} bytes",
        offset=header_limit,
    )


def _byte_offset(text: str, index: int, base: int) -> int:
    return base + len(text[:index].encode("utf-8"))


def _key_offset(text: str, base: int, pair_index: int) -> int:
    """The byte offset of the key of the pair at ``pair_index``."""
    for n, match in enumerate(PAIR_RE.finditer(text)):
        if n == pair_index:
            return _byte_offset(text, match.start(), base)
    raise AssertionError("pair index beyond the header")  # pragma: no cover


def _describe(char: str) -> str:
    if char == UTF8_MARKER:
        return "'+' (the UTF-8 marker may only be the first byte of a header)"
    if char.isspace():
        return f"whitespace U+{ord(char):04X} outside quotes"
    if char in RESERVED:
        return f"reserved character {char!r}"
    return f"control character U+{ord(char):04X} outside quotes"


def _diagnose(text: str, base: int) -> NoReturn:
    """Walk a header the fast path refused and raise what is wrong, where.

    This is the grammar of grammar.py written out by hand. It must raise for
    exactly the texts HEADER_RE refuses; the tests hold it to that.
    """

    def fail(message: str, index: int) -> NoReturn:
        raise MalformedHeader(message, offset=_byte_offset(text, index, base))

    def bare(pos: int) -> int:
        while pos < size and BARE_CHAR_RE.match(text, pos):
            pos += 1
        return pos

    def token(pos: int, what: str) -> int:
        if pos == size:
            fail(f"{what} is missing before the end of the header", pos)
        if text[pos] == QUOTE:
            close = text.find(QUOTE, pos + 1)
            newline = min(
                (i for i in (text.find("\r", pos + 1), text.find("\n", pos + 1)) if i != -1),
                default=-1,
            )
            if newline != -1 and (close == -1 or newline < close):
                fail("CR or LF inside a quoted token", newline)
            if close == -1:
                fail("quoted token is never closed", pos)
            return close + 1
        end = bare(pos)
        if end == pos:
            char = text[pos]
            if char in ",;]":
                fail(f"{what} is empty (write '' for an empty text)", pos)
            fail(f"{what} cannot start with {_describe(char)}", pos)
        return end

    size = len(text)
    pos = 0
    if size == 0:
        fail("header is empty; a Command needs at least one key", 0)
    while True:
        end = bare(pos)
        if end == pos:
            fail(f"expected a key, found {_describe(text[pos])}", pos)
        if end == size:
            fail(f"key {text[pos:end]!r} has no '=' and value", end)
        if text[end] != "=":
            fail(f"expected '=' after key {text[pos:end]!r}, found {_describe(text[end])}", end)
        pos = end + 1
        if pos < size and text[pos] == "[":
            pos += 1
            if pos < size and text[pos] == "]":
                pos += 1
            else:
                while True:
                    pos = token(pos, "list item")
                    if pos == size:
                        fail("list is never closed with ']'", pos)
                    if text[pos] == "]":
                        pos += 1
                        break
                    if text[pos] != ",":
                        fail(f"expected ',' or ']' in a list, found {_describe(text[pos])}", pos)
                    pos += 1
        else:
            pos = token(pos, "value")
        if pos == size:
            break
        if text[pos] != ",":
            fail(f"expected ',' or ';' after a value, found {_describe(text[pos])}", pos)
        pos += 1
        if pos == size:
            fail("trailing ',' before the end of the header", pos - 1)
    # Reaching here means the scanner accepted what the regular expression
    # refused: a bug, never a client's fault, but still reported as a fault.
    raise ProtocolError("header refused by the grammar", offset=base)  # pragma: no cover


def _token(value: str) -> str:
    # Most values (ids, numbers) are alphanumeric: skip the regex for them.
    if value.isalnum() or (value and BARE_RE.fullmatch(value) is not None):
        return value
    return f"'{value}'"


def encode(command: Command, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Write one Command as one frame.

    Tokens are written bare when they can be and quoted otherwise; the "+"
    UTF-8 marker is written only when the header holds non-ASCII text.

    Raises:
        ProtocolError: the frame would break ``limits`` (the peer would refuse
            it). A Command's values are always carriable: Command refuses
            the others when it is built.
    """
    header = command.header
    if len(header) > limits.max_keys:
        raise TooManyKeys(
            f"header has {len(header)} keys, more than the limit of {limits.max_keys}"
        )
    parts = []
    for key, value in header.items():
        if type(value) is str:
            parts.append(f"{key}={_token(value)}")
        else:
            if len(value) > limits.max_list_items:
                raise TooManyListItems(
                    f"list of {key!r} has {len(value)} items, more than the limit of "
                    f"{limits.max_list_items}"
                )
            parts.append(f"{key}=[{','.join([_token(v) for v in value])}]")
    text = ",".join(parts)
    data = text.encode("ascii") if text.isascii() else b"+" + text.encode("utf-8")
    if len(data) > limits.max_header_bytes:
        raise HeaderTooLarge(
            f"header of {len(data)} bytes exceeds the limit of {limits.max_header_bytes}"
        )
    frame = data + b";" + command.body
    if len(frame) > limits.max_frame_bytes:
        raise FrameTooLarge(
            f"frame of {len(frame)} bytes exceeds the limit of {limits.max_frame_bytes}"
        )
    return frame

"""Hypothesis properties of the codec.

- Every representable Command survives ``decode(encode(c)) == c``, and
  ``encode`` writes the "+" marker exactly when the header is not ASCII.
- ``decode`` of any bytes (random, grammar-shaped, or a valid frame with a few
  bytes inserted, deleted or replaced) raises nothing but ProtocolError, with
  a code and an offset inside the frame; what it accepts re-encodes to the
  same Command.
- ``decode`` agrees with an independent reading of the grammar written here
  (a small hand parser using ``unicodedata``, not asbp's regular
  expressions), and ``codec._diagnose`` (the error reporter) refuses exactly
  the header texts that ``grammar.HEADER_RE`` refuses.
"""

from __future__ import annotations

import sys
import unicodedata

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from asbp import (
    RESERVED_KEYS,
    Command,
    FaultCode,
    FrameTooLarge,
    HeaderTooLarge,
    HeaderValue,
    InvalidHeaderValue,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
    decode,
    encode,
)
from asbp.codec import _diagnose
from asbp.grammar import HEADER_RE
from tests.support.strategies import (
    NOT_BARE_CATEGORIES,
    RESERVED_VALUES,
    any_frames,
    commands,
    grammar_frames,
)

CONCRETE_ERRORS = (
    FrameTooLarge,
    HeaderTooLarge,
    TooManyKeys,
    TooManyListItems,
    MalformedHeader,
    InvalidHeaderValue,
)


def test_whitespace_categories() -> None:
    """The strategies' reading of "bare": no str.isspace() character slips in."""
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if char.isspace():
            assert unicodedata.category(char) in NOT_BARE_CATEGORIES, hex(code)


def test_reserved_values_cover_the_table() -> None:
    assert set(RESERVED_VALUES) == set(RESERVED_KEYS)


# -- helpers --------------------------------------------------------------------


def _is_ascii(command: Command) -> bool:
    texts = [*command.header]
    for value in command.header.values():
        texts += [value] if isinstance(value, str) else list(value)
    return all(text.isascii() for text in texts)


def _check_refusal(frame: bytes, error: ProtocolError) -> None:
    assert isinstance(error, CONCRETE_ERRORS), error
    assert error.code in set(FaultCode)
    assert error.offset is not None
    assert 0 <= error.offset <= len(frame)
    assert error.message.endswith(f" at byte {error.offset}")


def _decode_checked(frame: bytes) -> Command | None:
    """decode, asserting that it raises nothing but a well-formed ProtocolError,
    and that whatever it accepts re-encodes to the same Command."""
    try:
        command = decode(frame)
    except ProtocolError as error:
        _check_refusal(frame, error)
        return None
    again = encode(command)
    assert decode(again) == command
    assert encode(decode(again)) == again
    return command


# -- round trips ----------------------------------------------------------------


@given(commands())
def test_round_trip(command: Command) -> None:
    frame = encode(command)
    decoded = decode(frame)
    assert decoded == command
    assert list(decoded.header) == list(command.header)
    assert decoded.body == command.body
    assert encode(decoded) == frame
    # The marker is written exactly when the header is not ASCII.
    assert frame.startswith(b"+") is not _is_ascii(command)


# -- decode never raises anything else --------------------------------------------


@given(any_frames)
def test_decode_arbitrary_bytes(frame: bytes) -> None:
    _decode_checked(frame)


MUTATION_BYTES = st.one_of(
    st.sampled_from(list(b";=,'[]+ \r\n\x00\x7f\x80\xc3\xff")), st.integers(0, 255)
)


@given(commands(), st.data())
def test_decode_mutated_frames(command: Command, data: st.DataObject) -> None:
    frame = bytearray(encode(command))
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        kind = data.draw(st.sampled_from(["insert", "delete", "replace"]), label="kind")
        if kind == "insert":
            index = data.draw(st.integers(0, len(frame)), label="index")
            frame.insert(index, data.draw(MUTATION_BYTES, label="byte"))
        elif frame:
            index = data.draw(st.integers(0, len(frame) - 1), label="index")
            if kind == "delete":
                del frame[index]
            else:
                frame[index] = data.draw(MUTATION_BYTES, label="byte")
    _decode_checked(bytes(frame))


# -- an independent reading of the grammar -----------------------------------------


class _Refused(Exception):
    pass


def _reference_decode(frame: bytes) -> tuple[dict[str, HeaderValue], bytes]:
    """Section 1.3.4 read by hand, with the choices of docs/protocol.md, but
    without the reserved keys' rules or the size limits (the frames used are
    small). Raises _Refused."""
    start = 1 if frame[:1] == b"+" else 0
    quoted = False
    for end in range(start, len(frame)):
        if frame[end] == ord("'"):
            quoted = not quoted
        elif frame[end] == ord(";") and not quoted:
            break
    else:
        raise _Refused("no terminator")
    try:
        text = frame[start:end].decode("utf-8" if start else "ascii")
    except UnicodeDecodeError:
        raise _Refused("encoding") from None

    def is_bare(char: str) -> bool:
        return char not in ";=,'[]+" and not char.isspace() and unicodedata.category(char) != "Cc"

    pos = 0

    def expect(char: str) -> None:
        nonlocal pos
        if text[pos : pos + 1] != char:
            raise _Refused(f"expected {char!r} at {pos}")
        pos += 1

    def bare() -> str:
        nonlocal pos
        begin = pos
        while pos < len(text) and is_bare(text[pos]):
            pos += 1
        if pos == begin:
            raise _Refused(f"empty bare token at {pos}")
        return text[begin:pos]

    def token() -> str:
        nonlocal pos
        if text[pos : pos + 1] != "'":
            return bare()
        close = text.find("'", pos + 1)
        if close == -1 or "\r" in text[pos:close] or "\n" in text[pos:close]:
            raise _Refused(f"bad quoted token at {pos}")
        value, pos = text[pos + 1 : close], close + 1
        return value

    header: dict[str, HeaderValue] = {}
    while True:
        key = bare()
        expect("=")
        if text[pos : pos + 1] == "[":
            pos += 1
            items: list[str] = []
            if text[pos : pos + 1] != "]":
                items.append(token())
                while text[pos : pos + 1] == ",":
                    pos += 1
                    items.append(token())
            expect("]")
            value: HeaderValue = tuple(items)
        else:
            value = token()
        if key in header:
            raise _Refused(f"duplicate {key!r}")
        header[key] = value
        if pos == len(text):
            return header, frame[end + 1 :]
        expect(",")


@given(st.one_of(grammar_frames, commands().map(encode)))
def test_decode_agrees_with_reference_reading(frame: bytes) -> None:
    try:
        header, body = _reference_decode(frame)
    except _Refused:
        with pytest.raises(ProtocolError) as info:
            decode(frame)
        assert info.value.code is FaultCode.INVALID_MESSAGE_FORMAT
        return
    if any(key in RESERVED_KEYS for key in header):
        try:
            command = decode(frame)
        except InvalidHeaderValue as error:
            assert error.key in header
            return
    else:
        command = decode(frame)
    assert dict(command.header) == header
    assert list(command.header) == list(header)
    assert command.body == body


#: Pieces of header texts, for _diagnose (which decode only shows texts with
#: balanced quotes: the byte scan that finds the terminator pairs them).
TEXT_PIECES = [
    "k",
    "k2",
    "=",
    ",",
    "'",
    "[",
    "]",
    "+",
    " ",
    "\r",
    "\n",
    "x y",
    "''",
    "\xe9",
    "\x85",
]
header_texts = st.one_of(
    st.lists(st.sampled_from(TEXT_PIECES), max_size=16).map("".join),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=16),
)


def _header_text(command: Command) -> str:
    return encode(command.with_body(b""))[:-1].decode("utf-8")


@given(st.one_of(header_texts, commands().map(_header_text)))
@example("k='never closed")
@example("k=['never closed]")
@example("k=v,j=[a,'b;c'],l=''")
def test_diagnose_refuses_exactly_what_the_regex_refuses(text: str) -> None:
    text = text.removeprefix("+")
    with pytest.raises(ProtocolError) as info:
        _diagnose(text, 1)
    if HEADER_RE.fullmatch(text) is None:
        assert type(info.value) is MalformedHeader
        assert info.value.offset is not None
        assert 1 <= info.value.offset <= 1 + len(text.encode("utf-8"))
    else:
        # The scanner found nothing wrong: it falls through to its guard.
        assert type(info.value) is ProtocolError
        assert info.value.message == "header refused by the grammar at byte 1"

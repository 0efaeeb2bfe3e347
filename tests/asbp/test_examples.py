"""The examples of draft-adligo-hybi-asbp-02, section 1.3.4, as test vectors.

The draft prints each example across two lines ("Note RFC line wrap
formatting"); the frames below are joined without the wrap. The second
example writes the UTF-8 marker in the middle of the header (``,+d=``),
which section 1.3.4 forbids ("by starting the header with the '+'
character"): the literal form is refused, and its two corrected forms (the
marker moved to the front, or dropped since the header is ASCII) decode to
the same Command.
"""

from __future__ import annotations

import pytest

from asbp import Command, FaultCode, MalformedHeader, ProtocolError, decode, encode

CHANNEL = "de305d5475b4431badb2eb6b9e546014"

#: §1.3.4, "An example ASBP header follows".
HEADER_EXAMPLE = b"c='display text',g=['friends','country men'],d=" + CHANNEL.encode() + b";"
#: §1.3.4, "An example ASBP message (header and data) follows", as printed.
MESSAGE_EXAMPLE_LITERAL = (
    b"c='display text',g=[friends,'country men'],+d=" + CHANNEL.encode() + b";Hello World!"
)
#: The message example with the marker where the draft's own rule puts it.
MESSAGE_EXAMPLE_MARKED = (
    b"+c='display text',g=[friends,'country men'],d=" + CHANNEL.encode() + b";Hello World!"
)
#: The message example without the marker: its header is plain ASCII.
MESSAGE_EXAMPLE_ASCII = (
    b"c='display text',g=[friends,'country men'],d=" + CHANNEL.encode() + b";Hello World!"
)

EXPECTED_HEADER = Command(c="display text", g=("friends", "country men"), d=CHANNEL)
EXPECTED_MESSAGE = Command(
    {"c": "display text", "g": ["friends", "country men"], "d": CHANNEL}, b"Hello World!"
)
#: What encode writes: bare where it can, quoted where it must, no marker.
CANONICAL = b"c='display text',g=[friends,'country men'],d=" + CHANNEL.encode() + b";"


def test_header_example_decodes() -> None:
    command = decode(HEADER_EXAMPLE)
    assert command == EXPECTED_HEADER
    assert command.body == b""
    assert command.name == "display text"
    assert command.groups == ("friends", "country men")
    assert command.destinations == (CHANNEL,)
    assert list(command.header) == ["c", "g", "d"]


def test_header_example_reencodes() -> None:
    command = decode(HEADER_EXAMPLE)
    assert encode(command) == CANONICAL
    assert decode(encode(command)) == command


@pytest.mark.parametrize(
    "frame",
    [MESSAGE_EXAMPLE_MARKED, MESSAGE_EXAMPLE_ASCII],
    ids=["marker-first", "no-marker"],
)
def test_message_example_corrected_decodes(frame: bytes) -> None:
    command = decode(frame)
    assert command == EXPECTED_MESSAGE
    assert command.body == b"Hello World!"
    assert encode(command) == CANONICAL + b"Hello World!"
    assert decode(encode(command)) == command


def test_message_example_literal_is_refused() -> None:
    with pytest.raises(MalformedHeader) as info:
        decode(MESSAGE_EXAMPLE_LITERAL)
    assert info.value.code is FaultCode.INVALID_MESSAGE_FORMAT
    # c='display text', (17 bytes) g=[friends,'country men'], (26 bytes)
    assert info.value.offset == 43 == MESSAGE_EXAMPLE_LITERAL.index(b"+")
    assert "UTF-8 marker" in info.value.message


@pytest.mark.parametrize(
    ("frame", "offset"),
    [
        (HEADER_EXAMPLE.replace(b",d=", b",\n    d="), 45),
        (MESSAGE_EXAMPLE_LITERAL.replace(b",+d=", b",\n    +d="), 43),
    ],
    ids=["header-example", "message-example"],
)
def test_examples_with_the_rfc_line_wrap_are_refused(frame: bytes, offset: int) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frame)
    assert info.value.code is FaultCode.INVALID_MESSAGE_FORMAT
    assert info.value.offset == offset
    assert "whitespace U+000A" in info.value.message

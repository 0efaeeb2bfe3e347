"""gateway.transports.plain_frames: plain messages out, every other frame handed on whole.

Pure and table-driven: each case is a client byte stream, fed whole and then one
byte at a time, and the events the reader must return for it. Handed-on bytes
are joined, since how they are split depends on how the bytes arrived.
"""

from __future__ import annotations

import os
import struct

import pytest

from gateway.transports.plain_frames import BINARY, OTHER, TEXT, PlainFrameReader

CONT, CLOSE, PING = 0x0, 0x8, 0x9


def frame(
    opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, masked: bool = True
) -> bytes:
    size = len(payload)
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    bit = 0x80 if masked else 0
    if size < 126:
        head += bytes([bit | size])
    elif size < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", size)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def events(reader: PlainFrameReader, chunks: list[bytes]) -> list[tuple[int, bytes]]:
    """Every event for ``chunks``; consecutive OTHER bytes joined."""
    seen: list[tuple[int, bytes]] = []
    for chunk in chunks:
        reader.feed(chunk)
        while (event := reader.next_event()) is not None:
            if event[0] == OTHER and seen and seen[-1][0] == OTHER:
                seen[-1] = (OTHER, seen[-1][1] + event[1])
            else:
                seen.append(event)
    return seen


BIG = bytes(range(256)) * 300  # a 64-bit length
TEXT_FRAG = frame(TEXT, b"ab", fin=False)
CASES: list[tuple[str, bytes, list[tuple[int, bytes]]]] = [
    ("binary, 7-bit", frame(BINARY, b"hello"), [(BINARY, b"hello")]),
    ("text, 16-bit", frame(TEXT, b"t" * 300), [(TEXT, b"t" * 300)]),
    ("text, UTF-8", frame(TEXT, "κόσμε".encode()), [(TEXT, "κόσμε".encode())]),
    ("binary, 64-bit", frame(BINARY, BIG), [(BINARY, BIG)]),
    ("empty binary", frame(BINARY, b""), [(BINARY, b"")]),
    ("a ping", frame(PING, b"p"), [(OTHER, b"")]),  # filled in below
    ("text not UTF-8", frame(TEXT, b"\xff"), [(OTHER, b"")]),
    ("RSV1", frame(BINARY, b"x", rsv=4), [(OTHER, b"")]),
    ("unmasked", frame(BINARY, b"x", masked=False), [(OTHER, b"")]),
    ("over the limit", frame(BINARY, b"x" * 1001), [(OTHER, b"")]),
    ("a close", frame(CLOSE, b"\x03\xe8"), [(OTHER, b"")]),
]


@pytest.mark.parametrize("split", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize(("name", "data", "expected"), CASES, ids=[c[0] for c in CASES])
def test_one_frame(name: str, data: bytes, expected: list[tuple[int, bytes]], split: bool) -> None:
    if expected[0][0] == OTHER:
        expected = [(OTHER, data)]  # handed on byte for byte
    reader = PlainFrameReader(max_size=1000 if name == "over the limit" else None)
    chunks = [data[i : i + 1] for i in range(len(data))] if split else [data]
    assert events(reader, chunks) == expected
    assert reader.rest() == b""


@pytest.mark.parametrize("split", [False, True], ids=["whole", "byte-by-byte"])
def test_a_fragmented_message_is_handed_on_up_to_its_end_with_its_control_frames(
    split: bool,
) -> None:
    ping = frame(PING, b"mid")
    middle = frame(CONT, b"cd", fin=False)
    # Plain-looking while fragmented: still handed on (websockets fails it).
    inside = frame(BINARY, b"inside")
    last = frame(CONT, b"ef")
    after = frame(BINARY, b"after")
    data = TEXT_FRAG + ping + middle + inside + last + after
    reader = PlainFrameReader(max_size=None)
    chunks = [data[i : i + 1] for i in range(len(data))] if split else [data]
    handed_on = TEXT_FRAG + ping + middle + inside + last
    assert events(reader, chunks) == [(OTHER, handed_on), (BINARY, b"after")]


def test_rest_returns_what_was_not_read_and_empties_the_reader() -> None:
    reader = PlainFrameReader(max_size=None)
    close = frame(CLOSE, b"\x03\xe8")
    plain = frame(BINARY, b"later")
    reader.feed(close[:3])
    assert reader.next_event() == (OTHER, close[:3])  # a handed-on frame goes on as it arrives
    reader.feed(close[3:] + plain)
    assert reader.next_event() == (OTHER, close[3:])
    assert reader.rest() == plain
    assert reader.next_event() is None


def test_each_handed_on_frame_reports_its_header_once() -> None:
    """The header of a handed-on frame, after the event that starts it; None after
    every other event (its later bytes, plain messages)."""
    reader = PlainFrameReader(max_size=1000)
    first = frame(BINARY, b"a" * 300, fin=False)  # fragmented: handed on
    too_big = frame(CONT, b"b" * 70_000)  # a 64-bit length
    plain = frame(BINARY, b"plain")
    reader.feed(first[:2])
    assert reader.next_event() is None  # its 16-bit length has not arrived yet
    assert reader.handed_on_header is None
    reader.feed(first[2:4])
    assert reader.next_event() == (OTHER, first[:4])
    assert reader.handed_on_header == (BINARY, False, 300)
    reader.feed(first[4:] + too_big[:10])
    assert reader.next_event() == (OTHER, first[4:])
    assert reader.handed_on_header is None  # the rest of the same frame
    assert reader.next_event() == (OTHER, too_big[:10])
    assert reader.handed_on_header == (CONT, True, 70_000)
    reader.feed(too_big[10:] + plain)
    assert reader.next_event() == (OTHER, too_big[10:])
    assert reader.handed_on_header is None
    assert reader.next_event() == (BINARY, b"plain")
    assert reader.handed_on_header is None

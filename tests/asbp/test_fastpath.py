"""The fast path of ``decode`` agrees with the reference path.

``codec._decode_fast`` must return exactly the Command that
``codec._decode_reference`` returns for the same frame and limits (same keys
in the same order, same value types, same body), or None, "not sure". It
must never raise and never accept what the reference refuses. These
properties hold it to that on:

- arbitrary bytes, under the default limits and small random ones;
- frames built from the grammar: reserved and unknown keys (duplicates
  included), bare and quoted tokens, lists, the "+" marker, and reserved,
  control, whitespace and non-ASCII characters inserted or deleted
  anywhere, half of them starting from a header the fast path reads;
- short strings of a few keys and the structural characters, where its
  bookkeeping of markers, lists and empty tokens could slip (an exhaustive
  search over such strings found "k[]k=;" in an earlier version; this
  property finds it again within a few hundred examples);
- frames ``encode`` writes for Commands of the shapes the fast path claims
  to read, where it must not give up;
- explicit vectors, which also pin which shapes it reads by itself, so that
  a change quietly sending them all to the slow path fails too.

The number of examples follows the Hypothesis profile in use, scaled for
the properties where most random frames are refused and teach little.

test_speedups.py holds the C accelerator to the same contract with the
strategies and vector lists in :mod:`tests.support.fastpath` (and to reading everything READ holds),
and tests/asbp/conftest.py runs ``test_decode_is_the_reference`` with the
accelerator on and off, like the rest of the suite.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from asbp import DEFAULT_LIMITS, Command, Limits, ProtocolError, decode, encode
from asbp.codec import _decode_fast
from tests.support.fastpath import (
    BENCH,
    GIVE_UP,
    ID,
    MANY,
    READ,
    accepted,
    fast_commands,
    grammar_frames,
    limits,
    reference,
    structural_soup,
)

# -- helpers --------------------------------------------------------------------


def check(frame: bytes, limits: Limits) -> bool:
    """Assert the two paths agree on ``frame``; return whether the fast one read it."""
    fast = _decode_fast(frame, limits)
    if fast is None:
        return False
    assert type(fast) is Command
    assert accepted(fast) == reference(frame, limits)
    return True


def label(frame: bytes, limits: Limits, read: bool) -> None:
    if read:
        event("fast path read it")
    else:
        event(f"fast path gave up; reference {reference(frame, limits)[0]}")


# -- properties -----------------------------------------------------------------


@MANY
@given(st.binary(max_size=200), limits)
@example(b";", DEFAULT_LIMITS)
@example(b"c=x;", DEFAULT_LIMITS)
def test_agree_on_any_bytes(frame: bytes, limits: Limits) -> None:
    label(frame, limits, check(frame, limits))


@MANY
@given(grammar_frames(), limits)
def test_agree_on_grammar_shaped_frames(frame: bytes, limits: Limits) -> None:
    label(frame, limits, check(frame, limits))


@MANY
@given(structural_soup, limits)
@example(b"k[]k=;", DEFAULT_LIMITS)
def test_agree_on_structural_soup(frame: bytes, limits: Limits) -> None:
    label(frame, limits, check(frame, limits))


@given(fast_commands())
def test_reads_what_it_claims_to(command: Command) -> None:
    frame = encode(command)
    fast = _decode_fast(frame, DEFAULT_LIMITS)
    assert fast is not None, frame
    assert fast == command
    assert accepted(fast) == reference(frame, DEFAULT_LIMITS)


@given(grammar_frames(), limits)
def test_decode_is_the_reference(frame: bytes, limits: Limits) -> None:
    """Whichever path answers, ``decode`` answers as the reference does."""
    try:
        outcome = accepted(decode(frame, limits=limits))
    except ProtocolError as error:
        outcome = ("refused", error.code, error.offset, error.message)
    assert outcome == reference(frame, limits)


@pytest.mark.parametrize("frame", READ)
def test_reads(frame: bytes) -> None:
    assert check(frame, DEFAULT_LIMITS)


@pytest.mark.parametrize("frame", GIVE_UP)
def test_gives_up(frame: bytes) -> None:
    assert _decode_fast(frame, DEFAULT_LIMITS) is None
    # decode still answers, through the reference.
    assert reference(frame, DEFAULT_LIMITS)[0] in ("accepted", "refused")


def test_bench_frame_decodes_as_expected() -> None:
    command = _decode_fast(BENCH, DEFAULT_LIMITS)
    assert command is not None
    assert dict(command.header) == {
        "c": "chat.send",
        "g": ("friends", "country men"),
        "d": ID,
        "u": "42",
        "s": "0123456789abcdef0123456789abcdef",
        "i": "fedcba9876543210fedcba9876543210",
    }
    assert command.body == bytes(range(100))


@pytest.mark.parametrize(
    "frame", [bytearray(b"c=x;"), memoryview(b"c=x;")], ids=["bytearray", "memoryview"]
)
def test_bytes_like_frames_go_to_the_reference(frame: Any) -> None:
    assert _decode_fast(frame, DEFAULT_LIMITS) is None
    assert decode(frame) == Command(c="x")


@pytest.mark.parametrize(
    ("frame", "limits"),
    [
        (b"a=1,b=2;", Limits(max_keys=1)),
        (b"k=[a,b];", Limits(max_list_items=1)),
        (b"c=xy;", Limits(max_header_bytes=3)),
        (b"c=x;body", Limits(max_frame_bytes=7)),
    ],
    ids=["keys", "list-items", "header", "frame"],
)
def test_limits_send_to_the_reference(frame: bytes, limits: Limits) -> None:
    assert _decode_fast(frame, limits) is None
    assert _decode_fast(frame, DEFAULT_LIMITS) is not None
    with pytest.raises(ProtocolError):
        decode(frame, limits=limits)


def test_limits_at_the_edge_are_read() -> None:
    limits = Limits(max_frame_bytes=12, max_header_bytes=11, max_keys=2, max_list_items=2)
    assert check(b"k=[b,c],c=x;", limits)


def test_header_is_a_read_only_view() -> None:
    command = _decode_fast(b"c=x,g=[a,b];", DEFAULT_LIMITS)
    assert command is not None
    with pytest.raises(TypeError):
        command.header["c"] = "y"  # type: ignore[index]  # the point: it is read-only
    assert command == Command(c="x", g=["a", "b"])
    assert hash(command) == hash(Command(c="x", g=["a", "b"]))

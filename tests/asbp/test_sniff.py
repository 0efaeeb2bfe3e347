"""The ``u`` a fault carries for a frame the codec refused.

The property: for any bytes in which ``u=<digits>`` stands as a key in the
first KiB (after the UTF-8 marker or a ``,`` between pairs, ended by ``,`` or
``;``, with well-formed-looking pairs before it whose quoted tokens and lists
may hold anything, ``,u=1,`` included), either the codec accepts the frame and
its Command has that ``u``, or the codec refuses it and
``sniff_command_id`` finds that ``u`` for the fault.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

import asbp
from asbp.grammar import MAX_COMMAND_ID
from asbp.sniff import SNIFF_WINDOW, sniff_command_id

_RESERVED = frozenset(b";=,'[]+")
_BARE_BYTE = st.integers(0, 255).filter(lambda byte: byte not in _RESERVED)
_BARE = st.lists(_BARE_BYTE, min_size=1, max_size=8).map(bytes)
_QUOTED = st.binary(max_size=12).map(lambda raw: b"'" + raw.replace(b"'", b"") + b"'")
_TOKEN = st.one_of(_BARE, _QUOTED)
_LIST = st.lists(_TOKEN, max_size=4).map(lambda tokens: b"[" + b",".join(tokens) + b"]")
_KEY = _BARE.filter(lambda key: key != b"u")
_PAIR = st.builds(lambda key, value: key + b"=" + value, _KEY, st.one_of(_TOKEN, _LIST))


@st.composite
def frames_with_u(draw: st.DrawFn) -> tuple[bytes, int]:
    marker = draw(st.sampled_from((b"", b"+")))
    pairs = draw(st.lists(_PAIR, max_size=6))
    command_id = draw(st.integers(0, MAX_COMMAND_ID))
    ended_by = draw(st.sampled_from((b",", b";")))
    head = marker + b"".join(pair + b"," for pair in pairs) + b"u=%d" % command_id + ended_by
    assume(len(head) <= SNIFF_WINDOW)
    return head + draw(st.binary(max_size=64)), command_id


@given(frames_with_u())
@example((b"+u=5,c=x\xff;", 5))  # the case: "+u=" in a header that is not UTF-8
@example((b"u=8,c=x\xff;", 8))
@example((b"+c=x,u=15,\xff;", 15))
@example((b"a=',u=3,',u=5,\xff;", 5))  # a "u=" inside a quoted token is no key
@example((b"a=[x,u=3,y],u=6,\xff;", 6))  # nor one inside a list
def test_a_u_standing_as_a_key_reaches_the_fault(case: tuple[bytes, int]) -> None:
    frame, command_id = case
    try:
        command = asbp.decode(frame)
    except asbp.ProtocolError:
        assert sniff_command_id(frame) == command_id
    else:
        assert command.command_id == command_id


@pytest.mark.parametrize(
    "frame",
    [
        b"c=x;u=7,",  # in the body
        b"c=asbp.ping,u=10",  # no end: the header never ends, so no key does either
        b"u=05,c=x\xff;",  # a leading zero
        b"u=65536,c=x\xff;",  # past the largest u
        b"u=,c=x\xff;",  # no digits
        b"u=5x,c=x\xff;",  # not only digits
        b"a='open,u=5,",  # an unclosed quote swallows the rest
        b"a=[',u=1', x],u",  # a quoted token in a list, then a key with no value
        b"x" * (SNIFF_WINDOW - 4) + b",u=5;",  # ends past the first KiB
    ],
)
def test_what_is_no_u(frame: bytes) -> None:
    assert sniff_command_id(frame) is None


def test_a_quote_out_of_place_opens_no_token() -> None:
    assert sniff_command_id(b"a=b'c,u=5;") == 5

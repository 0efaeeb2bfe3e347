"""Strategies, vectors and the reference reading for the ``decode`` fast paths.

tests/asbp/test_fastpath.py holds ``codec._decode_fast`` to the reference path with
these, and tests/asbp/test_speedups.py holds the C accelerator to the same contract.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from asbp import DEFAULT_LIMITS, Command, Limits, ProtocolError, encode
from asbp.codec import _decode_reference
from asbp.header import RESERVED_KEYS

#: Most grammar-shaped frames are malformed; give those properties more room.
MANY = settings(max_examples=3 * settings().max_examples)


def reference(frame: bytes, limits: Limits) -> tuple[Any, ...]:
    """What the reference path does with ``frame``, in comparable form."""
    try:
        command = _decode_reference(frame, limits)
    except ProtocolError as error:
        return ("refused", error.code, error.offset, error.message)
    return ("accepted", list(command.header.items()), command.body)


def accepted(command: Command) -> tuple[Any, ...]:
    return ("accepted", list(command.header.items()), command.body)


# -- strategies -----------------------------------------------------------------

#: Printable ASCII but the reserved characters: what bare tokens hold here.
ASCII_BARE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ";=,'[]+")
#: Characters that stress the grammar, inserted at random places.
TROUBLE = ";=,'[]+ \t\r\n\x00\x1f\x7f\x85\xa0\xe9\u2028\U0001f600"

small_limits = st.builds(
    Limits,
    max_frame_bytes=st.integers(1, 400),
    max_header_bytes=st.integers(1, 300),
    max_keys=st.integers(1, 8),
    max_list_items=st.integers(1, 4),
)
limits = st.one_of(st.just(DEFAULT_LIMITS), st.just(DEFAULT_LIMITS), small_limits)

uuid_hex = st.binary(min_size=16, max_size=16).map(bytes.hex)
identifiers = st.one_of(
    uuid_hex,
    uuid_hex.map(str.upper),
    st.sampled_from(["0" * 31, "0" * 33, "g" * 32, "de305d54-75b4-431b-adb2-eb6b9e546014"]),
)
command_ids = st.one_of(
    st.integers(0, 70000).map(str),
    st.sampled_from(["00", "01", "065535", "99999", "123456", "+1", "-1", "1_0", "٣"]),
)
keys = st.one_of(
    st.sampled_from(sorted(RESERVED_KEYS)),
    st.sampled_from(["k", "key", "x1", "ext.v2", "c2"]),
    st.text(ASCII_BARE, max_size=3),
)
words = st.one_of(
    st.text(ASCII_BARE, min_size=1, max_size=6),
    st.text(ASCII_BARE, max_size=6),
    st.sampled_from(["chat.send", "friends", "country men", "display text", "bob*example.org"]),
    identifiers,
    command_ids,
)
quoted_texts = st.text(
    st.one_of(st.sampled_from(ASCII_BARE + " ,=[]+;\t\x00"), st.sampled_from(TROUBLE)),
    max_size=8,
).map(lambda text: f"'{text.replace(chr(39), '')}'")


def tokens_of(word: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(word, word.map(lambda text: f"'{text}'"))


def values_of(token: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    listed = st.lists(token, max_size=4).map(lambda items: f"[{','.join(items)}]")
    return st.one_of(token, listed)


values = values_of(st.one_of(tokens_of(words), quoted_texts))
#: Values that suit the key, so that more frames are valid.
SUITED = {
    "d": values_of(tokens_of(uuid_hex)),
    "i": tokens_of(uuid_hex),
    "s": tokens_of(uuid_hex),
    "u": tokens_of(st.integers(0, 65535).map(str)),
}


@st.composite
def pairs(draw: st.DrawFn) -> str:
    key = draw(keys)
    if key in SUITED and draw(st.booleans()):
        return f"{key}={draw(SUITED[key])}"
    return f"{key}={draw(values)}"


#: Values for the reserved keys the fast path checks itself. No ";": quoted,
#: it would come before the header's own, which the fast path leaves alone.
FAST_TEXT = st.text(st.sampled_from(ASCII_BARE + " ,=[]+\t\x00\x7f"), min_size=1, max_size=8)
FAST_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "a": FAST_TEXT,
    "b": FAST_TEXT,
    "c": FAST_TEXT,
    "d": st.one_of(uuid_hex, st.lists(uuid_hex, min_size=1, max_size=3).map(tuple)),
    "g": st.one_of(FAST_TEXT, st.lists(FAST_TEXT, min_size=1, max_size=3).map(tuple)),
    "i": uuid_hex,
    "s": uuid_hex,
    "u": st.integers(0, 65535),
    "x": FAST_TEXT,
}


@st.composite
def fast_commands(draw: st.DrawFn) -> Command:
    """Commands of the shapes the fast path claims to read by itself."""
    reserved = draw(st.lists(st.sampled_from(sorted(FAST_VALUES)), unique=True, max_size=6))
    header: dict[str, Any] = {key: draw(FAST_VALUES[key]) for key in reserved}
    # Reserved keys are single letters, so longer keys are unknown ones.
    unknown = st.one_of(st.sampled_from("kny0_"), st.text(ASCII_BARE, min_size=2, max_size=4))
    for _ in range(draw(st.integers(0 if header else 1, 4))):
        header.setdefault(draw(unknown), draw(FAST_VALUES["g"]))
    order = draw(st.permutations(list(header)))
    return Command({key: header[key] for key in order}, draw(st.binary(max_size=16)))


@st.composite
def grammar_frames(draw: st.DrawFn) -> bytes:
    """Headers shaped like the grammar, often broken in small ways.

    Half start from a valid header the fast path reads, so that the small
    breakages land next to everything it must get right.
    """
    if draw(st.booleans()):
        header = encode(draw(fast_commands())).partition(b";")[0].decode()
    else:
        header = ",".join(draw(st.lists(pairs(), max_size=8)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        at = draw(st.integers(0, len(header)))
        if header and draw(st.booleans()):
            header = header[:at] + header[at + 1 :]
        else:
            header = header[:at] + draw(st.sampled_from(TROUBLE)) + header[at:]
    marker = draw(st.sampled_from(["", "", "", "+"]))
    body = draw(st.binary(max_size=6))
    return (marker + header).encode("utf-8", "surrogatepass") + b";" + body


#: Short headers over a few keys and the structural characters: where the
#: fast path's bookkeeping of quotes, lists and empty tokens could slip.
structural_soup = st.text("kcgd=,[]' ", max_size=14).map(lambda text: f"{text};".encode())


# -- vectors --------------------------------------------------------------------

ID = "de305d5475b4431badb2eb6b9e546014"
BENCH = (
    b"c=chat.send,g=[friends,'country men'],d=de305d5475b4431badb2eb6b9e546014,u=42,"
    b"s=0123456789abcdef0123456789abcdef,i=fedcba9876543210fedcba9876543210;" + bytes(range(100))
)

#: Frames the fast path must read by itself (the reference accepts them all).
READ = [
    BENCH,
    f"c='display text',g=['friends','country men'],d={ID};".encode(),
    f"c=x,d=[{ID},{ID}];".encode(),
    b"c=ping;",
    b"c=ping;body;with'quotes'",
    b"k=[a],g=[b,'c d'],x='=,[]+ ';",
    b"u=0;",
    b"u=65535;",
    b"k='\t\x00',k2=['a b'];",
    b"ext=[a,b,c],k=v;",
]

#: Frames it must leave to the reference, accepted or not by it.
GIVE_UP = [
    b"",  # no terminator
    b";",  # empty header
    b"+c=x;",  # the UTF-8 marker
    b"c=x+y;",  # "+" out of place
    b"c=a b;",  # whitespace outside quotes
    b"c='a;b';",  # ";" inside quotes
    b"c='';",  # empty quoted token
    b"k='';",  # ... even where it is valid
    b"k=[];",  # empty list, valid for unknown keys
    b"c=[x];",  # a list for a single-value key
    b"c=x,c=y;",  # duplicate
    b"e=UTF-8;",  # a rare reserved key
    b"t=1,c=x;",
    b"c='x'y;",  # quoted token glued to a bare one
    b"c=y'x';",
    b"k=v,'k'=w;",  # quoted key
    b"c=\xc3\xa9;",  # non-ASCII without the marker
    b"c='\xc3\xa9';",
    b"c='a\rb';",  # CR inside quotes
    b"u=65536;",
    b"u=01;",
    b"i=DE305D5475B4431BADB2EB6B9E546014;",
    b"d=[de305d5475b4431badb2eb6b9e546014,x];",
    b"k=,x=[a];",  # an empty value before a list
    b"k=[a],x=;",
    b"k=[a]b;",
    b"k=a[b];",
    b"k=[a,[b]];",
    b"k=v,[a]=x;",
    b"k[]k=;",  # empty tokens that are not a list's ends
    b"k[]c=;",
    b"x=a[b]c,k=[d];",
    b"k=[a=b];",
    b"k=v,;",
    b",k=v;",
    b"k==v;",
]

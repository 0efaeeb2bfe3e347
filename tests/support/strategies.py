"""Hypothesis strategies for ASBP Commands and frames, valid and broken.

tests/asbp/test_properties.py uses them for round trips and the decoder's properties;
other tests (e.g. tests/gateway/routing/test_splice.py) draw Commands from them too.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from hypothesis import strategies as st

from asbp import (
    RESERVED_KEYS,
    Command,
    HeaderValue,
)
from asbp.grammar import RESERVED

# -- strategies -----------------------------------------------------------------

#: Characters that stress the grammar, mixed into every text strategy.
SPECIAL = ";=,[]+*'\"\\ \t\x0b\x0c\x00\x1f\x7f\x80\x85\x9f\xa0\xe9\u2028\u3000\ufeff\U0001f600"


#: str.isspace() is true exactly for these categories' characters (and some
#: Cc); test_whitespace_categories checks it over every code point.
NOT_BARE_CATEGORIES = ("Cs", "Cc", "Zs", "Zl", "Zp")


def _is_bare_char(char: str) -> bool:
    return char not in RESERVED and unicodedata.category(char) not in NOT_BARE_CATEGORIES


def _chars(exclude: str, *, bare: bool) -> st.SearchStrategy[str]:
    categories = NOT_BARE_CATEGORIES if bare else ("Cs",)
    base = st.characters(exclude_categories=categories, exclude_characters=exclude)
    special = [c for c in SPECIAL if c not in exclude and (_is_bare_char(c) or not bare)]
    return st.one_of(base, st.sampled_from(special))


BARE_CHARS = _chars("".join(RESERVED), bare=True)
VALUE_CHARS = _chars("'\r\n", bare=False)
ADDRESS_CHARS = _chars("*'\r\n" + "".join(RESERVED), bare=True)

bare_texts = st.text(BARE_CHARS, min_size=1, max_size=8)
texts = st.text(VALUE_CHARS, max_size=10)
nonempty_texts = st.text(VALUE_CHARS, min_size=1, max_size=10)
unknown_keys = bare_texts.filter(lambda key: key not in RESERVED_KEYS)
values: st.SearchStrategy[HeaderValue] = st.one_of(texts, st.lists(texts, max_size=4).map(tuple))


def _one_or_more(item: st.SearchStrategy[str]) -> st.SearchStrategy[HeaderValue]:
    return st.one_of(item, st.lists(item, min_size=1, max_size=3).map(tuple))


ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
uuid_hex = st.binary(min_size=16, max_size=16).map(bytes.hex)
mime_name = st.builds(
    str.__add__, st.sampled_from(ALNUM), st.text(ALNUM + "!#$&^_.+-", max_size=10)
)
address = st.builds(
    lambda local, domain: f"{local}*{domain}",
    st.text(ADDRESS_CHARS, min_size=1, max_size=6),
    st.text(ADDRESS_CHARS, min_size=1, max_size=6),
)
mime_params = st.builds(
    lambda space, params: f"{space};{params}", st.sampled_from(["", " ", "\t "]), texts
)

RESERVED_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "a": nonempty_texts,
    "b": nonempty_texts,
    "c": nonempty_texts,
    "d": _one_or_more(uuid_hex),
    "e": st.text(ALNUM + "!#$%&+-^_`{}~.:", min_size=1, max_size=64),
    "f": st.lists(st.integers(0, 10**9), min_size=2, max_size=6).map(
        lambda arcs: ".".join(map(str, arcs))
    ),
    "g": _one_or_more(nonempty_texts),
    "i": uuid_hex,
    "o": st.one_of(st.integers(1, 10**40), st.integers(1, 10**40).map(str)),
    "m": st.builds(
        lambda kind, sub, params: f"{kind}/{sub}{params}",
        mime_name,
        mime_name,
        st.one_of(st.just(""), mime_params),
    ),
    "r": _one_or_more(address),
    "p": address,
    "s": uuid_hex,
    "t": st.one_of(st.integers(0, 10**40), st.integers(0, 10**40).map(str)),
    "u": st.one_of(st.integers(0, 65535), st.integers(0, 65535).map(str)),
    "x": nonempty_texts,
    "z": st.builds(str.__add__, st.sampled_from(["", "application/", "text/"]), mime_name),
}


@st.composite
def commands(draw: st.DrawFn) -> Command:
    """Any Command the API can build, within the default limits."""
    reserved = draw(st.lists(st.sampled_from(sorted(RESERVED_VALUES)), unique=True, max_size=5))
    header: dict[str, Any] = {key: draw(RESERVED_VALUES[key]) for key in reserved}
    for _ in range(draw(st.integers(0 if header else 1, 5))):
        header.setdefault(draw(unknown_keys), draw(values))
    keys = draw(st.permutations(list(header)))
    return Command({key: header[key] for key in keys}, draw(st.binary(max_size=32)))


#: Pieces of frames, valid and broken, for grammar-shaped byte strings.
PIECES = [
    *[c.encode() for c in ";=,'[]+"],
    b"k",
    b"k2",
    b"\xc3\xa9",
    b"c",
    b"u",
    b"g",
    b"1",
    b"0",
    b"65536",
    b"x y",
    b"''",
    b"a*b",
    b"de305d5475b4431badb2eb6b9e546014",
    b" ",
    b"\t",
    b"\r",
    b"\n",
    b"\x00",
    b"\x7f",
    b"\xc2\x85",
    b"\xc2\xa0",
    b"\xe2\x80\xa8",
    b"\xff",
    b"\xc3",
    b"\xed\xa0\x80",
]
grammar_frames = st.lists(st.sampled_from(PIECES), max_size=24).map(b"".join)
any_frames = st.one_of(st.binary(max_size=64), grammar_frames)

"""The C accelerator, ``asbp._speedups``, agrees with the reference decoder.

``decode_fast`` (asbp/_speedups.c) must return exactly the header and body
that ``codec._decode_reference`` reads from the same frame under the same
limits (same keys in the same order, ``str`` values or tuples of ``str``),
or None, "not sure". It must never raise because of what a frame holds and
never accept what the reference refuses. These tests hold it to that:

- Hypothesis properties on arbitrary bytes, on the grammar-shaped frames of
  test_fastpath.py and test_properties.py, on structural soup, and on the
  frames ``encode`` writes for any Command, where it must also read every
  frame of the shapes it claims (and everything the pure-Python fast path
  reads);
- explicit vectors for every reserved key's rule, for each limit at and just
  past its boundary, and every vector of test_fastpath.py;
- argument handling (wrong types raise TypeError; a frame that is not
  exactly bytes gives None), and limits of any size;
- reference counts and traced memory that stay flat over 100,000 decodes
  through every way out of the function (read, given up after objects were
  made, given up at once);
- the wiring in ``codec.decode``, and its fallback when the extension is
  missing.

The extension is imported unconditionally: where it was not built, this
module fails to import and the run fails. CI installs with a compiler, so a
silent fallback to pure Python would only hide a broken build.

Memory safety, by hand: compile asbp/_speedups.c with
``-fsanitize=address,undefined`` into a directory of its own, put it in
``sys.modules["asbp._speedups"]`` before asbp is imported, and run this
module under ``LD_PRELOAD`` of libasan and libubsan with
``ASAN_OPTIONS=detect_leaks=0`` and ``PYTHONMALLOC=malloc`` (so that every
bytes object is an allocation of its own, with red zones around it).
``PYTHONMALLOC=debug`` alone catches writes past Python's own allocations.
"""

from __future__ import annotations

import importlib.util
import sys
import tracemalloc
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from asbp import (
    DEFAULT_LIMITS,
    RESERVED_KEYS,
    Command,
    FaultCode,
    Limits,
    ProtocolError,
    codec,
    decode,
    encode,
)
from asbp import _speedups as speedups
from asbp._speedups import decode_fast
from asbp.codec import _decode_fast
from tests.support.fastpath import (
    BENCH,
    GIVE_UP,
    ID,
    MANY,
    READ,
    fast_commands,
    grammar_frames,
    limits,
    reference,
    structural_soup,
)
from tests.support.strategies import any_frames, commands

#: These tests call the accelerator directly, or set ``codec.speedups_enabled``
#: themselves: one pass of the suite is enough (see conftest.py).
DECODER_PASSES = ("speedups",)

# -- helpers --------------------------------------------------------------------


def limit_args(limits: Limits) -> tuple[int, int, int, int]:
    return (
        limits.max_frame_bytes,
        limits.max_header_bytes,
        limits.max_keys,
        limits.max_list_items,
    )


def c_decode(frame: Any, limits: Limits = DEFAULT_LIMITS) -> Any:
    return decode_fast(frame, *limit_args(limits))


def check(frame: bytes, limits: Limits = DEFAULT_LIMITS) -> bool:
    """Assert the C path agrees with the reference; return whether it read ``frame``."""
    found = c_decode(frame, limits)
    if found is None:
        return False
    assert type(found) is tuple
    header, body = found
    assert type(header) is dict
    assert type(body) is bytes
    for key, value in header.items():
        assert type(key) is str
        assert type(value) is str or (
            type(value) is tuple and all(type(item) is str for item in value)
        )
    assert ("accepted", list(header.items()), body) == reference(frame, limits)
    return True


#: Reserved keys the C path leaves to Python (rare, with costlier rules).
RARE_KEYS = frozenset("efmotz")


def c_should_read(command: Command) -> bool:
    """Whether ``encode(command)`` is of the shapes the C path reads by itself."""
    texts: list[str] = list(command.header)
    for value in command.header.values():
        if isinstance(value, str):
            texts.append(value)
        elif value:
            texts.extend(value)
        else:
            return False  # the empty list
    return (
        RARE_KEYS.isdisjoint(command.header)
        and all(texts)  # no empty quoted token
        and all(text.isascii() for text in texts)
    )


# -- the extension is there and wired in -----------------------------------------


def test_extension_is_built_and_wired_in() -> None:
    assert codec._decode_c is decode_fast
    assert decode_fast.__module__ == "asbp._speedups"


def test_extension_is_not_stale() -> None:
    """Edits to _speedups.c take effect only once rebuilt: pip install -e ."""
    built = Path(speedups.__file__)
    source = built.with_name("_speedups.c")
    assert source.stat().st_mtime <= built.stat().st_mtime, "rebuild: pip install -e ."


def test_decode_tries_the_accelerator_first(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(frame: bytes, limits: Limits) -> None:
        raise AssertionError("the fast path ran")

    monkeypatch.setattr(codec, "_decode_fast", refuse)
    monkeypatch.setattr(codec, "speedups_enabled", True)
    command = decode(BENCH)
    assert type(command) is Command
    assert ("accepted", list(command.header.items()), command.body) == reference(
        BENCH, DEFAULT_LIMITS
    )
    # What the C path gives up on still goes to the Python paths.
    monkeypatch.undo()
    monkeypatch.setattr(codec, "speedups_enabled", True)
    assert decode(b"+c=x;") == Command(c="x")


def test_speedups_enabled_false_skips_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError("the accelerator ran")

    monkeypatch.setattr(codec, "_decode_c", refuse)
    monkeypatch.setattr(codec, "speedups_enabled", False)
    assert decode(b"c=x;") == Command(c="x")


def test_codec_works_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without a compiler: asbp.codec imports and decodes in pure Python."""
    monkeypatch.setitem(sys.modules, "asbp._speedups", None)  # import raises ImportError
    spec = importlib.util.spec_from_file_location("asbp._codec_without_speedups", codec.__file__)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._decode_c is None
    assert module.speedups_enabled is False
    assert module.decode(BENCH) == codec._decode_reference(BENCH, DEFAULT_LIMITS)
    with pytest.raises(ProtocolError):
        module.decode(b"c=x")


# -- properties -----------------------------------------------------------------


@MANY
@given(st.binary(max_size=200), limits)
@example(b";", DEFAULT_LIMITS)
@example(b"c=x;", DEFAULT_LIMITS)
@example(b"c='a;b';", DEFAULT_LIMITS)
def test_agrees_on_any_bytes(frame: bytes, limits: Limits) -> None:
    check(frame, limits)


@MANY
@given(grammar_frames(), limits)
def test_agrees_on_grammar_shaped_frames(frame: bytes, limits: Limits) -> None:
    check(frame, limits)


@MANY
@given(any_frames, limits)
def test_agrees_on_frame_pieces(frame: bytes, limits: Limits) -> None:
    check(frame, limits)


@MANY
@given(structural_soup, limits)
@example(b"k[]k=;", DEFAULT_LIMITS)
def test_agrees_on_structural_soup(frame: bytes, limits: Limits) -> None:
    check(frame, limits)


@given(commands())
def test_reads_encoded_commands(command: Command) -> None:
    frame = encode(command)
    read = check(frame)
    if c_should_read(command):
        assert read, frame
        header, body = c_decode(frame)
        assert list(header.items()) == list(command.header.items())
        assert body == command.body


@given(fast_commands())
def test_reads_what_it_claims_to(command: Command) -> None:
    frame = encode(command)
    assert check(frame), frame


@given(st.one_of(grammar_frames(), structural_soup, any_frames), limits)
def test_reads_whatever_the_fast_path_reads(frame: bytes, limits: Limits) -> None:
    """The C path never sends back to Python what the Python fast path reads."""
    fast = _decode_fast(frame, limits)
    if fast is not None:
        assert check(frame, limits), frame


any_limit = st.one_of(
    st.integers(-3, 300), st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**63, 2**64])
)


@given(
    st.one_of(grammar_frames(), st.binary(max_size=64)), st.lists(any_limit, min_size=4, max_size=4)
)
def test_limits_of_any_size(frame: bytes, values: list[int]) -> None:
    """Any int is a limit: too large reads as no limit, below 1 refuses all."""
    found = decode_fast(frame, *values)
    if min(values[:3]) < 1:
        # Every frame holds a key and a header of three bytes at least.
        assert found is None
    elif min(values) >= 1:
        # Limits past any frame's size all read alike.
        clamped = Limits(*(min(value, 2**40) for value in values))
        assert found == c_decode(frame, clamped)
        check(frame, clamped)


# -- arguments ------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        bytearray(b"c=x;"),
        memoryview(b"c=x;"),
        "c=x;",
        None,
        42,
        type("Frame", (bytes,), {})(b"c=x;"),
    ],
    ids=["bytearray", "memoryview", "str", "None", "int", "bytes-subclass"],
)
def test_frames_not_exactly_bytes_are_left_to_python(frame: Any) -> None:
    assert c_decode(frame) is None


@pytest.mark.parametrize(
    "args",
    [
        (),
        (b"c=x;",),
        (b"c=x;", 1, 2, 3),
        (b"c=x;", 1, 2, 3, 4, 5),
        (b"c=x;", 1.0, 2, 3, 4),
        (b"c=x;", 1, "2", 3, 4),
        (b"c=x;", 1, 2, None, 4),
        (b"c=x;", 1, 2, 3, DEFAULT_LIMITS),
    ],
)
def test_wrong_arguments_raise_type_error(args: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError):
        decode_fast(*args)


def test_keyword_arguments_raise_type_error() -> None:
    with pytest.raises(TypeError):
        decode_fast(b"c=x;", 1, 2, 3, max_list_items=4)  # type: ignore[call-arg]  # the point


# -- vectors --------------------------------------------------------------------

ID2 = "0123456789abcdef0123456789abcdef"

#: (frame, the header the C path must return; the reference agrees).
C_READS: list[tuple[bytes, dict[str, Any]]] = [
    *[(f"{k}=v;".encode(), {k: "v"}) for k in "abcx"],
    *[(f"{k}='v w';".encode(), {k: "v w"}) for k in "abcx"],
    (b"g=v;", {"g": "v"}),
    (b"g=[v];", {"g": ("v",)}),
    (b"g=[v,'w x'];", {"g": ("v", "w x")}),
    (f"d={ID};".encode(), {"d": ID}),
    (f"d='{ID}';".encode(), {"d": ID}),
    (f"d=[{ID}];".encode(), {"d": (ID,)}),
    (f"d=[{ID},'{ID2}'];".encode(), {"d": (ID, ID2)}),
    *[(f"{k}={ID};".encode(), {k: ID}) for k in "is"],
    *[(f"{k}='{ID}';".encode(), {k: ID}) for k in "is"],
    *[(f"u={n};".encode(), {"u": n}) for n in ["0", "7", "10", "42", "9999", "10000", "65535"]],
    (b"u='42';", {"u": "42"}),
    # p r: Conversation-Addresses (every crossing of a Course carries both).
    (b"p=bob*example.org;", {"p": "bob*example.org"}),
    (b"p='bob;1*example.org';", {"p": "bob;1*example.org"}),
    (b"p=!#$%&()-./:<>?@\\^_`{|}~*b;", {"p": "!#$%&()-./:<>?@\\^_`{|}~*b"}),
    (b"r=bob*example.org;", {"r": "bob*example.org"}),
    (b"r=[bob*example.org];", {"r": ("bob*example.org",)}),
    (b"r=[a*b.test,'c,d*e.test'];", {"r": ("a*b.test", "c,d*e.test")}),
    (
        b"c=chat,r=bob*b.test,p=alice*a.test,u=1,course.id="
        + ID.encode()
        + b",course.via=[a.test];hi",
        {
            "c": "chat",
            "r": "bob*b.test",
            "p": "alice*a.test",
            "u": "1",
            "course.id": ID,
            "course.via": ("a.test",),
        },
    ),
    # Unknown keys, single letters the draft does not reserve included.
    (b"k=v;", {"k": "v"}),
    (b"h=v;", {"h": "v"}),
    (b"K=v;", {"K": "v"}),
    (b"kk=[a,b];", {"kk": ("a", "b")}),
    (b"k.v2=['a b',c];", {"k.v2": ("a b", "c")}),
    (b"k='a;b';body", {"k": "a;b"}),
    (b"k=' ',n='\t\x00\x7f';", {"k": " ", "n": "\t\x00\x7f"}),
    (b"k='=,[]+',n=[';','['];", {"k": "=,[]+", "n": (";", "[")}),
    (b"k=!#$%&()*-./:<>?@\\^_`{|}~;", {"k": "!#$%&()*-./:<>?@\\^_`{|}~"}),
    (b"c=x,k=" + b"a" * 1000 + b";", {"c": "x", "k": "a" * 1000}),
    (b"k=[" + b",".join([b"a"] * 200) + b"];", {"k": ("a",) * 200}),
    (
        b",".join(f"k{n}=v".encode() for n in range(64)) + b";",
        {f"k{n}": "v" for n in range(64)},
    ),
]

#: (frame, what the reference says once the C path gave up: the fault code,
#: or None for accepted).
C_GIVES_UP: list[tuple[bytes, FaultCode | None]] = [
    # a b c x: one non-empty value.
    *[(f"{k}=[v];".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "abcx"],
    *[(f"{k}='';".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "abcx"],
    *[(f"{k}=[];".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "abcx"],
    # g: one or more non-empty values.
    (b"g=[];", FaultCode.INVALID_HEADER_VALUE),
    (b"g='';", FaultCode.INVALID_HEADER_VALUE),
    (b"g=[''];", FaultCode.INVALID_HEADER_VALUE),
    (b"g=[v,''];", FaultCode.INVALID_HEADER_VALUE),
    # d: one or more identifiers of 32 lowercase hex digits.
    (b"d=[];", FaultCode.INVALID_HEADER_VALUE),
    (b"d='';", FaultCode.INVALID_HEADER_VALUE),
    (f"d={ID.upper()};".encode(), FaultCode.INVALID_HEADER_VALUE),
    (f"d={ID[:31]};".encode(), FaultCode.INVALID_HEADER_VALUE),
    (f"d={ID}0;".encode(), FaultCode.INVALID_HEADER_VALUE),
    (f"d={'g' * 32};".encode(), FaultCode.INVALID_HEADER_VALUE),
    (b"d=de305d54-75b4-431b-adb2-eb6b9e546014;", FaultCode.INVALID_HEADER_VALUE),
    (f"d=[{ID},x];".encode(), FaultCode.INVALID_HEADER_VALUE),
    (f"d=[x,{ID}];".encode(), FaultCode.INVALID_HEADER_VALUE),
    # i s: one such identifier.
    *[(f"{k}=[{ID}];".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "is"],
    *[(f"{k}={ID.upper()};".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "is"],
    *[(f"{k}={ID[:31]};".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "is"],
    *[(f"{k}='{ID} ';".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "is"],
    *[(f"{k}='';".encode(), FaultCode.INVALID_HEADER_VALUE) for k in "is"],
    # u: 0..65535, no leading zeros.
    *[
        (f"u={n};".encode(), FaultCode.INVALID_HEADER_VALUE)
        for n in ["00", "01", "065535", "65536", "99999", "100000", "123456", "-1", "1_0", "x"]
    ],
    (b"u=[1];", FaultCode.INVALID_HEADER_VALUE),
    (b"u='';", FaultCode.INVALID_HEADER_VALUE),
    (b"u=' 1';", FaultCode.INVALID_HEADER_VALUE),
    (b"u=+1;", FaultCode.INVALID_MESSAGE_FORMAT),
    ("u=٣;".encode(), FaultCode.INVALID_MESSAGE_FORMAT),
    # The rare reserved keys, valid or not: always the reference's.
    (b"e=UTF-8;", None),
    (b"f=1.3.6.1;", None),
    (b"m='text/plain; charset=utf-8';", None),
    (b"o=1;", None),
    # p: one Conversation-Address; r: one or more.
    (b"p=[bob*example.org];", FaultCode.INVALID_HEADER_VALUE),
    *[
        (f"{k}={v};".encode(), FaultCode.INVALID_HEADER_VALUE)
        for k in "pr"
        for v in ["bob", "*b", "b*", "*", "a**b", "a*b*c", "'a *b'", "'a*b '", "'a\t*b'", "''"]
    ],
    (b"r=[];", FaultCode.INVALID_HEADER_VALUE),
    (b"r=[a*b,c];", FaultCode.INVALID_HEADER_VALUE),
    (b"r=[c,a*b];", FaultCode.INVALID_HEADER_VALUE),
    (b"r=['a\x7f*b'];", FaultCode.INVALID_HEADER_VALUE),
    # Valid, but not ASCII: the reference's.
    ("p=b\u00f6b*example.org;".encode(), FaultCode.INVALID_MESSAGE_FORMAT),
    ("+p=b\u00f6b*example.org;".encode(), None),
    (b"t=0;", None),
    (b"z=x-gzip;", None),
    (b"t=x;", FaultCode.INVALID_HEADER_VALUE),
    (b"o=0;", FaultCode.INVALID_HEADER_VALUE),
    # Valid for unknown keys, but left to Python all the same.
    (b"k=[];", None),
    (b"k='';", None),
    (b"k=[''];", None),
    (b"k=[a,''];", None),
    (b"+c=x;", None),
    ("+k=\u00e9;".encode(), None),
    # The grammar.
    (b"", FaultCode.INVALID_MESSAGE_FORMAT),
    (b";", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"c=x", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"c=x,", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"c='x;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"c=x,c=y;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"c=x,g=[a,b],c=y;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"'k'=v;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=v,;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b",k=v;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k==v;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"=v;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=a b;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=a\x7f;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=a+b;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k='x'y;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=y'x';", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=[a]b;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=[a,[b]];", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=[a,,b];", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=[a,];", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=[a;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=[a", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=['a'b];", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k='a\rb';", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k='a\nb';", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k=\xc3\xa9;", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k='\xc3\xa9';", FaultCode.INVALID_MESSAGE_FORMAT),
    (b"k='\xff';", FaultCode.INVALID_MESSAGE_FORMAT),
]


@pytest.mark.parametrize(("frame", "header"), C_READS)
def test_reads(frame: bytes, header: dict[str, Any]) -> None:
    assert check(frame)
    found, _ = c_decode(frame)
    assert list(found.items()) == list(header.items())


@pytest.mark.parametrize(("frame", "code"), C_GIVES_UP)
def test_gives_up(frame: bytes, code: FaultCode | None) -> None:
    assert c_decode(frame) is None
    outcome = reference(frame, DEFAULT_LIMITS)
    if code is None:
        assert outcome[0] == "accepted"
    else:
        assert outcome[:2] == ("refused", code)


def test_every_reserved_key_is_covered() -> None:
    """Adding a reserved key to header.py must come with C vectors for it."""
    keys = {frame.partition(b"=")[0].decode() for frame, _ in C_READS + C_GIVES_UP}
    assert set(RESERVED_KEYS) <= keys


@pytest.mark.parametrize("frame", READ + GIVE_UP)
def test_fastpath_vectors(frame: bytes) -> None:
    read = check(frame)
    if frame in READ:
        assert read  # what the Python fast path reads, the C path reads too


def test_bench_frame() -> None:
    header, body = c_decode(BENCH)
    assert header == {
        "c": "chat.send",
        "g": ("friends", "country men"),
        "d": ID,
        "u": "42",
        "s": "0123456789abcdef0123456789abcdef",
        "i": "fedcba9876543210fedcba9876543210",
    }
    assert body == bytes(range(100))


#: (frame, limits the C path reads it under, the same with one limit one less,
#: the fault the reference raises then).
AT_THE_LIMIT = [
    (
        b"c=x;body",
        Limits(max_frame_bytes=8),
        Limits(max_frame_bytes=7),
        FaultCode.INVALID_MESSAGE_SIZE,
    ),
    (b"c=xy;", Limits(max_header_bytes=4), Limits(max_header_bytes=3), FaultCode.HEADER_TOO_LARGE),
    (
        b"c='a;b';",
        Limits(max_header_bytes=7),
        Limits(max_header_bytes=6),
        FaultCode.HEADER_TOO_LARGE,
    ),
    (
        b"c='a;b';",
        Limits(max_header_bytes=7),
        Limits(max_header_bytes=3),
        FaultCode.HEADER_TOO_LARGE,
    ),
    (b"k=1,n=2;", Limits(max_keys=2), Limits(max_keys=1), FaultCode.TOO_MANY_KEYS),
    (
        b"k=[a,b];",
        Limits(max_list_items=2),
        Limits(max_list_items=1),
        FaultCode.TOO_MANY_LIST_ITEMS,
    ),
    (
        b"g=[a],k=[a,b,c];",
        Limits(max_list_items=3),
        Limits(max_list_items=2),
        FaultCode.TOO_MANY_LIST_ITEMS,
    ),
]


@pytest.mark.parametrize(("frame", "at", "past", "code"), AT_THE_LIMIT)
def test_limits_at_and_past_the_boundary(
    frame: bytes, at: Limits, past: Limits, code: FaultCode
) -> None:
    assert check(frame, at)
    assert c_decode(frame, past) is None
    assert reference(frame, past)[:2] == ("refused", code)


def test_all_limits_at_once() -> None:
    frame = b"k=[b,c],c=x;"
    assert check(
        frame, Limits(max_frame_bytes=12, max_header_bytes=11, max_keys=2, max_list_items=2)
    )


# -- memory ---------------------------------------------------------------------

#: One frame for every way out of decode_fast.
LEAK_FRAMES = [
    BENCH,  # read: a dict, a tuple, str and bytes objects
    b"c=x;",  # read, with an empty body
    b"c=x,g=[a,b],c=y;",  # a duplicate key, after a tuple was made
    b"g=[a,b],k=v,u=99999;",  # a refused value after objects were made
    b"k=[a,b]x;",  # junk after a list
    b"k=[a,b],n=[c,d,e];",  # too many list items in the second list (below)
    b"+c=x;",  # given up at once
    bytearray(b"c=x;"),  # not bytes
]
LEAK_LIMITS = limit_args(Limits(max_list_items=2))


def run(count: int) -> None:
    for _ in range(count):
        for frame in LEAK_FRAMES:
            decode_fast(frame, *LEAK_LIMITS)


def watched_objects() -> Iterable[object]:
    """Objects a leaked reference would pile up on: shared singletons and the inputs."""
    found = decode_fast(b"c=x;", *LEAK_LIMITS)
    assert found is not None
    header, body = found
    # One-character str and empty bytes are singletons in CPython, so a
    # leaked key or body would show on these very objects.
    yield next(iter(header))
    yield body
    yield None
    yield from LEAK_FRAMES
    yield from LEAK_LIMITS


def test_reference_counts_stay_flat() -> None:
    run(100)
    objects = list(watched_objects())
    before = [sys.getrefcount(obj) for obj in objects]
    run(100_000 // len(LEAK_FRAMES))
    after = [sys.getrefcount(obj) for obj in objects]
    # Other code may take or drop a few references to None meanwhile; a leak
    # would add one per decode, 12,500 at least.
    assert [a - b for a, b in zip(after, before, strict=True)] == pytest.approx(
        [0] * len(objects), abs=64
    )


def test_traced_memory_stays_flat() -> None:
    run(100)
    tracemalloc.start()
    try:
        run(2_000)
        first, _ = tracemalloc.get_traced_memory()
        run(100_000 // len(LEAK_FRAMES))
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A leaked object per decode would be a megabyte or more.
    assert second - first < 64 * 1024

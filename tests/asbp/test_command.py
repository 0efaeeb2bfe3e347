"""Command: construction, immutability, value semantics, derived copies,
typed accessors, and the codec's entry points (encode's choices and limits,
decode's input types)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from asbp import (
    Command,
    FaultCode,
    FrameTooLarge,
    HeaderTooLarge,
    InvalidHeaderValue,
    Limits,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
    decode,
    encode,
)

UUID = "de305d5475b4431badb2eb6b9e546014"
UUID2 = "0123456789abcdef0123456789abcdef"


def horner(digits: str) -> int:
    """The value of a decimal string, without int(str) and its 4300-digit limit."""
    result = 0
    for digit in digits:
        result = result * 10 + "0123456789".index(digit)
    return result


# -- construction ---------------------------------------------------------------


def test_header_from_mapping_and_keywords() -> None:
    command = Command({"c": "ping", "k": ["a", "b"]}, b"body", u=7, t=0)
    assert dict(command.header) == {"c": "ping", "k": ("a", "b"), "u": "7", "t": "0"}
    assert list(command.header) == ["c", "k", "u", "t"]
    assert command.body == b"body"


def test_keywords_alone() -> None:
    command = Command(c="ping")
    assert dict(command.header) == {"c": "ping"}
    assert command.body == b""


def test_header_and_body_are_positional_only() -> None:
    # So "header" and "body" stay usable as header keys.
    command = Command(header="h", body="b")
    assert dict(command.header) == {"header": "h", "body": "b"}
    assert command.body == b""


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (0, "0"),
        (7, "7"),
        (-12, "-12"),
        (10**40, "1" + "0" * 40),
        ("", ""),
        ("a b", "a b"),
        (["x", ""], ("x", "")),
        (("x",), ("x",)),
        ([], ()),
        # A fresh generator for each run: tests/asbp runs once per decoder.
        (lambda: (s for s in ("g", "h")), ("g", "h")),
        ({"only": 1}, ("only",)),
    ],
    ids=[
        "zero",
        "int",
        "negative",
        "big-int",
        "empty-text",
        "text-with-space",
        "list",
        "tuple",
        "empty-list",
        "generator",
        "mapping-keys",
    ],
)
def test_value_forms(value: Any, stored: Any) -> None:
    if callable(value):
        value = value()
    assert Command(k=value).header["k"] == stored


@pytest.mark.parametrize("body", [b"x\x00", bytearray(b"x\x00"), memoryview(b"x\x00")])
def test_body_is_bytes_like(body: Any) -> None:
    command = Command({"c": "x"}, body)
    assert type(command.body) is bytes
    assert command.body == b"x\x00"


def test_sources_are_copied() -> None:
    header: dict[str, Any] = {"c": "x"}
    items = ["a"]
    body = bytearray(b"body")
    command = Command(header, body, k=items)
    header["c"] = "y"
    header["new"] = "z"
    items.append("b")
    body[0:4] = b"XXXX"
    assert dict(command.header) == {"c": "x", "k": ("a",)}
    assert command.body == b"body"


class _Text(str):
    pass


@pytest.mark.parametrize(
    "value",
    [1.5, None, True, False, b"x", bytearray(b"x"), memoryview(b"x"), _Text("x"), object()],
    ids=lambda v: type(v).__name__,
)
def test_wrong_value_type(value: Any) -> None:
    with pytest.raises(TypeError, match="value of 'k' must be str, int or a sequence of str"):
        Command(k=value)


@pytest.mark.parametrize(
    "items",
    [["a", 1], [b"a"], [_Text("a")], [None], [["a"]]],
    ids=["int", "bytes", "str-subclass", "none", "nested-list"],
)
def test_wrong_list_item_type(items: list[Any]) -> None:
    with pytest.raises(TypeError, match="list items of 'k' must be str"):
        Command(k=items)


@pytest.mark.parametrize("body", ["text", 1, [1, 2], None], ids=lambda b: type(b).__name__)
def test_wrong_body_type(body: Any) -> None:
    with pytest.raises(TypeError, match="body must be bytes"):
        Command({"c": "x"}, body)


def test_header_must_be_a_mapping() -> None:
    """A header that is not a mapping (here, a list of pairs) is a TypeError."""
    with pytest.raises(TypeError):
        Command([("c", "x")])  # type: ignore[arg-type]  # the wrong type is the test


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("k", "it's", '"\'"'),
        ("k", "a\rb", "'\\r'"),
        ("k", "a\nb", "'\\n'"),
        ("k", "\ud800", "'\\ud800'"),
        ("k", "x\udfff", "'\\udfff'"),
        ("k", ["ok", "no'"], '"\'"'),
        ("k", ("ok", "\n"), "'\\n'"),
        ("c", "it's", '"\'"'),
        ("g", ["a\r"], "'\\r'"),
    ],
    ids=[
        "quote",
        "cr",
        "lf",
        "high-surrogate",
        "low-surrogate",
        "quote-in-list",
        "lf-in-list",
        "quote-in-reserved",
        "cr-in-reserved-list",
    ],
)
def test_uncarriable_value(key: str, value: Any, shown: str) -> None:
    with pytest.raises(InvalidHeaderValue) as info:
        Command({key: value})
    error = info.value
    assert error.code is FaultCode.INVALID_HEADER_VALUE
    assert error.key == key
    assert error.offset is None
    assert f"no ASBP header can carry {shown}" in error.message
    assert "at byte" not in str(error)


@pytest.mark.parametrize(
    "key",
    ["", "a b", "k=", "k;", "k,", "+k", "k+", "k'", "[k]", "k\x00", "k\x7f", "k\x85", "k\u3000"],
)
def test_key_must_be_bare(key: str) -> None:
    with pytest.raises(MalformedHeader, match="is not a bare token") as info:
        Command({key: "x"})
    assert info.value.offset is None


def test_unicode_key_is_bare() -> None:
    assert Command({"\u043a\u043b\u044e\u0447": "x"}).get("\u043a\u043b\u044e\u0447") == "x"


@pytest.mark.parametrize(
    ("header", "body"), [(None, b""), ({}, b"body")], ids=["nothing", "empty-mapping"]
)
def test_empty_header_refused(header: Any, body: bytes) -> None:
    with pytest.raises(MalformedHeader, match="at least one key") as info:
        Command(header, body)
    assert info.value.code is FaultCode.INVALID_MESSAGE_FORMAT


def test_duplicate_between_mapping_and_keywords() -> None:
    with pytest.raises(MalformedHeader, match="duplicate key 'u'"):
        Command({"u": 1}, u=1)


@pytest.mark.parametrize(
    ("keys", "key", "needle"),
    [
        ({"u": 65536}, "u", "from 0 to 65535"),
        ({"u": -1}, "u", "from 0 to 65535"),
        ({"u": "007"}, "u", "from 0 to 65535"),
        ({"o": 0}, "o", "one-based"),
        ({"t": -1}, "t", "unsigned integer"),
        ({"d": []}, "d", "not an empty list"),
        ({"d": UUID.upper()}, "d", "UUID"),
        ({"g": ""}, "g", "must not be empty"),
        ({"i": [UUID]}, "i", "takes a single value"),
        ({"s": (UUID,)}, "s", "takes a single value"),
        ({"a": ""}, "a", "must not be empty"),
        ({"r": "bob"}, "r", "Conversation-Address"),
        ({"p": ["a*b"]}, "p", "takes a single value"),
        ({"m": "text"}, "m", "MIME type"),
        ({"z": "a/b/c"}, "z", "MIME type"),
        ({"e": "UTF 8"}, "e", "charset"),
        ({"f": 1}, "f", "OID"),
    ],
    ids=lambda v: repr(v) if isinstance(v, dict) else None,
)
def test_reserved_rules_apply(keys: dict[str, Any], key: str, needle: str) -> None:
    with pytest.raises(InvalidHeaderValue) as info:
        Command(keys)
    assert info.value.key == key
    assert needle in info.value.message
    assert info.value.offset is None


def test_reserved_values_accepted() -> None:
    command = Command(
        a="agent 1",
        b="broker",
        c="display text",
        d=[UUID, UUID2],
        e="UTF-8",
        f="1.3.6.1",
        g="friends",
        i=UUID,
        o=1,
        m="text/plain; charset=UTF-8",
        r="bob*example.org",
        p="alice*example.org",
        s=UUID2,
        t=0,
        u=65535,
        x="1.3.6.1.4.1.99",
        z="x-gzip",
    )
    assert len(command.header) == 17


# -- immutability ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["_header", "_body", "header", "body", "other"])
def test_attributes_cannot_be_set(name: str) -> None:
    command = Command(c="x")
    with pytest.raises(AttributeError, match="immutable"):
        setattr(command, name, {})
    assert command == Command(c="x")


@pytest.mark.parametrize("name", ["_header", "_body", "header", "other"])
def test_attributes_cannot_be_deleted(name: str) -> None:
    command = Command(c="x")
    with pytest.raises(AttributeError, match="immutable"):
        delattr(command, name)
    assert command.header["c"] == "x"


def test_header_mapping_is_read_only() -> None:
    command = Command(c="x")
    header: Any = command.header
    with pytest.raises(TypeError):
        header["c"] = "y"
    with pytest.raises(TypeError):
        del header["c"]
    with pytest.raises(AttributeError):
        header.clear()
    assert dict(command.header) == {"c": "x"}


def test_copy_and_pickle_keep_the_command() -> None:
    """copy, deepcopy and pickle rebuild an equal Command despite the refusing
    __setattr__ and the read-only header view."""
    command = Command({"c": "x", "g": ["a", "b"]}, b"body")
    assert copy.copy(command) == command
    assert copy.deepcopy(command) == command
    assert pickle.loads(pickle.dumps(command)) == command


# -- value semantics ------------------------------------------------------------


def test_equality_ignores_key_order() -> None:
    one = Command({"c": "x", "u": 1, "k": ["a"]}, b"b")
    two = Command({"k": ("a",), "u": "1", "c": "x"}, b"b")
    assert one == two
    assert hash(one) == hash(two)
    assert len({one, two}) == 1


@pytest.mark.parametrize(
    "other",
    [
        Command({"c": "x", "u": 1, "k": ["a"]}, b"c"),
        Command({"c": "x", "u": 2, "k": ["a"]}, b"b"),
        Command({"c": "x", "u": 1, "k": "a"}, b"b"),
        Command({"c": "x", "u": 1, "k": ["a", "a"]}, b"b"),
        Command({"c": "x", "u": 1}, b"b"),
        Command({"c": "x", "u": 1, "k": ["a"], "j": ""}, b"b"),
    ],
    ids=["body", "value", "list-vs-text", "list-length", "fewer-keys", "more-keys"],
)
def test_inequality(other: Command) -> None:
    command = Command({"c": "x", "u": 1, "k": ["a"]}, b"b")
    assert command != other
    assert other != command


def test_equality_with_other_types() -> None:
    command = Command(c="x")
    assert command != {"c": "x"}
    assert command != "c=x;"
    assert command.__eq__({"c": "x"}) is NotImplemented


def test_decoded_equals_built() -> None:
    assert decode(b"u=7,c=x;b") == Command({"c": "x", "u": 7}, b"b")


def test_mapping_like_reading() -> None:
    command = Command(c="x", k=["a"])
    assert list(command) == ["c", "k"]
    assert "k" in command
    assert "z" not in command
    assert 1 not in command
    assert command.get("k") == ("a",)
    assert command.get("z") is None


def test_repr() -> None:
    assert repr(Command(c="x")) == "Command({'c': 'x'}, b'')"
    assert repr(Command({"g": ["a"]}, b"\x00")) == "Command({'g': ('a',)}, b'\\x00')"


def test_repr_truncates_long_bodies() -> None:
    body = bytes(range(65, 65 + 32))
    assert repr(Command({"c": "x"}, body)) == f"Command({{'c': 'x'}}, {body!r})"
    longer = body + b"!!"
    assert repr(Command({"c": "x"}, longer)) == f"Command({{'c': 'x'}}, {body!r}...)"


def test_repr_evaluates_back() -> None:
    command = Command({"c": "x", "g": ["a", "b"], "k": []}, b"short")
    assert eval(repr(command), {"Command": Command}) == command


# -- derived copies -------------------------------------------------------------


def test_with_keys_adds_and_replaces() -> None:
    command = Command({"c": "x", "u": 1}, b"body")
    derived = command.with_keys({"i": UUID}, u=2, g=["a"])
    assert dict(derived.header) == {"c": "x", "u": "2", "i": UUID, "g": ("a",)}
    assert derived.body == b"body"
    assert dict(command.header) == {"c": "x", "u": "1"}


def test_with_keys_without_arguments_copies() -> None:
    command = Command({"c": "x"}, b"b")
    derived = command.with_keys()
    assert derived == command
    assert derived is not command


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"u": 70000}, InvalidHeaderValue),
        ({"k": "it's"}, InvalidHeaderValue),
        ({"k=": "x"}, MalformedHeader),
        ({"d": []}, InvalidHeaderValue),
        ({"k": 1.5}, TypeError),
        ({"k": [1]}, TypeError),
    ],
    ids=["rule", "uncarriable", "bad-key", "empty-list", "float", "int-item"],
)
def test_with_keys_validates_new_keys(keys: dict[str, Any], error: type[Exception]) -> None:
    command = Command(c="x")
    with pytest.raises(error):
        command.with_keys(keys)
    with pytest.raises(error):
        command.with_keys(**keys)


def test_without_keys() -> None:
    command = Command({"c": "x", "u": 1, "k": []}, b"body")
    derived = command.without_keys("u", "absent")
    assert dict(derived.header) == {"c": "x", "k": ()}
    assert derived.body == b"body"
    assert "u" in command
    assert command.without_keys() == command


def test_without_keys_refuses_to_drop_the_last_key() -> None:
    command = Command(c="x", u=1)
    with pytest.raises(MalformedHeader, match="at least one key"):
        command.without_keys("c", "u")
    assert dict(command.without_keys("c").header) == {"u": "1"}


@pytest.mark.parametrize("body", [b"new", bytearray(b"new"), memoryview(b"new")])
def test_with_body(body: Any) -> None:
    command = Command({"c": "x"}, b"old")
    derived = command.with_body(body)
    assert type(derived.body) is bytes
    assert derived.body == b"new"
    assert derived.header == command.header
    assert command.body == b"old"


@pytest.mark.parametrize("body", ["new", 3, None], ids=lambda b: type(b).__name__)
def test_with_body_wrong_type(body: Any) -> None:
    with pytest.raises(TypeError, match="body must be bytes"):
        Command(c="x").with_body(body)


# -- typed accessors ------------------------------------------------------------

SINGLE = [
    ("agent_id", "a", "agent-7"),
    ("broker_id", "b", "broker 1"),
    ("name", "c", "display text"),
    ("encoding", "e", "UTF-8"),
    ("data_format", "f", "1.3.6.1.4.1"),
    ("channel_id", "i", UUID),
    ("mime_type", "m", "text/plain"),
    ("publisher", "p", "bob*example.org"),
    ("subject_id", "s", UUID2),
    ("exchange_name", "x", "1.2.3"),
    ("compression", "z", "x-gzip"),
]


@pytest.mark.parametrize(("accessor", "key", "value"), SINGLE, ids=[s[0] for s in SINGLE])
def test_text_accessor(accessor: str, key: str, value: str) -> None:
    assert getattr(Command({key: value}), accessor) == value
    assert getattr(decode(encode(Command({key: value}))), accessor) == value
    assert getattr(Command(k="v"), accessor) is None


MANY = [
    ("destinations", "d", UUID, (UUID, UUID2)),
    ("groups", "g", "friends", ("friends", "country men")),
    ("recipients", "r", "a*b", ("a*b", "c*d")),
]


@pytest.mark.parametrize(("accessor", "key", "one", "several"), MANY, ids=[m[0] for m in MANY])
def test_list_accessor(accessor: str, key: str, one: str, several: tuple[str, ...]) -> None:
    assert getattr(Command({key: one}), accessor) == (one,)
    assert getattr(Command({key: [one]}), accessor) == (one,)
    assert getattr(Command({key: several}), accessor) == several
    assert getattr(Command(k="v"), accessor) == ()


@pytest.mark.parametrize(
    ("accessor", "key", "value"),
    [
        ("command_id", "u", 0),
        ("command_id", "u", 65535),
        ("total", "t", 0),
        ("total", "t", 10**30),
        ("of_total", "o", 1),
        ("of_total", "o", 1143),
    ],
)
def test_integer_accessor(accessor: str, key: str, value: int) -> None:
    command = decode(f"{key}={value};".encode())
    assert getattr(command, accessor) == value
    assert type(getattr(command, accessor)) is int
    assert getattr(Command(k="v"), accessor) is None


@pytest.mark.parametrize(
    "digits",
    [
        "9" * 4000,
        "1" + "0" * 4000,
        "7" * 4001,
        "8" * 4300,
        "3" * 4301,
        "1234567890" * 500,
        "1" + "0" * 7999,
        "98765432" * 1000,
    ],
    ids=lambda d: f"{d[:2]}-x{len(d)}",
)
def test_integer_accessors_of_any_size(digits: str) -> None:
    expected = horner(digits)
    assert decode(f"t={digits};".encode()).total == expected
    assert decode(f"o={digits};".encode()).of_total == expected
    assert Command({"t": digits}).total == expected
    assert Command(c="x").with_keys(o=digits).of_total == expected


def test_integer_values_of_any_size_can_be_built() -> None:
    """Ints past Python's 4300-digit str() limit can be built, since o and t
    take "any size" and the accessors return such ints."""
    big = 10**5000 + 1
    assert Command(t=big).total == big
    assert Command(c="x").with_keys(o=big).of_total == big


# -- encode ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("x", b"k=x;"),
        ("Abc123", b"k=Abc123;"),
        ("a-b.c*d/e:f", b"k=a-b.c*d/e:f;"),
        ("-1", b"k=-1;"),
        ("", b"k='';"),
        ("a b", b"k='a b';"),
        (";", b"k=';';"),
        ("a=b", b"k='a=b';"),
        ("a,b", b"k='a,b';"),
        ("[x]", b"k='[x]';"),
        ("+1", b"k='+1';"),
        ("\x00", b"k='\x00';"),
        ("\x7f", b"k='\x7f';"),
        ("\t", b"k='\t';"),
        ("\xe9", "+k=\xe9;".encode()),
        ("\u0663", "+k=\u0663;".encode()),
        ("\x85", "+k='\x85';".encode()),
        ("\u3000", "+k='\u3000';".encode()),
        ("\u2028", "+k='\u2028';".encode()),
        ("\U0001f600", "+k=\U0001f600;".encode()),
    ],
)
def test_encode_bare_or_quoted(value: str, written: bytes) -> None:
    command = Command(k=value)
    assert encode(command) == written
    assert decode(written) == command


def test_encode_lists() -> None:
    command = Command({"k": [], "j": ["", "a b", "x"], "d": [UUID]}, b"body")
    frame = b"k=[],j=['','a b',x],d=[" + UUID.encode() + b"];body"
    assert encode(command) == frame
    assert decode(frame) == command


def test_encode_keeps_key_order() -> None:
    assert encode(Command({"z": "1", "a": "2", "k": "3"})) == b"z=1,a=2,k=3;"


@pytest.mark.parametrize(
    ("command", "marked"),
    [
        (Command({"c": "x"}, "\xe9".encode()), False),
        (Command({"c": "x"}, b"\xff"), False),
        (Command({"\xe9": "x"}), True),
        (Command({"c": "x", "k": ["a", "\xe9"]}), True),
        (Command({"c": "\x7f"}), False),
    ],
    ids=["utf8-body", "binary-body", "utf8-key", "utf8-list-item", "del"],
)
def test_encode_marks_only_non_ascii_headers(command: Command, marked: bool) -> None:
    frame = encode(command)
    assert frame.startswith(b"+") is marked
    assert frame.count(b"+") == int(marked)
    assert decode(frame) == command


def test_encode_refuses_too_many_keys() -> None:
    command = Command({f"k{n}": "1" for n in range(3)})
    assert decode(encode(command, limits=Limits(max_keys=3)), limits=Limits(max_keys=3))
    with pytest.raises(TooManyKeys, match="3 keys, more than the limit of 2") as info:
        encode(command, limits=Limits(max_keys=2))
    assert info.value.offset is None
    with pytest.raises(TooManyKeys):
        encode(Command({f"k{n}": "1" for n in range(65)}))


def test_encode_refuses_long_lists() -> None:
    command = Command(c="x", k=["a"] * 3)
    assert encode(command, limits=Limits(max_list_items=3)) == b"c=x,k=[a,a,a];"
    with pytest.raises(TooManyListItems, match="list of 'k' has 3 items") as info:
        encode(command, limits=Limits(max_list_items=2))
    assert info.value.offset is None
    with pytest.raises(TooManyListItems):
        encode(Command(k=[""] * 1025))


def test_encode_refuses_long_headers() -> None:
    limits = Limits(max_header_bytes=8)
    assert encode(Command(k="abcdef"), limits=limits) == b"k=abcdef;"
    with pytest.raises(HeaderTooLarge, match="header of 9 bytes exceeds the limit of 8"):
        encode(Command(k="abcdefg"), limits=limits)
    # The "+" marker counts: "+k=" and three two-byte characters make 9.
    with pytest.raises(HeaderTooLarge, match="header of 9 bytes"):
        encode(Command(k="\xe9\xe9\xe9"), limits=limits)
    with pytest.raises(HeaderTooLarge):
        encode(Command(k="a" * 8191))
    assert len(encode(Command(k="a" * 8190))) == 8193


def test_encode_refuses_large_frames() -> None:
    limits = Limits(max_frame_bytes=8)
    assert encode(Command({"k": "1"}, b"abcd"), limits=limits) == b"k=1;abcd"
    with pytest.raises(FrameTooLarge, match="frame of 9 bytes exceeds the limit of 8") as info:
        encode(Command({"k": "1"}, b"abcde"), limits=limits)
    assert info.value.offset is None
    with pytest.raises(FrameTooLarge):
        encode(Command({"k": "1"}, bytes(256 * 1024 - 3)))


def test_encode_is_what_decode_reads_back() -> None:
    command = Command(
        {"c": "display text", "g": ["friends", "country men"], "d": UUID, "\xe9": ";"},
        b"Hello World!",
    )
    frame = encode(command)
    assert (
        frame
        == (
            "+c='display text',g=[friends,'country men'],d=" + UUID + ",\xe9=';';Hello World!"
        ).encode()
    )
    assert decode(frame) == command
    assert encode(decode(frame)) == frame


# -- decode's input -------------------------------------------------------------


def _octets() -> Iterator[int]:
    yield from b"c=x;"


@pytest.mark.parametrize(
    "frame", [bytearray(b"c=x;b"), memoryview(b"c=x;b")], ids=["bytearray", "memoryview"]
)
def test_decode_takes_bytes_like(frame: Any) -> None:
    command = decode(frame)
    assert type(command.body) is bytes
    assert command == Command({"c": "x"}, b"b")


def test_decode_refuses_text() -> None:
    with pytest.raises(TypeError):
        decode("c=x;")  # type: ignore[arg-type]  # the wrong type is the test


@pytest.mark.parametrize(
    "frame", [5, [99, 61, 120, 59], _octets()], ids=["int", "list-of-ints", "iterator"]
)
def test_decode_refuses_what_is_not_bytes_like(frame: Any) -> None:
    """Only bytes-like frames: ``bytes(frame)`` would turn an int into that many
    zero bytes (``decode(10**10)`` would allocate 10 GB before the frame limit
    is checked) and read a list or iterator of ints as a frame."""
    with pytest.raises(TypeError):
        decode(frame)


def test_protocol_errors_share_one_root() -> None:
    with pytest.raises(ProtocolError):
        Command(k="'")
    with pytest.raises(ProtocolError):
        decode(b";")

"""What crosses a Course, pure: batches of crossings, domains, ``course.via``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asbp import Command, Limits, decode, encode
from asbp.header import RESERVED_KEYS
from courses.wire import (
    ACK,
    BATCH,
    ID_KEY,
    ack_frame,
    crossing_from,
    pack,
    split_by_domain,
    unpack,
    via_of,
    with_subject,
)
from tests.support.strategies import address, bare_texts, commands, unknown_keys, uuid_hex


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(min_value=1, max_value=2000))
def test_pack_then_unpack_gives_the_frames_back_in_order(
    frames: list[bytes], max_bytes: int
) -> None:
    out: list[bytes] = []
    for message in pack(frames, max_bytes=max_bytes):
        if message.startswith(b"c=" + BATCH.encode() + b";"):
            out += unpack(message.partition(b";")[2])
        else:
            out.append(message)
    assert out == frames


def test_a_lone_frame_travels_as_itself_and_several_as_one_batch() -> None:
    one = b"c=chat,course.id=1;hi"
    assert pack([one]) == [one]
    [batch] = pack([one, b"c=chat,course.id=2;"])
    command = decode(batch)
    assert command.name == BATCH
    assert unpack(command.body) == [one, b"c=chat,course.id=2;"]


@pytest.mark.parametrize("body", [b"x:abc", b"5:abc", b":abc", b"123456789:a"])
def test_a_body_that_is_not_a_batch_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        unpack(body)


@pytest.mark.parametrize(
    "ids",
    [
        ["0123456789abcdef" * 2],
        ["a" * 32, "0123456789abcdef" * 2, "f" * 32],
        ["a" * 32, "an id, quoted"],  # another implementation's: encoded
        ["A" * 32],
        [""],
    ],
)
def test_an_acknowledgement_is_what_encoding_gives(ids: list[str]) -> None:
    frame = ack_frame(ids)
    assert frame == encode(Command({"c": ACK, ID_KEY: ids}))
    assert decode(frame).get(ID_KEY) == tuple(ids)


def test_domains_and_via() -> None:
    assert split_by_domain(["a*X.test", "b*x.test", "a*X.test", "c*y.test"]) == {
        "x.test": ("a*X.test", "b*x.test"),
        "y.test": ("c*y.test",),
    }
    assert (
        split_by_domain(("a*X.test",)) == split_by_domain(["a*X.test"]) == {"x.test": ("a*X.test",)}
    )
    assert via_of(Command(c="x")) == ()
    assert via_of(Command({"c": "x", "course.via": "a.test"})) == ("a.test",)
    assert via_of(Command({"c": "x", "course.via": ["a.test", "b.test"]})) == ("a.test", "b.test")


SUBJECT = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    "frame",
    [
        b"c=chat,r=[bob*b.test,carol*b.test],p=alice*a.test,course.via=[a.test],course.id=00ff;hi",
        b"course.id=00ff,c=chat,course.via=[x.test,a.test],p=alice*a.test,x=1.2.3;",
        b"c=chat,course.via=a.test,course.id=00ff,u=7;body;with;semicolons",
        b"course.via=[a.test],course.id=00ff,c=chat;",
        # The sending bus's own order, cut off as a tail: a list of several, and not
        # the tail when a pair follows or only the list is there.
        b"c=chat,r=bob*b.test,course.via=[x.test,a.test],course.id=00ff;hi",
        b"c=chat,course.via=[a.test],course.id=00ff,u=7;hi",
        b"c=chat,course.id=00ff,course.via=[a.test];hi",
        b"c=chat,course.via=[a.test],r=[bob*b.test],course.id=00ff;hi",
    ],
)
def test_a_recipients_frame_is_spliced_as_encoding_would_give_it(frame: bytes) -> None:
    crossing = decode(frame)
    spliced = with_subject(frame, crossing, SUBJECT, max_header_bytes=8192)
    assert spliced is not None
    expected = crossing.without_keys("course.id", "course.via").with_keys(s=SUBJECT)
    assert decode(spliced) == expected
    assert b"course." not in spliced.partition(b";")[0]


@pytest.mark.parametrize(
    "header",
    [
        {"c": "chat", "course.id": "00ff", "q": "a,course.id=1"},  # quoted: a pair hides
        {"c": "chat", "course.id": "00ff", "n": "naïve"},  # a UTF-8 header
        {"c": "chat", "course.id": "00ff", "i": "0" * 32},  # a key this bus removes
        {"c": "chat", "course.id": "00ff", "s": "1" * 32},
    ],
)
def test_a_frame_that_cannot_be_spliced_safely_is_encoded(header: dict[str, str]) -> None:
    crossing = Command(header, b"x")
    assert with_subject(encode(crossing), crossing, SUBJECT, max_header_bytes=8192) is None


def test_a_splice_never_passes_the_header_limit() -> None:
    crossing = Command({"c": "chat", "course.id": "00ff", "pad": "y" * 60}, b"")
    frame = encode(crossing)
    assert with_subject(frame, crossing, SUBJECT, max_header_bytes=len(frame) + 40) is not None
    assert with_subject(frame, crossing, SUBJECT, max_header_bytes=70) is None
    assert with_subject(frame, crossing, "not hex!", max_header_bytes=8192) is None
    only = Command({"course.id": "00ff"}, b"")
    assert with_subject(encode(only), only, SUBJECT, max_header_bytes=8192) is None


# -- the sending bus: a crossing spliced from what the User-Agent sent ------------

CROSSING_ID = "0123456789abcdef0123456789abcdef"
LIMITS = Limits()
#: What Courses._route and _send make of a User-Agent's Command: its own keys gone.
LOCAL = ("s", "i", "a", "b", "d", "g", "p", "course.id", "course.via")


def expected_crossing(sent: Command, publisher: str, via: list[str]) -> Command:
    bare = sent.without_keys(*(k for k in LOCAL if k in sent))
    return bare.with_keys(p=publisher).with_keys({"course.via": via, "course.id": CROSSING_ID})


@pytest.mark.parametrize(
    "frame",
    [
        b"c=chat,r=bob*b.test,s=" + SUBJECT.encode() + b",u=7;ping",
        b"s=" + SUBJECT.encode() + b",c=chat,r=[bob*b.test,carol*b.test];",
        b"c=chat,r=bob*b.test,x=1.2.3,notice=delivered;body;with;semicolons",
        b"r=bob*b.test,c=chat,s=" + SUBJECT.encode() + b";",
    ],
)
def test_a_crossing_is_spliced_as_encoding_would_give_it(frame: bytes) -> None:
    sent = decode(frame)
    spliced = crossing_from(
        frame, sent, "alice*a.test", ["x.test", "a.test"], CROSSING_ID, limits=LIMITS
    )
    assert spliced is not None
    assert decode(spliced) == expected_crossing(sent, "alice*a.test", ["x.test", "a.test"])


@given(commands(), address)
def test_a_spliced_crossing_always_decodes_to_what_encoding_gives(
    sent: Command, publisher: str
) -> None:
    frame = encode(sent)
    spliced = crossing_from(frame, sent, publisher, ["a.test"], CROSSING_ID, limits=LIMITS)
    if spliced is not None:
        assert decode(spliced) == expected_crossing(sent, publisher, ["a.test"])


#: ASCII bare tokens, and addresses made of them: the common case, which splices.
ascii_bare = st.text(
    [chr(c) for c in range(0x21, 0x7F) if chr(c) not in ";=,'[]+*"], min_size=1, max_size=8
)
ascii_address = st.builds(lambda local, domain: f"{local}*{domain}", ascii_bare, ascii_bare)
#: Commands of the shape a User-Agent sends by ``r``: ``s``, more keys, mostly bare
#: ASCII tokens (and sometimes not, which must not splice).
ua_commands = st.builds(
    lambda c, r, s, more, body: Command({"c": c, **more, "r": r, "s": s}, body),
    st.one_of(ascii_bare, bare_texts),
    st.lists(st.one_of(ascii_address, address), min_size=1, max_size=3),
    uuid_hex,
    st.dictionaries(
        st.one_of(ascii_bare, unknown_keys).filter(
            lambda k: k not in RESERVED_KEYS and k not in ("course.id", "course.via")
        ),
        st.one_of(ascii_bare, bare_texts, st.lists(ascii_bare, min_size=1, max_size=3)),
        max_size=4,
    ),
    st.binary(max_size=16),
)


@given(ua_commands, st.one_of(ascii_address, address))
def test_what_a_user_agent_sends_is_spliced_as_encoding_would_give_it(
    sent: Command, publisher: str
) -> None:
    frame = encode(sent)
    spliced = crossing_from(frame, sent, publisher, ["a.test"], CROSSING_ID, limits=LIMITS)
    if (
        frame.count(b"'") == 0
        and frame[:1] != b"+"
        and all(c not in publisher for c in ";=,'[]+")
        and publisher.isascii()
    ):
        assert spliced is not None
    if spliced is not None:
        assert decode(spliced) == expected_crossing(sent, publisher, ["a.test"])


@pytest.mark.parametrize(
    ("header", "publisher"),
    [
        ({"c": "chat", "r": "bob*b.test", "q": "a,s=1"}, "alice*a.test"),  # quoted
        ({"c": "chat", "r": "bob*b.test", "n": "naïve"}, "alice*a.test"),  # UTF-8
        ({"c": "chat", "r": "bob*b.test", "p": "eve*a.test"}, "alice*a.test"),  # p in place
        ({"c": "chat", "r": "bob*b.test", "g": "room"}, "alice*a.test"),  # a key removed
        ({"c": "chat", "r": "bob*b.test", "course.id": "1"}, "alice*a.test"),
        ({"c": "chat", "r": "bob*b.test"}, "al,ice*a.test"),  # p would need quotes
        ({"c": "chat", "r": "bob*b.test"}, "al ice*a.test"),
        ({"c": "chat", "r": "bob*b.test"}, "bö*a.test"),
    ],
)
def test_a_crossing_that_cannot_be_spliced_safely_is_encoded(
    header: dict[str, str], publisher: str
) -> None:
    sent = Command(header, b"x")
    assert (
        crossing_from(encode(sent), sent, publisher, ["a.test"], CROSSING_ID, limits=LIMITS) is None
    )


def test_a_spliced_crossing_keeps_within_the_limits() -> None:
    sent = Command({"c": "chat", "r": "bob*b.test", "pad": "y" * 60}, b"z" * 10)
    frame = encode(sent)
    size = len(frame) + len(",p=alice*a.test,course.via=[a.test],course.id=") + 32

    def splice(limits: Limits, via: list[str] | None = None) -> bytes | None:
        return crossing_from(
            frame, sent, "alice*a.test", via or ["a.test"], CROSSING_ID, limits=limits
        )

    assert splice(Limits(max_frame_bytes=size)) is not None
    assert splice(Limits(max_frame_bytes=size - 1)) is None
    assert splice(Limits(max_header_bytes=size - 11)) is not None
    assert splice(Limits(max_header_bytes=size - 12)) is None
    assert splice(Limits(max_keys=6)) is not None
    assert splice(Limits(max_keys=5)) is None
    assert splice(Limits(max_list_items=1), ["x.test", "a.test"]) is None
    only = Command({"s": SUBJECT}, b"")
    assert crossing_from(encode(only), only, "a*b", ["a.test"], CROSSING_ID, limits=LIMITS) is None

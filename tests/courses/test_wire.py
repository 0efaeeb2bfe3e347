"""What crosses a Course, pure: batches of crossings, domains, ``course.via``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asbp import Command, decode, encode
from courses.wire import BATCH, pack, split_by_domain, unpack, via_of, with_subject


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


def test_domains_and_via() -> None:
    assert split_by_domain(["a*X.test", "b*x.test", "a*X.test", "c*y.test"]) == {
        "x.test": ("a*X.test", "b*x.test"),
        "y.test": ("c*y.test",),
    }
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

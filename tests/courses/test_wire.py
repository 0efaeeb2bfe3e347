"""What crosses a Course, pure: batches of crossings, domains, ``course.via``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asbp import Command, decode
from courses.wire import BATCH, pack, split_by_domain, unpack, via_of


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

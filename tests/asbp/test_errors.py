"""The error tree, the fault table, Limits, and the reserved-key table."""

from __future__ import annotations

from typing import Any

import pytest

from asbp import (
    DEFAULT_LIMITS,
    RESERVED_KEYS,
    AsbpError,
    FaultCode,
    FrameTooLarge,
    HeaderTooLarge,
    InvalidHeaderValue,
    KiB,
    Limits,
    MalformedHeader,
    ProtocolError,
    TooManyKeys,
    TooManyListItems,
)
from asbp.grammar import RESERVED, is_bare
from asbp.header import Arity


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (FrameTooLarge, 1101),
        (HeaderTooLarge, 1104),
        (TooManyKeys, 1105),
        (TooManyListItems, 1106),
        (MalformedHeader, 1201),
        (ProtocolError, 1201),
        (AsbpError, 1201),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_error_codes(error: type[AsbpError], code: int) -> None:
    assert error.code == code
    assert issubclass(error, AsbpError)
    instance = error("bad")
    assert instance.code == code
    assert str(instance) == f"{code}: bad"


def test_protocol_error_offset() -> None:
    located = MalformedHeader("bad thing", offset=12)
    assert located.offset == 12
    assert located.message == "bad thing at byte 12"
    assert str(located) == "1201: bad thing at byte 12"
    assert located.args == ("bad thing at byte 12",)
    unlocated = MalformedHeader("bad thing")
    assert unlocated.offset is None
    assert unlocated.message == "bad thing"
    assert MalformedHeader("x", offset=0).message == "x at byte 0"


def test_code_can_be_given() -> None:
    error = AsbpError("denied", code=FaultCode.ACCESS_DENIED)
    assert error.code is FaultCode.ACCESS_DENIED
    assert str(error) == "3201: denied"
    assert AsbpError.code is FaultCode.INVALID_MESSAGE_FORMAT
    located = ProtocolError("odd", offset=3, code=FaultCode.UNEXPECTED_MESSAGE_TYPE)
    assert (located.code, located.offset) == (FaultCode.UNEXPECTED_MESSAGE_TYPE, 3)


def test_invalid_header_value() -> None:
    error = InvalidHeaderValue("u", "too big", offset=4)
    assert error.key == "u"
    assert error.code is FaultCode.INVALID_HEADER_VALUE
    assert str(error) == "1203: key 'u': too big at byte 4"
    assert InvalidHeaderValue("u", "too big").offset is None


def test_fault_codes_have_descriptions() -> None:
    for code in FaultCode:
        assert code.description
        assert code.description[0].isupper()
    assert FaultCode.HEADER_TOO_LARGE.description == "Header too large"
    assert len({code.description for code in FaultCode}) == len(FaultCode)


def test_fault_code_blocks() -> None:
    # The first digit says the block, so Sapo-only clients can still read it.
    assert {int(c) // 1000 for c in FaultCode} == {1, 2, 3}
    assert int(FaultCode.INVALID_MESSAGE_FORMAT) == 1201


def test_default_limits() -> None:
    assert Limits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_frame_bytes == 256 * KiB == 262144
    assert DEFAULT_LIMITS.max_header_bytes == 8 * KiB
    assert DEFAULT_LIMITS.max_keys == 64
    assert DEFAULT_LIMITS.max_list_items == 1024


def test_limits_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEFAULT_LIMITS.max_keys = 1  # type: ignore[misc]  # the assignment is the test


@pytest.mark.parametrize(
    "field", ["max_frame_bytes", "max_header_bytes", "max_keys", "max_list_items"]
)
@pytest.mark.parametrize("value", [0, -1, True, 1.0, "8", None], ids=repr)
def test_limits_refuse_non_positive_ints(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a positive int"):
        Limits(**{field: value})


def test_limits_accept_one() -> None:
    assert Limits(1, 1, 1, 1).max_keys == 1


@pytest.mark.parametrize(
    ("text", "bare"),
    [
        ("x", True),
        ("\xe9t\xe9", True),
        ("a-b.c*d/e:f!#$%&()", True),
        ("", False),
        ("a b", False),
        ("a\u00a0b", False),
        ("a\x85", False),
        ("a\x9f", False),
        ("a\x7f", False),
        ("a\x00", False),
        ("\ud800", False),
        *[(f"a{char}", False) for char in sorted(RESERVED)],
    ],
)
def test_is_bare(text: str, bare: bool) -> None:
    assert is_bare(text) is bare


def test_reserved_keys_are_the_drafts() -> None:
    # §1.3.4.2's chart, in its order.
    assert list(RESERVED_KEYS) == list("abcdefgiomrpstuxz")
    many = {k for k, spec in RESERVED_KEYS.items() if spec.arity is Arity.ONE_OR_MORE}
    assert many == {"d", "g", "r"}
    for key, spec in RESERVED_KEYS.items():
        assert spec.key == key
        assert spec.name
        assert spec.rule

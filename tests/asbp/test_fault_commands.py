"""``asbp.fault`` Commands: what fault_command builds is what read_fault reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asbp import Command, FaultCode, FaultReport, decode, encode, fault_command, read_fault
from asbp.names import FAULT


@pytest.mark.parametrize(
    ("built", "header", "body"),
    [
        (
            fault_command(FaultCode.NO_RESPONDENT, "no one serves echo", cause="echo"),
            {"c": FAULT, "code": "2101", "e": "UTF-8", "cause": "echo"},
            b"no one serves echo",
        ),
        (
            fault_command(1201, "bad header", command_id=7),
            {"c": FAULT, "code": "1201", "e": "UTF-8", "u": "7"},
            b"bad header",
        ),
        # A name no header value can carry is left out; the message still says it.
        (
            fault_command(2101, "no 'it's'", cause="it's"),
            {"c": FAULT, "code": "2101", "e": "UTF-8"},
            b"no 'it's'",
        ),
        (fault_command(2101, "x", cause="a\rb"), {"c": FAULT, "code": "2101", "e": "UTF-8"}, b"x"),
        (fault_command(2101, "x", cause="a\nb"), {"c": FAULT, "code": "2101", "e": "UTF-8"}, b"x"),
        (fault_command(2101, "x", cause=""), {"c": FAULT, "code": "2101", "e": "UTF-8"}, b"x"),
        # A lone surrogate cannot be UTF-8: replaced, not an error.
        (fault_command(1, "\ud800"), {"c": FAULT, "code": "1", "e": "UTF-8"}, b"?"),
    ],
)
def test_fault_command_vectors(built: Command, header: dict[str, str], body: bytes) -> None:
    assert dict(built.header) == header
    assert built.body == body


@pytest.mark.parametrize(
    ("command", "report"),
    [
        (
            Command({"c": FAULT, "code": "3201", "u": "9", "cause": "orders.create"}, b"denied"),
            FaultReport(3201, "denied", 9, "orders.create"),
        ),
        (Command({"c": FAULT}, b""), FaultReport(0, "", None, None)),
        (Command({"c": FAULT, "code": "abc"}), FaultReport(0, "", None, None)),
        (Command({"c": FAULT, "code": "-5"}), FaultReport(0, "", None, None)),
        # Unicode digits that int() refuses, and numbers no fault table holds.
        (Command({"c": FAULT, "code": "²"}), FaultReport(0, "", None, None)),
        (Command({"c": FAULT, "code": "1234567890"}), FaultReport(0, "", None, None)),
        (Command({"c": FAULT, "code": "999999999"}), FaultReport(999999999, "", None, None)),
        (Command({"c": FAULT, "code": ("1", "2")}), FaultReport(0, "", None, None)),
        (Command({"c": FAULT, "code": "1", "cause": ("a", "b")}), FaultReport(1, "", None, None)),
        (Command({"c": FAULT, "code": "1"}, b"\xff"), FaultReport(1, "\ufffd", None, None)),
    ],
)
def test_read_fault_vectors(command: Command, report: FaultReport) -> None:
    assert read_fault(command) == report


_CAUSE = st.text(
    st.characters(
        blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp"), blacklist_characters=";=,'[]+"
    ),
    min_size=1,
    max_size=20,
)


@given(
    code=st.integers(0, 999_999_999),
    message=st.text(st.characters(blacklist_categories=("Cs",)), max_size=50),
    command_id=st.none() | st.integers(0, 65535),
    cause=st.none() | _CAUSE,
)
def test_a_fault_survives_the_wire(
    code: int, message: str, command_id: int | None, cause: str | None
) -> None:
    frame = encode(fault_command(code, message, command_id=command_id, cause=cause))
    assert read_fault(decode(frame)) == FaultReport(code, message, command_id, cause)

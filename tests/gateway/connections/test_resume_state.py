"""The record a resumable Channel keeps beside its log (gateway.connections.resume_state)."""

from __future__ import annotations

import pytest

from gateway.connections.resume_state import ResumeRecord


def test_a_record_reads_back_what_was_written() -> None:
    record = ResumeRecord.of({"room", "hall"})
    assert record.groups == ("hall", "room")
    assert ResumeRecord.decode(record.encode()) == record


@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"[1, 2]", b'{"groups": "room"}', b'{"other": []}'],
)
def test_anything_unreadable_counts_as_no_record(data: bytes) -> None:
    assert ResumeRecord.decode(data) == ResumeRecord()


def test_names_that_are_not_text_are_left_out() -> None:
    assert ResumeRecord.decode(b'{"groups": ["room", 3, null]}').groups == ("room",)

"""The event log's vocabulary: one field table, consistent with its own names."""

from __future__ import annotations

import typing
from fnmatch import fnmatch

import pytest

from asbp import eventlog
from asbp.eventlog import EVENT_FIELDS, FIELDS, EventField


def test_fields_are_the_table_in_order_and_distinct() -> None:
    assert tuple(field.name for field in EVENT_FIELDS) == FIELDS
    assert len(set(FIELDS)) == len(FIELDS)
    # Readers locate the time first, and new fields may only be appended.
    assert FIELDS[:2] == ("time", "broker") and FIELDS[-1] == "latency_us"


@pytest.mark.parametrize(
    ("name", "values", "kind"),
    [
        ("source_kind", eventlog.SOURCE_KINDS, eventlog.SourceKind),
        ("destination_kind", eventlog.DESTINATION_KINDS, eventlog.DestinationKind),
        ("outcome", eventlog.OUTCOMES, eventlog.Outcome),
    ],
)
def test_enumerated_fields_hold_their_kinds(
    name: str, values: tuple[str, ...], kind: object
) -> None:
    field = EVENT_FIELDS[FIELDS.index(name)]
    assert field.type == "string"
    assert field.values == values == typing.get_args(kind)


def test_only_string_fields_are_enumerated() -> None:
    assert all(field.type == "string" for field in EVENT_FIELDS if field.values)
    assert {field.type for field in EVENT_FIELDS} <= set(typing.get_args(eventlog.JsonType))


def test_a_field_is_not_nullable_unless_said() -> None:
    assert EventField("x", "integer") == EventField("x", "integer", nullable=False, values=())


def test_file_names_match_the_glob() -> None:
    assert fnmatch("events-20261121T091500123456Z.ndjson", eventlog.FILE_GLOB)
    assert not fnmatch("events-20261121T091500123456Z.ndjson.tmp", eventlog.FILE_GLOB)
    assert eventlog.FILES_DIRECTORY == "events"
    assert eventlog.STREAM_KEY == "asbp:events" and eventlog.STREAM_FIELD == b"e"

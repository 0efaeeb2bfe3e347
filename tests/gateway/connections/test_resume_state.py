"""The record a resumable Channel keeps beside its log (gateway.connections.resume_state)."""

from __future__ import annotations

import json

import pytest

from gateway.connections.resume_state import KeptSubject, KeptSubscription, ResumeRecord


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


def test_subjects_and_their_home_read_back() -> None:
    alice = KeptSubject("a" * 32, ("news",), ("clerk",), "alice*bus", ("broker-a", "broker-b"))
    bob = KeptSubject("b" * 32, ("news", "mail"), (), None, ())
    record = ResumeRecord.of({"room"}, "broker-a", [bob, alice])
    assert record.subjects == (alice, bob)
    assert ResumeRecord.decode(record.encode()) == record


@pytest.mark.parametrize(
    "subject",
    [
        "not a table",
        {"s": 3, "agents": [], "roles": [], "at": []},
        {"s": "x", "agents": "news", "roles": [], "at": []},
        {"s": "x", "agents": [], "roles": [], "at": [], "p": 7},
    ],
)
def test_unreadable_subjects_are_left_out(subject: object) -> None:
    data = json.dumps({"groups": ["room"], "home": "b", "subjects": [subject]}).encode()
    assert ResumeRecord.decode(data) == ResumeRecord(("room",), "b")


def test_a_home_that_is_not_text_makes_the_record_unreadable() -> None:
    assert ResumeRecord.decode(b'{"groups": [], "home": 3}') == ResumeRecord()


def test_subscriptions_and_where_they_are_parked_read_back_in_order() -> None:
    pattern = KeptSubscription("TOPIC", "/news/.*")
    queue = KeptSubscription("QUEUE", "jobs", "s" * 32)
    record = ResumeRecord.of({"room"}, subscriptions=[queue, pattern], parked="broker-a")
    assert record.subscriptions == (queue, pattern)  # the order made, not sorted
    assert ResumeRecord.decode(record.encode()) == record


@pytest.mark.parametrize(
    "subscription",
    ["not a table", {"t": "TOPIC"}, {"t": 3, "n": "/x"}, {"n": "/x"}],
)
def test_unreadable_subscriptions_are_left_out(subscription: object) -> None:
    kept = {"t": "TOPIC", "n": "/kept", "s": 5}  # a Subject that is not text: none
    data = json.dumps({"groups": [], "subscriptions": [subscription, kept], "parked": "b"}).encode()
    assert ResumeRecord.decode(data) == ResumeRecord(
        subscriptions=(KeptSubscription("TOPIC", "/kept"),), parked="b"
    )


def test_a_parked_broker_that_is_not_text_counts_as_none() -> None:
    data = b'{"groups": [], "subscriptions": "x", "parked": 3}'
    assert ResumeRecord.decode(data) == ResumeRecord()


def test_how_the_client_counts_reads_back_and_is_left_out_when_it_counts_everything() -> None:
    record = ResumeRecord.of({"room"}, count=2)
    assert json.loads(record.encode())["count"] == 2
    assert ResumeRecord.decode(record.encode()) == record
    # Every frame counted (a client that declared nothing): the record says nothing,
    # as one written before ``count`` existed.
    assert "count" not in json.loads(ResumeRecord.of({"room"}).encode())
    assert ResumeRecord.decode(b'{"groups": []}').count == 1


@pytest.mark.parametrize("count", ["2", True, None, 2.0])
def test_a_count_that_is_not_a_whole_number_counts_as_1(count: object) -> None:
    data = json.dumps({"groups": ["room"], "count": count}).encode()
    assert ResumeRecord.decode(data) == ResumeRecord.of({"room"})

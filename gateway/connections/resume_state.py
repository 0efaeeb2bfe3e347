"""What a resumable WebSocket Channel takes with it to the broker it resumes on.

A Channel's groups, Subjects and subscriptions are broker state
(``ChannelRegistry``, ``SubjectRegistry``, gateway.messaging); a Channel that
resumes on another broker, or on this one after its connection dropped, would
lose them. So every change to a resumable Channel's groups, its signed-in
Subjects or its topic and queue subscriptions rewrites a small record kept
beside its Channel log in the routing plane (``ChannelLog.keep``: on Redis a
field of the log's meta hash, so it expires and is dropped with the log, never
outliving it). The broker the Channel resumes on reads it (``ChannelLog.kept``),
joins the Channel to those groups, takes its Subjects over and subscribes it
again before ``asbp.resumed`` is written (gateway.connections.resume,
gateway.routing.resume_subjects, gateway.messaging.service).

The record is JSON, written whole each time: a Channel's groups and Subjects
are few and change rarely, and a whole record needs no ordering between
brokers beyond the plane's own (one holder writes at a time). It holds no
secret: a Subject's ``s`` is not one (knowing it never lets anyone act as its
owner), and the record is read only after the resuming client's Channel secret
matched. An unreadable record counts as empty: the Channel resumes without
groups or Subjects rather than not at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["KeptSubject", "KeptSubscription", "ResumeRecord"]


@dataclass(frozen=True, slots=True)
class KeptSubject:
    """A Subject signed in on the Channel, as the broker it resumes on needs it."""

    #: Its Subject-Identifier ``s`` (unchanged across the resume).
    id: str
    #: The Application-Agents that authenticated it.
    agents: tuple[str, ...]
    #: The roles they gave it.
    roles: tuple[str, ...]
    #: Its Conversation-Address ``p``, if it has one.
    address: str | None
    #: The brokers whose agents authenticated it (where its Commands go).
    at: tuple[str, ...]

    def encode(self) -> dict[str, Any]:
        return {
            "s": self.id,
            "agents": list(self.agents),
            "roles": list(self.roles),
            "p": self.address,
            "at": list(self.at),
        }

    @classmethod
    def decode(cls, found: object) -> KeptSubject | None:
        if not isinstance(found, dict):
            return None
        subject_id, address = found.get("s"), found.get("p")
        lists = [found.get(key) for key in ("agents", "roles", "at")]
        if not isinstance(subject_id, str) or not (address is None or isinstance(address, str)):
            return None
        if not all(isinstance(items, list) for items in lists):
            return None
        agents, roles, at = (
            tuple(item for item in items if isinstance(item, str))  # type: ignore[union-attr]  # checked
            for items in lists
        )
        return cls(subject_id, agents, roles, address, at)


@dataclass(frozen=True, slots=True)
class KeptSubscription:
    """A topic or queue subscription of the Channel (``asbp.subscribe``)."""

    #: TOPIC, QUEUE or VIRTUAL_QUEUE (the ``type`` it was subscribed with).
    type: str
    #: The topic, topic pattern, queue or ``name@pattern``, as subscribed.
    name: str
    #: The Subject whose access it was made with (its ``s``), if any.
    subject: str | None = None

    def encode(self) -> dict[str, Any]:
        found: dict[str, Any] = {"t": self.type, "n": self.name}
        if self.subject is not None:
            found["s"] = self.subject
        return found

    @classmethod
    def decode(cls, found: object) -> KeptSubscription | None:
        if not isinstance(found, dict):
            return None
        kind, name, subject = found.get("t"), found.get("n"), found.get("s")
        if not isinstance(kind, str) or not isinstance(name, str):
            return None
        return cls(kind, name, subject if isinstance(subject, str) else None)


@dataclass(frozen=True, slots=True)
class ResumeRecord:
    """The part of a Channel's broker state that follows it when it resumes."""

    #: The groups (``asbp.join``) it belonged to.
    groups: tuple[str, ...] = ()
    #: The broker where its Subjects live now ('' none): told when it resumes elsewhere.
    home: str = ""
    #: Its signed-in Subjects.
    subjects: tuple[KeptSubject, ...] = ()
    #: Its topic and queue subscriptions, in the order made.
    subscriptions: tuple[KeptSubscription, ...] = ()
    #: The broker whose topic subscriptions feed its log while it is away ('' none):
    #: told when it resumes elsewhere, so that they end there.
    parked: str = ""
    #: How its client counts frames (``count`` of ``/asbp``: Channel.count), fixed
    #: when it opened: every broker it resumes on must log what that client counts.
    count: int = 1

    @classmethod
    def of(
        cls,
        groups: Iterable[str],
        home: str = "",
        subjects: Iterable[KeptSubject] = (),
        subscriptions: Iterable[KeptSubscription] = (),
        parked: str = "",
        count: int = 1,
    ) -> ResumeRecord:
        return cls(
            tuple(sorted(groups)),
            home,
            tuple(sorted(subjects, key=lambda s: s.id)),
            tuple(subscriptions),
            parked,
            count,
        )

    def encode(self) -> bytes:
        found: dict[str, Any] = {"groups": list(self.groups)}
        if self.home:
            found["home"] = self.home
        if self.subjects:
            found["subjects"] = [subject.encode() for subject in self.subjects]
        if self.subscriptions:
            found["subscriptions"] = [entry.encode() for entry in self.subscriptions]
        if self.parked:
            found["parked"] = self.parked
        if self.count != 1:
            found["count"] = self.count
        return json.dumps(found, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> ResumeRecord:
        """The record ``data`` holds; empty when there is none or it is unreadable."""
        if not data:
            return cls()
        try:
            found = json.loads(data)
        except ValueError:
            return cls()
        if not isinstance(found, dict):
            return cls()
        groups, home, subjects = found.get("groups"), found.get("home", ""), found.get("subjects")
        if not isinstance(groups, list) or not isinstance(home, str):
            return cls()
        kept = (
            [KeptSubject.decode(item) for item in subjects or ()]
            if isinstance(subjects, list)
            else []
        )
        listed = found.get("subscriptions")
        subscriptions = (
            [KeptSubscription.decode(item) for item in listed] if isinstance(listed, list) else []
        )
        parked = found.get("parked", "")
        count = found.get("count", 1)
        return cls(
            tuple(g for g in groups if isinstance(g, str)),
            home,
            tuple(subject for subject in kept if subject is not None),
            tuple(entry for entry in subscriptions if entry is not None),
            parked if isinstance(parked, str) else "",
            # Only a broker wrote it; anything but a whole number counts as 1.
            count if isinstance(count, int) and not isinstance(count, bool) else 1,
        )

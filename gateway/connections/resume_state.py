"""What a resumable WebSocket Channel takes with it to the broker it resumes on.

A Channel's groups are broker state (``ChannelRegistry``); a Channel that
resumes on another broker, or on this one after its connection dropped, would
lose them. So every change to a resumable Channel's groups rewrites a small
record kept beside its Channel log in the routing plane (``ChannelLog.keep``:
on Redis a field of the log's meta hash, so it expires and is dropped with the
log, never outliving it). The broker the Channel resumes on reads it
(``ChannelLog.kept``) and joins the Channel to those groups again before
``asbp.resumed`` is written, so a group Command routed after the client
hears ``asbp.resumed`` reaches it.

The record is JSON (``{"groups": [...]}``), written whole each time: a
Channel's groups are few and change rarely, and a whole record needs no
ordering between brokers beyond the plane's own (one holder writes at a time).
An unreadable record counts as empty: the Channel resumes without groups
rather than not at all.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ResumeRecord"]


@dataclass(frozen=True, slots=True)
class ResumeRecord:
    """The part of a Channel's broker state that follows it when it resumes."""

    #: The groups (``asbp.join``) it belonged to.
    groups: tuple[str, ...] = ()

    @classmethod
    def of(cls, groups: Iterable[str]) -> ResumeRecord:
        return cls(tuple(sorted(groups)))

    def encode(self) -> bytes:
        return json.dumps({"groups": list(self.groups)}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> ResumeRecord:
        """The record ``data`` holds; empty when there is none or it is unreadable."""
        if not data:
            return cls()
        try:
            found = json.loads(data)
        except ValueError:
            return cls()
        groups = found.get("groups") if isinstance(found, dict) else None
        if not isinstance(groups, list):
            return cls()
        return cls(tuple(g for g in groups if isinstance(g, str)))

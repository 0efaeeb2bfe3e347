"""Subjects that follow a WebSocket Channel when it resumes (docs/protocol.md,
"Resuming a Channel").

Theory of operation
-------------------
A Subject belongs to its Channel (only that Channel may use its ``s``). When
the connection of a Channel that can resume drops, its signed-in Subjects do
not end: they *wait* here, still in the ``SubjectRegistry`` under the
Channel's ``i`` but bound to the closed Channel, so no connection can use them
(``Authenticator.resolve`` wants the very Channel object). Their agents are
not told anything.

- The Channel resumes **at this broker** (:meth:`ResumeSubjects.resumed_here`):
  each waiting Subject is bound to the resumed Channel; nothing else changes.
- It resumes **at another broker**, which takes them over from the record kept
  beside the Channel's log (gateway.connections.resume_state: ``s``, the
  agents that authenticated it, its roles, its address, and the brokers whose
  agents did, ``at``; :meth:`ResumeSubjects.restore`) and tells this broker
  (the ``RESUMED`` envelope; :meth:`ResumeSubjects.handed_over`). This broker
  then forgets them without a word to their agents, keeping only, as a
  *guest* of the new broker (gateway.routing.remote_subjects), which of its
  agents authenticated each, so that they hear its end from there.
- It never resumes: once ``log_max_age`` has passed since the connection
  dropped, they end as they would have at once (the agents hear
  ``asbp.subject.ended``), and the record is rewritten without them, so a
  resume after that (the log renewed by what was routed to the Channel
  meanwhile) does not bring back Subjects whose agents were told they ended.

Only a resume, which presents the Channel's secret, binds them to a
connection again: knowing ``i`` and ``s`` is never enough.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from asbp import ApplicationAgentId, SubjectId
from gateway.connections.channels import Channel
from gateway.connections.resume import HeldOutbox
from gateway.connections.resume_state import KeptSubject
from gateway.connections.subjects import Subject, SubjectState

if TYPE_CHECKING:
    from gateway.routing.subject_auth import Authenticator

__all__ = ["ResumeSubjects"]


class ResumeSubjects:
    """One broker's Subjects of resumable Channels; see the module docstring.

    Args:
        auth: the broker's Authenticator (its registry and its bus exchange).
        broker_id: this broker.
        wait: how long Subjects wait for their Channel (the log's ``log_max_age``).
        clock: monotonic seconds.
        changed: rewrites a Channel's record (gateway.connections.resume).
        forgotten: called with ``i`` once some of its waiting Subjects ended, to
            drop them from the record.
    """

    def __init__(
        self,
        auth: Authenticator,
        *,
        broker_id: str,
        wait: float,
        clock: Callable[[], float],
        changed: Callable[[Channel], object],
        forgotten: Callable[[str], object],
        log: logging.Logger,
    ) -> None:
        self._auth = auth
        self._broker_id = broker_id
        self._wait = wait
        self._clock = clock
        self._changed = changed
        self._forgotten = forgotten
        self._log = log
        #: ``i`` of a dropped Channel with waiting Subjects -> when they end.
        self._waiting: dict[str, float] = {}

    # -- the Authenticator's side (gateway.types.SubjectResume) --------------------

    def parks(self, channel: Channel) -> bool:
        outbox = channel.outbox
        if not isinstance(outbox, HeldOutbox) or not outbox.released:
            return False
        if any(
            subject.state is SubjectState.AUTHENTICATED
            for subject in self._auth.subjects.on_channel(channel)
        ):
            self._waiting[channel.id] = self._clock() + self._wait
        return True

    def changed(self, channel: Channel) -> None:
        if channel.closed:
            # A waiting Subject ended (an operator ended it): out of the record too,
            # so a resume does not bring it back.
            self._forgotten(channel.id)
            return
        self._changed(channel)

    def expired(self, now: float) -> list[Subject]:
        late = [channel_id for channel_id, deadline in self._waiting.items() if deadline <= now]
        ended: list[Subject] = []
        for channel_id in late:
            del self._waiting[channel_id]
            ended.extend(self._auth.subjects.on_channel_id(channel_id))
            self._forgotten(channel_id)
        return ended

    # -- the resume's side -----------------------------------------------------------

    def kept(self, channel: Channel) -> list[KeptSubject]:
        """``channel``'s signed-in Subjects, for its record."""
        me = self._broker_id
        return [
            KeptSubject(
                subject.id,
                tuple(sorted(subject.authenticated_by)),
                tuple(sorted(subject.roles)),
                subject.address,
                tuple(sorted(subject.serving_brokers | ({me} if subject.local_agents else set()))),
            )
            for subject in self._auth.subjects.on_channel(channel)
            if subject.state is SubjectState.AUTHENTICATED
        ]

    def resumed_here(self, channel: Channel) -> bool:
        """``channel`` resumed at the broker its Subjects wait at: bound to it again."""
        if self._waiting.pop(channel.id, None) is None:
            return False
        for subject in self._auth.subjects.on_channel_id(channel.id):
            subject.channel = channel
            subject.access = replace(channel.access, roles=subject.roles, subject_id=subject.id)
        return True

    def restore(self, channel: Channel, kept: tuple[KeptSubject, ...]) -> int:
        """``channel`` resumed here from another broker: its Subjects, from its record."""
        me = self._broker_id
        registry = self._auth.subjects
        bus = self._auth.bus
        restored = 0
        for entry in kept:
            if registry.get(entry.id) is not None:
                continue  # pragma: no cover - held here already: resumed_here took those
            others = set(entry.at) - {me}
            subject = Subject(
                SubjectId(entry.id),
                channel,
                None,
                0.0,
                state=SubjectState.AUTHENTICATED,
                authenticated_by={ApplicationAgentId(agent) for agent in entry.agents},
                roles=frozenset(entry.roles),
                brokers=set(others),
                reported=set(others),
                serving_brokers=set(others),
            )
            subject.access = replace(channel.access, roles=subject.roles, subject_id=subject.id)
            if me in entry.at:
                subject.local_agents = (
                    bus.take_guest(entry.id) if bus is not None else set(subject.authenticated_by)
                )
            registry.restore(subject)
            if entry.address is not None:
                registry.set_address(subject, entry.address)
            restored += 1
        return restored

    def handed_over(self, channel_id: str, to: str) -> None:
        """The Channel resumed at broker ``to``, which took its Subjects over."""
        self._waiting.pop(channel_id, None)
        bus = self._auth.bus
        for subject in self._auth.subjects.on_channel_id(channel_id):
            if bus is not None and subject.local_agents:
                bus.adopt_guest(subject.id, to, subject.local_agents)
            self._auth.subjects.end(subject)
            self._log.info("subject.moved", extra={"subject": subject.id, "broker": to})

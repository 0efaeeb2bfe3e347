"""Subjects: signed-in accounts on a Channel, several per Channel (§7.3).

§7.3: "Brokers and Broker-Agents MUST allow multiple Subjects to
authenticate from a single User-Agent." A Subject starts when a User-Agent
sends the Authenticate-Command: the broker mints a Subject-Identifier ``s``
(a uuid4 as 32 hex digits, unique at this broker) and asks each
Application-Agent that serves the Authenticate-Command, once per identity.
The Subject is authenticated when the first of them answers
``asbp.authenticated``; it fails when every one asked has answered
``asbp.refused`` or left, or when the Respondent timeout passes.

A Subject belongs to the Channel it was created on, and only that Channel
may use its ``s`` (fault 3201 otherwise). The broker remembers which agents
authenticated it; "The Broker MUST only submit Commands to
Application-Agents that have authenticated the Subject for subsequent
Authenticated-Commands." It ends on ``asbp.logout``, when its Channel closes
(an HTTP Channel's idle expiry included; a WebSocket Channel that can resume
takes its Subjects with it instead, gateway.routing.resume_subjects), and the
agents that authenticated it hear ``asbp.subject.ended``.

The registry also finds Subjects by Conversation-Address (``p``, courses/):
each delivery of a Command addressed by ``r`` asks it, so it keeps an index
rather than scanning every Subject. When the first Subject at this broker takes
an address, or the last one holding it ends, it tells its ``AddressDirectory``
(the routing plane on a bus), so other brokers of the bus find the address here.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from asbp import ApplicationAgentId, SubjectId
from gateway.acl import AccessContext
from gateway.connections.channels import Channel

__all__ = ["AddressDirectory", "Subject", "SubjectRegistry", "SubjectState"]


class SubjectState(enum.Enum):
    """Where a Subject is in its life."""

    #: Agents were asked; none has said yes yet.
    PENDING = "pending"
    #: At least one agent authenticated it.
    AUTHENTICATED = "authenticated"
    #: Logged out, refused, timed out, or its Channel closed.
    ENDED = "ended"


@dataclass(eq=False, slots=True)
class Subject:
    """One Subject on one Channel."""

    #: The Subject-Identifier ``s``.
    id: SubjectId
    #: The only Channel that may use ``s``.
    channel: Channel
    #: ``u`` of the Authenticate-Command, for the answer to the User-Agent.
    command_id: int | None
    #: Monotonic time after which a pending Subject fails.
    deadline: float
    state: SubjectState = SubjectState.PENDING
    #: Tube id -> agent identity, for the agents asked that have not answered.
    asked: dict[str, ApplicationAgentId] = field(default_factory=dict)
    #: The Application-Agents that authenticated it.
    authenticated_by: set[ApplicationAgentId] = field(default_factory=set)
    #: The roles its agents gave it (for access control).
    roles: frozenset[str] = frozenset()
    #: Its Conversation-Address, if an agent gave one (``p``).
    address: str | None = None
    #: Why agents refused it, for the fault if all of them do.
    refusals: list[str] = field(default_factory=list)
    #: Its Channel's access context with its roles, once authenticated.
    access: AccessContext = field(default_factory=AccessContext)
    #: Other brokers of the bus whose agents were asked (gateway.routing.remote_subjects).
    brokers: set[str] = field(default_factory=set)
    #: Of those, the ones that said which agents they asked.
    reported: set[str] = field(default_factory=set)
    #: Of those, the ones whose agents authenticated it: where its Commands go.
    serving_brokers: set[str] = field(default_factory=set)
    #: The agents on this broker that authenticated it (when its Channel resumes at
    #: another broker, this one keeps telling them: gateway.routing.resume_subjects).
    local_agents: set[ApplicationAgentId] = field(default_factory=set)


class AddressDirectory(Protocol):
    """Where the bus learns which broker holds Subjects with an address
    (gateway.plane.base.Plane's address index)."""

    def address_held(self, address: str) -> None:
        """A Subject at this broker has ``address`` from now on (its first)."""
        ...

    def address_released(self, address: str) -> None:
        """No Subject at this broker has ``address`` any more."""
        ...


class SubjectRegistry:
    """Every live Subject at this broker.

    Args:
        directory: told when an address gains its first Subject here or loses its
            last; None: this broker is alone on its bus.
    """

    __slots__ = ("_by_address", "_by_channel", "_subjects", "directory")

    def __init__(self, directory: AddressDirectory | None = None) -> None:
        self._subjects: dict[SubjectId, Subject] = {}
        self._by_channel: dict[str, set[SubjectId]] = {}
        self._by_address: dict[str, list[Subject]] = {}
        #: Told when an address comes and goes here (the routing plane on a bus).
        self.directory = directory

    def __len__(self) -> int:
        return len(self._subjects)

    def __iter__(self) -> Iterator[Subject]:
        return iter(list(self._subjects.values()))

    def create(self, channel: Channel, command_id: int | None, deadline: float) -> Subject:
        """A new pending Subject on ``channel`` with a fresh Subject-Identifier."""
        while True:
            subject_id = SubjectId(uuid.uuid4().hex)
            if subject_id not in self._subjects:
                break
        subject = Subject(subject_id, channel, command_id, deadline)
        self._subjects[subject_id] = subject
        self._by_channel.setdefault(channel.id, set()).add(subject_id)
        return subject

    def restore(self, subject: Subject) -> None:
        """Hold here a Subject signed in before its Channel resumed at this broker
        (its ``s`` kept; gateway.routing.resume_subjects)."""
        self._subjects[subject.id] = subject
        self._by_channel.setdefault(subject.channel.id, set()).add(subject.id)

    def on_channel_id(self, channel_id: str) -> list[Subject]:
        """The live Subjects of the Channel ``channel_id`` (open or not)."""
        ids = self._by_channel.get(channel_id, ())
        return [self._subjects[i] for i in ids if i in self._subjects]

    def get(self, subject_id: str) -> Subject | None:
        """The live Subject with this identifier, or None."""
        return self._subjects.get(SubjectId(subject_id))

    def on_channel(self, channel: Channel) -> list[Subject]:
        """The live Subjects of ``channel``."""
        ids = self._by_channel.get(channel.id, ())
        return [self._subjects[i] for i in ids if i in self._subjects]

    def count(self, channel: Channel) -> int:
        """How many live Subjects ``channel`` has."""
        return len(self._by_channel.get(channel.id, ()))

    def set_address(self, subject: Subject, address: str) -> bool:
        """``subject`` is reachable as ``address`` (once: an address never changes).

        Returns:
            Whether the directory was told (the first Subject here with it).
        """
        if subject.address is not None or subject.id not in self._subjects:
            return False
        subject.address = address
        holders = self._by_address.setdefault(address, [])
        holders.append(subject)
        if len(holders) == 1 and self.directory is not None:
            self.directory.address_held(address)
            return True
        return False

    def holding(self, address: str) -> list[Subject]:
        """The authenticated Subjects at this broker reachable as ``address``."""
        return [
            subject
            for subject in self._by_address.get(address, ())
            if subject.state is SubjectState.AUTHENTICATED
        ]

    def end(self, subject: Subject) -> None:
        """Forget ``subject``."""
        subject.state = SubjectState.ENDED
        if self._subjects.pop(subject.id, None) is not None and subject.address is not None:
            holders = self._by_address.get(subject.address)
            if holders is not None and subject in holders:
                holders.remove(subject)
                if not holders:
                    del self._by_address[subject.address]
                    if self.directory is not None:
                        self.directory.address_released(subject.address)
        ids = self._by_channel.get(subject.channel.id)
        if ids is not None:
            ids.discard(subject.id)
            if not ids:
                del self._by_channel[subject.channel.id]

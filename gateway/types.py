"""Narrow protocols for the gateway's injected collaborators (as hypercorn/typing.py).

A collaborator is handed the few methods it calls, not the object that
happens to provide them: :class:`~gateway.routing.management.Management`
and :class:`~gateway.routing.subject_auth.Authenticator` send through
:class:`Replies`, the messaging built-ins through :class:`Outlets`, and the
router reaches topics and queues through :class:`MessagingHooks`. Each
names what the other side may rely on, and a test can hand in a real object
of its own that has just these methods.

::

    Router ──owns──► ReplySender (gateway.routing.replies): Replies, Outlets
      │                 ▲            ▲
      │                 │ Replies    │ Outlets
      │           Management,    Messaging (gateway.messaging)
      │           Authenticator      ▲
      └──────── MessagingHooks ──────┘
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from asbp import Command, FaultCode

if TYPE_CHECKING:
    from gateway.acl import AccessContext
    from gateway.connections.channels import Channel
    from gateway.connections.flow import FlowGate
    from gateway.connections.resume_state import KeptSubject
    from gateway.connections.subjects import Subject
    from gateway.connections.tubes import Tube
    from gateway.plane.base import Envelope

__all__ = [
    "AddressRoutes",
    "CourseStats",
    "Faults",
    "MessagingHooks",
    "Outlets",
    "RemembersOrigins",
    "Replies",
    "SubjectReplies",
    "SubjectResume",
    "TakesOrigins",
]


class Faults(Protocol):
    """Sends faults to Channels and Tubes."""

    def fault(
        self,
        channel: Channel,
        code: FaultCode,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None:
        """Send ``channel`` a fault (``command_id``: the ``u`` it answers)."""
        ...

    def fault_tube(
        self,
        tube: Tube,
        code: FaultCode,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None:
        """Send ``tube`` a fault."""
        ...


class Replies(Faults, Protocol):
    """Sends built-in answers: Commands to encode, and faults."""

    def send(self, channel: Channel, command: Command) -> None:
        """Encode ``command`` and leave it for ``channel``."""
        ...

    def send_tube(self, tube: Tube, command: Command) -> bool:
        """Encode ``command`` and leave it for ``tube``; False if it was too slow."""
        ...


class Outlets(Faults, Protocol):
    """Leaves frames encoded already (once for many receivers) in outboxes, and faults."""

    def deliver(self, channel: Channel, frame: bytes) -> None:
        """Leave an encoded Command for ``channel``; a full outbox closes it."""
        ...

    def deliver_delivery(self, channel: Channel, frame: bytes) -> None:
        """Leave a queue delivery for ``channel``, never logged for resume (the
        queue is its log); a full outbox closes it."""
        ...

    def send_tube_frame(self, tube: Tube, frame: bytes) -> bool:
        """Leave an encoded Command for ``tube``; False if it was too slow."""
        ...


class SubjectReplies(Replies, Protocol):
    """What Subject authentication sends: answers, faults, and one encoded frame
    (the credentials) to each agent asked."""

    def send_tube_frame(self, tube: Tube, frame: bytes) -> bool:
        """Leave an encoded Command for ``tube``; False if it was too slow."""
        ...


class MessagingHooks(Protocol):
    """What the router asks of topics and queues (gateway.messaging.Messaging)."""

    def channel_command(
        self, channel: Channel, access: AccessContext, command: Command, name: str
    ) -> None:
        """A messaging built-in (asbp.names.MESSAGING) from a User-Agent, sent
        with ``access`` (the Channel's, or its Subject's when ``s`` names one)."""
        ...

    def tube_command(self, tube: Tube, command: Command, name: str) -> None:
        """A messaging built-in from an Application-Agent."""
        ...

    def channel_closed(self, channel: Channel) -> None:
        """A Channel closed: its subscriptions end, its leases are released."""
        ...

    def tube_closed(self, tube: Tube) -> None:
        """A Tube closed: likewise."""
        ...

    def fault_sent(
        self, code: FaultCode, message: str, *, cause: str | None, agent: str | None
    ) -> None:
        """The broker sent a fault (recorded on ``/system/faults/<broker>``)."""
        ...


class CourseStats(Protocol):
    """What the metrics read of the Courses (courses.service.Courses)."""

    #: Crossings from peers accepted, dropped as repeats, dropped as spoofed.
    accepted: int
    duplicates: int
    spoofed: int

    def peers(self) -> Iterable[tuple[str, bool, int, int, int]]:
        """Per peer dialled: (domain, up, queued, sent, acknowledged)."""
        ...


class AddressRoutes(Protocol):
    """Where a User-Agent Command addressed by ``r`` goes (courses.service.Courses):
    to the Subjects holding those Conversation-Addresses, here or on other buses."""

    def route(
        self,
        channel: Channel,
        subject: Subject | None,
        command: Command,
        frame: bytes | None = None,
    ) -> None:
        """Deliver or queue ``command`` for each recipient; faults go to ``channel``.
        ``frame``: the bytes ``command`` arrived in, to splice crossings from."""
        ...

    def route_for_agent(self, tube: Tube, subject: Subject | None, command: Command) -> None:
        """The same from an agent for a Subject it signed in; faults go to ``tube``."""
        ...

    def route_for(
        self,
        subject: Subject,
        command: Command,
        refuse: Callable[[FaultCode, str], None],
    ) -> None:
        """The same for ``subject``, its faults to ``refuse`` (an agent elsewhere)."""
        ...

    def forwarded(self, envelope: Envelope) -> None:
        """An ADDRESSED envelope from another broker of the bus: to the Subjects here."""
        ...


class RemembersOrigins(Protocol):
    """Where publishing notes which local publisher a topic message came from
    (gateway.connections.flow.TopicOrigins, as the messaging dispatcher sees it)."""

    def remember(self, message_id: str, gate: FlowGate) -> None:
        """``gate``'s connection published ``message_id``: pending until delivered."""
        ...


class TakesOrigins(Protocol):
    """Where topic delivery finds the local publisher to hold back
    (gateway.connections.flow.TopicOrigins, as the subscribers see it)."""

    def take(self, message_id: str) -> FlowGate | None:
        """The gate of ``message_id``'s local publisher, if any, forgotten once asked."""
        ...


class SubjectResume(Protocol):
    """How Subjects follow a Channel that resumes (gateway.routing.resume_subjects,
    as the Authenticator sees it)."""

    def parks(self, channel: Channel) -> bool:
        """Whether ``channel``, closing now, can resume: its Subjects then wait for it."""
        ...

    def changed(self, channel: Channel) -> None:
        """A Subject of ``channel`` was signed in, given roles, or ended."""
        ...

    def expired(self, now: float) -> list[Subject]:
        """The Subjects that waited for their Channel past its log's lifetime (to end)."""
        ...

    def kept(self, channel: Channel) -> list[KeptSubject]:
        """``channel``'s signed-in Subjects, as its record keeps them."""
        ...

    def restore(self, channel: Channel, kept: tuple[KeptSubject, ...]) -> int:
        """Take over ``channel``'s Subjects from its record (another broker signed
        them in); how many."""
        ...

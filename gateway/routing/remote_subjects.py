"""Subjects across brokers: signing in reaches the agents on every broker of the bus.

The Subject lives at the User-Agent's broker (A), which minted ``s`` and checks
it on every Authenticated-Command, as at one broker. What crosses the bus:

::

    A                                    B (Tubes serving the Authenticate-Command)
    SUBJECT_ASK  s, the frame  ───────►  one Tube per agent identity gets the frame;
                                         B remembers s as a *guest*: who it asked
                 ◄─────── SUBJECT_ASKED  s, Tube id and agent of each asked (maybe none)
                 ◄────── SUBJECT_ANSWER  an agent's asbp.authenticated / asbp.refused
                                         (B acknowledges it to the agent), or a refusal
                                         "the agent left" when an asked Tube closes
    SUBJECT_END  s, the notice ───────►  to the Tubes of the agents that authenticated it

A counts a broker's agents as asked from the moment the forward is placed (a
placeholder ``@<broker>``) until that broker reports them, so the Subject
fails (3101) only once every agent on every broker refused or left; one that
never answers is the Respondent timeout (2103), as at one broker. Its later
Authenticated-Commands go to a broker whose agents authenticated it, and
there only to those agents (gateway.routing.remote).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import asbp
from asbp import ApplicationAgentId, Command, ProtocolError, SubjectId
from asbp.names import ACCEPTED, REFUSED
from gateway.connections.subjects import Subject
from gateway.connections.tubes import RespondentTable, Tube
from gateway.plane.base import Envelope, EnvelopeKind, Plane
from gateway.types import SubjectReplies

if TYPE_CHECKING:
    from gateway.routing.subject_auth import Authenticator

__all__ = ["RemoteSubjects"]

#: Subjects of other brokers this broker remembers at most (oldest go first).
MAX_GUESTS: Final = 65_536


@dataclass(eq=False, slots=True)
class _Guest:
    """A Subject of another broker that this broker's agents were asked about."""

    origin: str
    #: Tube id -> agent, for those asked that have not answered.
    asked: dict[str, ApplicationAgentId] = field(default_factory=dict)
    #: The agents here that authenticated it.
    authenticated: set[ApplicationAgentId] = field(default_factory=set)


class RemoteSubjects:
    """The Subject exchange across brokers; see the module docstring."""

    def __init__(
        self,
        plane: Plane,
        *,
        respondents: RespondentTable,
        replies: SubjectReplies,
        limits: asbp.Limits,
        log: logging.Logger,
    ) -> None:
        self._plane = plane
        self._respondents = respondents
        self._replies = replies
        self._limits = limits
        self._log = log
        self._auth: Authenticator | None = None
        self._guests: OrderedDict[str, _Guest] = OrderedDict()

    def attach(self, auth: Authenticator) -> None:
        """The Authenticator whose Subjects these are."""
        self._auth = auth
        auth.bus = self

    # -- at the User-Agent's broker ----------------------------------------------

    def ask(self, subject: Subject, name: str, frame: bytes) -> None:
        """Ask the agents serving ``name`` on every other broker about ``subject``."""
        envelope = Envelope(EnvelopeKind.SUBJECT_ASK, self._plane.broker_id, subject.id, frame)
        placed = self._plane.forward_to_servers(name, envelope)

        def asked(future: object) -> None:
            assert placed.done()
            error = None if placed.cancelled() else placed.exception()
            targets = () if error is not None or placed.cancelled() else placed.result()
            if error is not None:
                self._log.warning("subject.bus_unreachable", extra={"error": str(error)})
            subject.asked.pop("@", None)  # the bus as a whole: placed now
            for broker_id in targets:
                subject.brokers.add(broker_id)
                if broker_id not in subject.reported:
                    subject.asked["@" + broker_id] = ApplicationAgentId("")
            assert self._auth is not None
            self._auth.settle(subject)

        placed.add_done_callback(asked)

    def ended(self, subject: Subject, notice: Command) -> None:
        """``subject`` ended: the brokers whose agents knew it tell them."""
        if not subject.brokers:
            return
        frame = asbp.encode(notice)
        origin = self._plane.broker_id
        for broker_id in sorted(subject.brokers):
            self._plane.send_to(
                broker_id, Envelope(EnvelopeKind.SUBJECT_END, origin, subject.id, frame)
            )

    # -- a Channel that resumed at another broker (gateway.routing.resume_subjects) --

    def adopt_guest(self, subject_id: str, origin: str, agents: set[ApplicationAgentId]) -> None:
        """``subject_id`` now lives at ``origin`` (its Channel resumed there): the
        agents here that authenticated it hear of its end from there."""
        self._guests[subject_id] = _Guest(origin, authenticated=set(agents))
        while len(self._guests) > MAX_GUESTS:
            self._guests.popitem(last=False)

    def take_guest(self, subject_id: str) -> set[ApplicationAgentId]:
        """``subject_id``'s Channel resumed here: the agents here that authenticated
        it, no longer a guest's."""
        guest = self._guests.pop(subject_id, None)
        return set() if guest is None else guest.authenticated

    # -- envelopes ---------------------------------------------------------------

    def inbound(self, envelope: Envelope) -> None:
        """A Subject envelope from another broker."""
        kind = envelope.kind
        if kind is EnvelopeKind.SUBJECT_ASK:
            self._asked_here(envelope)
        elif kind is EnvelopeKind.SUBJECT_END:
            self._end_here(envelope)
        elif kind is EnvelopeKind.END_SUBJECT:
            self._ended_by_operator(envelope)
        else:
            self._at_origin(envelope)

    def _ended_by_operator(self, envelope: Envelope) -> None:
        """An operator at ``origin`` ends ``s``: every broker was asked, the one
        where it lives ends it as its own management API would."""
        auth = self._auth
        subject = auth.subjects.get(envelope.channel) if auth is not None else None
        if auth is None or subject is None:
            return  # it lives at another broker, or is gone already
        self._log.warning(
            "management.write",
            extra={
                "action": "subject.end",
                "principal": envelope.among[0] if envelope.among else "",
                "subject": subject.id,
                "via": envelope.origin,
            },
        )
        auth.end(subject, "ended by an operator")

    def _asked_here(self, envelope: Envelope) -> None:
        auth = self._auth
        tubes = self._respondents.one_per_agent(auth.command_name) if auth is not None else []
        guest = _Guest(envelope.origin, {tube.id: tube.agent_id for tube in tubes})
        self._guests[envelope.channel] = guest
        while len(self._guests) > MAX_GUESTS:
            self._guests.popitem(last=False)
        report = tuple(item for tube in tubes for item in (tube.id, tube.agent_id))
        self._plane.send_to(
            envelope.origin,
            Envelope(
                EnvelopeKind.SUBJECT_ASKED,
                self._plane.broker_id,
                envelope.channel,
                b"",
                report,
            ),
        )
        for tube in tubes:
            self._replies.send_tube_frame(tube, envelope.frame)

    def _end_here(self, envelope: Envelope) -> None:
        guest = self._guests.pop(envelope.channel, None)
        if guest is None or not guest.authenticated:
            return
        for tube in self._respondents.of_agents(guest.authenticated):
            self._replies.send_tube_frame(tube, envelope.frame)

    def _at_origin(self, envelope: Envelope) -> None:
        auth = self._auth
        subject = auth.subjects.get(SubjectId(envelope.channel)) if auth is not None else None
        if auth is None or subject is None:
            return  # ended meanwhile: the agents heard, or hear, that it ended
        broker_id = envelope.origin
        if envelope.kind is EnvelopeKind.SUBJECT_ASKED:
            subject.reported.add(broker_id)
            subject.brokers.add(broker_id)
            subject.asked.pop("@" + broker_id, None)
            pairs = envelope.among
            for tube_id, agent in zip(pairs[::2], pairs[1::2], strict=True):
                subject.asked[f"{broker_id}/{tube_id}"] = ApplicationAgentId(agent)
            auth.settle(subject)
            return
        tube_id, agent = envelope.among
        try:
            command = asbp.decode(envelope.frame, limits=self._limits)
        except ProtocolError as exc:
            self._log.warning("plane.bad_envelope", extra={"error": exc.message})
            return
        if command.name != REFUSED:
            subject.serving_brokers.add(broker_id)
        auth.remote_answer(subject, f"{broker_id}/{tube_id}", ApplicationAgentId(agent), command)

    # -- at an agent's broker ------------------------------------------------------

    def answer(self, tube: Tube, command: Command, name: str) -> bool:
        """An agent here answered about a guest Subject: to its broker, acknowledged
        here. False when ``s`` is no guest this Tube's agent was asked about."""
        subject_id = command.subject_id
        if subject_id is None:
            return False
        guest = self._guests.get(subject_id)
        if guest is None or (
            tube.id not in guest.asked and tube.agent_id not in guest.authenticated
        ):
            return False
        guest.asked.pop(tube.id, None)
        if name != REFUSED:
            guest.authenticated.add(tube.agent_id)
        self._to_origin(guest, subject_id, tube, asbp.encode(command))
        if command.command_id is not None:
            self._replies.send_tube(
                tube, Command(c=ACCEPTED, cause=name, s=subject_id, u=command.command_id)
            )
        return True

    def tube_closed(self, tube: Tube) -> None:
        """A Tube asked about guest Subjects left: a refusal for each."""
        for subject_id, guest in self._guests.items():
            if guest.asked.pop(tube.id, None) is not None:
                refusal = Command({"c": REFUSED, "s": subject_id}, b"the agent left")
                self._to_origin(guest, subject_id, tube, asbp.encode(refusal))

    def broker_lost(self, broker_id: str) -> None:
        """``broker_id`` is gone: its guests here that no agent here authenticated
        (nobody will answer for them), and its agents for the Subjects here, which
        count as having left.

        A guest that agents here authenticated stays (within :data:`MAX_GUESTS`):
        a home that stopped handed its HTTP Channels' Subjects to the brokers that
        take the Channels over, and the new home ends them with ``SUBJECT_END`` as
        the old one would have (gateway.routing.http_bus)."""
        for subject_id in [
            s for s, g in self._guests.items() if g.origin == broker_id and not g.authenticated
        ]:
            del self._guests[subject_id]
        auth = self._auth
        if auth is None:
            return
        for subject in list(auth.subjects):
            subject.serving_brokers.discard(broker_id)
            subject.brokers.discard(broker_id)
            stale = [
                key
                for key in subject.asked
                if key == "@" + broker_id or key.startswith(broker_id + "/")
            ]
            for key in stale:
                agent = subject.asked.pop(key) or "the agents"
                subject.refusals.append(f"{agent} at broker {broker_id}: the broker left")
            if stale:
                auth.settle(subject)

    def _to_origin(self, guest: _Guest, subject_id: str, tube: Tube, frame: bytes) -> None:
        self._plane.send_to(
            guest.origin,
            Envelope(
                EnvelopeKind.SUBJECT_ANSWER,
                self._plane.broker_id,
                subject_id,
                frame,
                (tube.id, tube.agent_id),
            ),
        )

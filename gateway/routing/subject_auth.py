"""Subject authentication (§7.3.1): the exchange between User-Agent, broker and agents.

::

    User-Agent                     Broker                         Application-Agent(s)
      c=<Authenticate-Command>,u=4;<credentials>
                          ─────►  mints s, adds s, i, b
                                  ──── one Tube per agent identity allowed to serve it ──►
                                                  ◄──── c=asbp.authenticated,s=…,roles=[…][,p=…]
                                                   or  c=asbp.refused,s=…;<reason>
      c=asbp.authenticated,s=…,u=4,roles=[…],a=…
                          ◄─────  (first success)
      or c=asbp.fault,code=3101,u=4;<reasons>   (every agent asked refused or left)
      or c=asbp.fault,code=2103,u=4;…           (no answer within the Respondent timeout)

Afterwards an Authenticated-Command carries ``s``: the broker checks that
``s`` belongs to the sending Channel (fault 3201 otherwise) and routes it
only among the agents that authenticated the Subject, always with ``s``.
``asbp.logout`` with ``s`` ends the Subject; so does closing the Channel.

The credentials travel only to agents allowed to serve the
Authenticate-Command (see gateway.auth.trust): a spoofing agent never sees them.

On a bus of brokers the agents of every broker are asked too, and answer
through theirs (gateway.routing.remote_subjects, ``bus``); the Subject stays
here, where its Channel is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import asbp
from asbp import ApplicationAgentId, Command, FaultCode, ProtocolError
from asbp.names import ACCEPTED, AUTHENTICATED, LOGOUT, REFUSED, SUBJECT_ENDED
from gateway.connections.channels import Channel
from gateway.connections.subjects import Subject, SubjectRegistry, SubjectState
from gateway.connections.tubes import RespondentTable, Tube
from gateway.types import SubjectReplies, SubjectResume

if TYPE_CHECKING:
    from gateway.routing.remote_subjects import RemoteSubjects

__all__ = ["Authenticator"]

#: Stands in ``Subject.asked`` for the brokers of the bus until the forward is placed.
_BUS_PENDING: Final = "@"


class Authenticator:
    """Runs the Authenticate-Command exchange and checks every ``s``.

    Args:
        replies: where answers, faults and the credentials go.
        respondents: the agents that serve the Authenticate-Command.
        broker_id: this broker, added as ``b`` to what the agents get.
        command_name: the Authenticate-Command.
        timeout: seconds the agents have to answer.
        max_per_channel: Subjects one Channel may hold.
        clock: monotonic seconds.
        log: the broker's logger.
    """

    def __init__(
        self,
        replies: SubjectReplies,
        *,
        respondents: RespondentTable,
        broker_id: str,
        command_name: str,
        timeout: float,
        max_per_channel: int,
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self.command_name = command_name
        self.subjects = SubjectRegistry()
        self._replies = replies
        self._respondents = respondents
        self._broker_id = broker_id
        self._timeout = timeout
        self._max_per_channel = max_per_channel
        self._clock = clock
        self._log = log
        #: The Subject exchange with other brokers; None when alone on the bus.
        self.bus: RemoteSubjects | None = None
        #: The plane's barrier (``Plane.written``) on a bus: a Subject's first answer
        #: waits for its address to be in the directory. None when alone.
        self.directory_written: Callable[[], asyncio.Future[None]] | None = None
        #: Subjects whose Channel can resume wait for it instead of ending, and
        #: follow it (gateway.routing.resume_subjects); None: they end with it.
        self.resumes: SubjectResume | None = None

    # -- from User-Agents ---------------------------------------------------

    def authenticate(self, channel: Channel, command: Command) -> None:
        """The Authenticate-Command arrived: mint ``s`` and ask the agents."""
        replies = self._replies
        command_id = command.command_id
        if self.subjects.count(channel) >= self._max_per_channel:
            replies.fault(
                channel,
                FaultCode.AUTHENTICATION_FAILED,
                f"a Channel may hold {self._max_per_channel} Subjects; log one out first",
                command_id=command_id,
                cause=self.command_name,
            )
            return
        tubes = self._respondents.one_per_agent(self.command_name)
        if not tubes and self.bus is None:
            replies.fault(
                channel,
                FaultCode.NO_RESPONDENT,
                f"no Command-Respondent serves {self.command_name!r}",
                command_id=command_id,
                cause=self.command_name,
            )
            return
        subject = self.subjects.create(channel, command_id, self._clock() + self._timeout)
        outbound = command.with_keys(s=subject.id, i=channel.id, b=self._broker_id)
        if "a" in outbound:
            outbound = outbound.without_keys("a")
        try:
            frame = asbp.encode(outbound)
        except ProtocolError as exc:
            self.subjects.end(subject)
            replies.fault(channel, exc.code, exc.message, command_id=command_id)
            return
        for tube in tubes:
            subject.asked[tube.id] = tube.agent_id
        if self.bus is not None:
            # Not failed before the bus says which brokers it asked (settle).
            subject.asked[_BUS_PENDING] = ApplicationAgentId("")
            self.bus.ask(subject, self.command_name, frame)
        self._log.info(
            "subject.authenticate",
            extra={
                "channel": channel.id,
                "subject": subject.id,
                "agents": sorted(a for a in subject.asked.values() if a),
            },
        )
        for tube in tubes:
            replies.send_tube_frame(tube, frame)

    def resolve(self, channel: Channel, command: Command) -> Subject | None:
        """The authenticated Subject named by ``s`` on ``channel``, or a fault (3201)."""
        subject_id = command.subject_id
        subject = self.subjects.get(subject_id) if subject_id is not None else None
        if (
            subject is None
            or subject.channel is not channel
            or subject.state is not SubjectState.AUTHENTICATED
        ):
            self._log.warning(
                "subject.refused",
                extra={"channel": channel.id, "subject": subject_id, "command": command.name},
            )
            self._replies.fault(
                channel,
                FaultCode.ACCESS_DENIED,
                "Subject-Identifier 's' does not belong to this Channel",
                command_id=command.command_id,
                cause=command.name,
            )
            return None
        return subject

    def logout(self, channel: Channel, command: Command) -> None:
        """``asbp.logout``: end the Channel's Subject ``s``."""
        subject_id = command.subject_id
        subject = self.subjects.get(subject_id) if subject_id is not None else None
        if subject is None or subject.channel is not channel:
            self._replies.fault(
                channel,
                FaultCode.ACCESS_DENIED,
                "Subject-Identifier 's' does not belong to this Channel",
                command_id=command.command_id,
                cause=LOGOUT,
            )
            return
        self.end(subject, "logout")
        reply = Command(c=ACCEPTED, cause=LOGOUT, s=subject.id)
        if command.command_id is not None:
            reply = reply.with_keys(u=command.command_id)
        self._replies.send(channel, reply)

    # -- from Application-Agents ---------------------------------------------

    def answer(self, tube: Tube, command: Command, name: str) -> None:
        """``asbp.authenticated`` or ``asbp.refused`` from an agent that was asked."""
        replies = self._replies
        subject_id = command.subject_id
        subject = self.subjects.get(subject_id) if subject_id is not None else None
        if subject is None and self.bus is not None and self.bus.answer(tube, command, name):
            return  # another broker's Subject: answered there
        if subject is None or (
            tube.id not in subject.asked and tube.agent_id not in subject.authenticated_by
        ):
            replies.fault_tube(
                tube,
                FaultCode.ACCESS_DENIED,
                "no Subject awaits this agent's answer under that 's'",
                command_id=command.command_id,
                cause=name,
            )
            return
        subject.asked.pop(tube.id, None)
        if name != REFUSED:
            subject.local_agents.add(tube.agent_id)
        if name == REFUSED:
            reason = command.body.decode("utf-8", "replace") or "refused"
            subject.refusals.append(f"{tube.agent_id}: {reason}")
            self._log.info(
                "subject.refused_by_agent",
                extra={"subject": subject.id, "agent": tube.agent_id, "reason": reason},
            )
            if subject.state is SubjectState.PENDING and not subject.asked:
                self._fail(subject, FaultCode.AUTHENTICATION_FAILED, "; ".join(subject.refusals))
        else:
            self._authenticated(tube.agent_id, subject, command)
        if command.command_id is not None:
            replies.send_tube(
                tube,
                Command(c=ACCEPTED, cause=name, s=subject.id, u=command.command_id),
            )

    def remote_answer(
        self, subject: Subject, asked: str, agent: ApplicationAgentId, command: Command
    ) -> None:
        """An agent on another broker answered (its broker acknowledged it there)."""
        if asked not in subject.asked and agent not in subject.authenticated_by:
            self._log.warning("subject.unasked_answer", extra={"subject": subject.id})
            return
        subject.asked.pop(asked, None)
        if command.name == REFUSED:
            reason = command.body.decode("utf-8", "replace") or "refused"
            subject.refusals.append(f"{agent}: {reason}")
            self.settle(subject)
        else:
            self._authenticated(agent, subject, command)

    def settle(self, subject: Subject) -> None:
        """Fail a pending Subject nobody is left to answer: 3101 with the refusals,
        or 2101 when no agent anywhere was asked."""
        if subject.state is not SubjectState.PENDING or subject.asked:
            return
        if subject.refusals:
            self._fail(subject, FaultCode.AUTHENTICATION_FAILED, "; ".join(subject.refusals))
            return
        self.subjects.end(subject)
        self._replies.fault(
            subject.channel,
            FaultCode.NO_RESPONDENT,
            f"no Command-Respondent serves {self.command_name!r}",
            command_id=subject.command_id,
            cause=self.command_name,
        )

    def _authenticated(
        self, agent_id: ApplicationAgentId, subject: Subject, command: Command
    ) -> None:
        roles_value = command.get("roles") or ()
        roles = (roles_value,) if isinstance(roles_value, str) else roles_value
        first = subject.state is SubjectState.PENDING
        subject.authenticated_by.add(agent_id)
        subject.roles = subject.roles | frozenset(roles)
        subject.access = replace(subject.channel.access, roles=subject.roles, subject_id=subject.id)
        announced = command.publisher is not None and self.subjects.set_address(
            subject, command.publisher
        )
        self._log.info(
            "subject.authenticated",
            extra={"subject": subject.id, "agent": agent_id, "channel": subject.channel.id},
        )
        if not first:
            self._changed(subject)
            return
        subject.state = SubjectState.AUTHENTICATED
        self._changed(subject)
        reply: dict[str, asbp.HeaderInput] = {
            "c": AUTHENTICATED,
            "s": subject.id,
            "a": agent_id,
            "roles": sorted(subject.roles),
        }
        if subject.address is not None:
            reply["p"] = subject.address
        if subject.command_id is not None:
            reply["u"] = subject.command_id
        answer = Command(reply)
        written = self.directory_written
        if announced and written is not None:
            # Once the User-Agent hears it is signed in, any broker of the bus finds
            # its address (courses/, ``r``), as asbp.register waits for the names.
            def send(future: asyncio.Future[None]) -> None:
                if not future.cancelled():
                    future.exception()  # the bus down: signed in here all the same
                self._replies.send(subject.channel, answer)

            written().add_done_callback(send)
            return
        self._replies.send(subject.channel, answer)

    # -- endings ---------------------------------------------------------------

    def _fail(self, subject: Subject, code: FaultCode, reason: str) -> None:
        self.subjects.end(subject)
        self._replies.fault(
            subject.channel,
            code,
            f"authentication failed: {reason}",
            command_id=subject.command_id,
            cause=self.command_name,
        )

    def _changed(self, subject: Subject) -> None:
        if self.resumes is not None:
            self.resumes.changed(subject.channel)

    def end(self, subject: Subject, why: str) -> None:
        """End ``subject`` and tell the agents that authenticated it."""
        agents: set[ApplicationAgentId] = set(subject.authenticated_by)
        was = subject.state
        self.subjects.end(subject)
        if was is SubjectState.AUTHENTICATED:
            self._changed(subject)
        self._log.info("subject.end", extra={"subject": subject.id, "reason": why})
        if agents:
            notice = Command(c=SUBJECT_ENDED, s=subject.id, cause=why)
            for tube in self._respondents.of_agents(agents):
                self._replies.send_tube(tube, notice)
            if self.bus is not None:
                self.bus.ended(subject, notice)
        elif self.bus is not None:
            # Its guests there go too, though none of their agents said yes.
            self.bus.ended(subject, Command(c=SUBJECT_ENDED, s=subject.id, cause=why))

    def channel_closed(self, channel: Channel) -> None:
        """Every Subject of a closed Channel ends, but those of a Channel that can
        resume: they wait for it (gateway.routing.resume_subjects)."""
        subjects = self.subjects.on_channel(channel)
        waiting = self.resumes is not None and self.resumes.parks(channel)
        handed = channel.handed_over
        for subject in subjects:
            if subject.id in handed and subject.state is SubjectState.AUTHENTICATED:
                # A stopping home kept it beside the HTTP Channel's log for the
                # broker that takes the Channel over: it moves, it does not end.
                self.subjects.end(subject)
                self._log.info("subject.handed_over", extra={"subject": subject.id})
            elif not waiting or subject.state is not SubjectState.AUTHENTICATED:
                self.end(subject, "channel closed")

    def tube_closed(self, tube: Tube) -> None:
        """A Tube that was asked and left counts as a refusal."""
        if self.bus is not None:
            self.bus.tube_closed(tube)
        for subject in self.subjects:
            if subject.asked.pop(tube.id, None) is not None:
                subject.refusals.append(f"{tube.agent_id}: the agent left")
                if subject.state is SubjectState.PENDING and not subject.asked:
                    self._fail(
                        subject, FaultCode.AUTHENTICATION_FAILED, "; ".join(subject.refusals)
                    )

    def expire(self, *, now: float | None = None) -> int:
        """Fail pending Subjects past their deadline; returns how many."""
        now = self._clock() if now is None else now
        if self.resumes is not None:
            for subject in self.resumes.expired(now):
                self.end(subject, "channel closed")
        late = [s for s in self.subjects if s.state is SubjectState.PENDING and s.deadline <= now]
        for subject in late:
            self._fail(
                subject,
                FaultCode.RESPONDENT_TIMEOUT,
                f"no agent answered within {self._timeout:g} seconds",
            )
        return len(late)

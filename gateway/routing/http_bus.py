"""HTTP Channels' Subjects and groups on a bus: one *home* broker keeps them.

Theory of operation
-------------------
An HTTP Channel on a bus has no connection, so any broker serves any of its
requests (its mailbox is its Channel log in the plane: gateway.connections.
log_mailbox). What it sends is mostly stateless (a request for a Respondent,
a ping); what is not, its Subjects and its groups, must live in one place, or a
sign-in through broker A would be unknown to broker B, a group joined at B
would go when B's copy of the Channel idles out, and a ``g`` would reach the
Channel once per broker that holds a copy.

The same holds for its topic and queue subscriptions and the leases of the
queue messages it takes. So every HTTP Channel has a *home*: the broker that
opened it, named by the plane's directory (``ch``). Another broker that serves one of its requests
holds a *visitor* copy (``Channel.visitor``), which it never announces and
which never joins a group. At a visitor:

- a Command that touches the Channel's Subjects (it carries ``s``, or is the
  Authenticate-Command or ``asbp.logout``), or its subscriptions and queue
  leases (``asbp.subscribe``, ``asbp.unsubscribe``, ``asbp.poll``,
  ``asbp.ack``), is handed to the home as it was sent
  (an ``HTTP_COMMAND`` envelope), and the home routes it exactly as if its own
  client had posted it: ``s`` is checked against the home's Subjects, the ACL
  there, and the answers go into the Channel log, which any broker reads. The
  visitor checked the Channel's secret first; knowing ``i`` and ``s`` is never
  enough;
- ``asbp.join``/``asbp.leave`` from an agent at the visitor's broker treat the
  visitor as absent (gateway.routing.management), so the bus takes them to the
  home, where the group's directory entry is;
- anything else is routed on the spot, as before.

The home keeps the Channel's groups in the record beside its log
(``ChannelLog.keep``, the record resumable WebSocket Channels use:
gateway.connections.resume_state). When the home dies, the first visitor that
notices (a hand-over refused because the home is gone, or a long-poll that
finds no live home in the directory) claims the Channel (``Plane.claim_channel``,
a compare-and-set of the directory's entry: of visitors that notice at once,
exactly one wins, or both would join the groups and a ``g`` would reach the
Channel twice). The winner becomes the home and joins the groups of the
record, so a ``g`` reaches the Channel again; a loser stays a visitor and hands
the Command it held to the winner. The Subjects signed in there are lost with it (their ``s``
faults 3201: the client signs in again), as a WebSocket Channel's are when its
broker dies without a resume.

A home that *stops* (SIGTERM: a rolling restart, a scale-down) hands its
Channels' Subjects over instead (:meth:`HttpBus.hand_over`, called by the
broker's stop once the drain is done, before its Channels close): it writes
them into each record (``s``, the agents that authenticated it, its roles, its
address, the brokers whose agents did: the WebSocket resume's
``KeptSubject``), and its close forgets them without a word to their agents.
The broker that takes the Channel over restores them from the record before it
routes the Command that made it the home, so the client's next ``s`` works
there, and then rewrites the record without them (a later home must not bring
back a Subject that ended meanwhile).

The home's copy does not idle out while the Channel is used elsewhere: past
the idle timeout it asks the log, which every broker's requests keep alive,
and closes only once the log expired bus-wide (gateway.broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final

import asbp
from asbp import Command, FaultCode, ProtocolError
from asbp.names import ACK, LOGOUT, POLL, SUBSCRIBE, UNSUBSCRIBE
from gateway.connections.channels import Channel, ChannelKind
from gateway.connections.log_mailbox import LogMailbox
from gateway.connections.resume_state import ResumeRecord
from gateway.plane.base import Envelope, EnvelopeKind, PlaneUnavailable

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.types import SubjectResume

__all__ = ["HttpBus"]

#: Claims a visitor's Command may go through before it faults: each lost claim
#: names a live home to hand it to, so a second loss means that home died too.
_ATTEMPTS: Final = 3


class HttpBus:
    """One broker's side of HTTP Channels' homes; see the module docstring.

    Args:
        broker: the broker (its registries, router, plane and settings).
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._plane = broker.plane
        # The Subjects' Commands, and the messaging Commands that make or use a
        # subscription or a queue lease, both of which belong to one broker's copy.
        stateful = {LOGOUT, SUBSCRIBE, UNSUBSCRIBE, POLL, ACK}
        if broker.config.authenticate_command is not None:
            stateful.add(broker.config.authenticate_command)
        self._stateful = frozenset(stateful)
        #: Work started here and not awaited by anyone (kept until done).
        self._tasks: set[asyncio.Task[None]] = set()
        #: Channels whose home is being looked up (one look at a time each).
        self._checking: set[str] = set()
        previous = broker.channels.on_membership

        def membership(channel: Channel) -> None:
            if previous is not None:
                previous(channel)
            self._record(channel)

        broker.channels.on_membership = membership
        broker.router.http_home = self.inbound
        remote = broker.router.remote
        if remote is not None:
            remote.on_operator_close = self.closed_by_operator

    # -- a request served here -------------------------------------------------

    def route(self, channel: Channel, command: Command, frame: bytes) -> None:
        """Route what ``channel``'s client posted here: to its home if it is about
        its Subjects and this broker is only visited."""
        if channel.visitor and ("s" in command or command.name in self._stateful):
            self._hand_home(channel, command, frame)
            return
        self._broker.router.channel_command(channel, command, frame)

    def _hand_home(
        self, channel: Channel, command: Command, frame: bytes, attempts: int = _ATTEMPTS
    ) -> None:
        envelope = Envelope(EnvelopeKind.HTTP_COMMAND, self._plane.broker_id, channel.id, frame)
        try:
            placing = self._plane.forward_to_channel(channel.id, envelope)
        except PlaneUnavailable as exc:
            self._unreachable(channel, command, exc)
            return

        def placed(future: asyncio.Future[str | None]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                self._unreachable(channel, command, error)
            elif future.result() is None and not channel.closed:
                # No live home on the bus: claim it, then route it here or hand it
                # to the visitor that claimed it first.
                self._spawn(self._claim_and_route(channel, command, frame, attempts))

        placing.add_done_callback(placed)

    async def _claim_and_route(
        self, channel: Channel, command: Command, frame: bytes, attempts: int
    ) -> None:
        try:
            won = await self._claim(channel)
        except PlaneUnavailable as exc:
            self._unreachable(channel, command, exc)
            return
        if channel.closed:
            return
        if won:
            self._broker.router.channel_command(channel, command, frame)
        elif attempts > 1:
            self._hand_home(channel, command, frame, attempts - 1)
        else:  # the home changed hands every time: the bus is in turmoil
            self._unreachable(channel, command, PlaneUnavailable("the home keeps changing"))

    def _unreachable(self, channel: Channel, command: Command, error: BaseException) -> None:
        if channel.closed:
            return
        self._broker.router.replies.fault(
            channel,
            FaultCode.ENGINE_UNAVAILABLE,
            f"the bus is unreachable, so the Channel's home was not reached: {error}",
            command_id=command.command_id,
            cause=command.name,
        )

    def polled(self, channel: Channel) -> None:
        """A long-poll of ``channel`` here: if it only visits, is its home still alive?

        One directory read, not awaited by the poll, at most every sixth of the
        lease per Channel: a dead home leaves the directory only once its lease
        runs out, so asking more often would learn nothing sooner.
        """
        if not channel.visitor or channel.id in self._checking:
            return
        now = time.monotonic()
        if now - channel.home_checked < self._plane.lease / 6:
            return
        channel.home_checked = now
        self._checking.add(channel.id)
        self._spawn(self._check_home(channel))

    async def _check_home(self, channel: Channel) -> None:
        try:
            with contextlib.suppress(PlaneUnavailable):
                home = await self._plane.locate_channel(channel.id)
                if home is None and channel.visitor and not channel.closed:
                    await self._claim(channel)
        finally:
            self._checking.discard(channel.id)

    # -- home ---------------------------------------------------------------------

    async def _claim(self, channel: Channel) -> bool:
        """Claim ``channel``'s home in the plane (its home died): whether this
        broker won, and took it over. Of visitors that claim it at once, one wins
        (``Plane.claim_channel``); the others stay visitors of the winner.

        Raises:
            PlaneUnavailable: the bus cannot be reached.
        """
        if not channel.visitor:
            return True
        if await self._plane.channel_log.digest(channel.id) is None:
            # Closed bus-wide (an operator: ``closed_by_operator``) or expired: not
            # to be taken over, and gone here too (2104 from now on).
            if not channel.closed:
                self._broker.close_channel(channel, FaultCode.UNKNOWN_CHANNEL)
            return False
        holder = await self._plane.claim_channel(channel.id)
        if holder != self._plane.broker_id:
            self._broker.log.info(
                "channel.home_claimed_elsewhere", extra={"channel": channel.id, "home": holder}
            )
            return False
        if not channel.closed and self._become_home(channel):
            # Awaited: the Command that made this broker the home may name a
            # Subject the record brings (a stopped home handed it over).
            await self._rejoin(channel)
        return True

    def take_over(self, channel: Channel) -> None:
        """Make this broker ``channel``'s home (the directory names it, or its claim
        won): announce it, and join it to the groups (and take over the Subjects)
        its record keeps."""
        if self._become_home(channel):
            self._spawn(self._rejoin(channel))

    def _become_home(self, channel: Channel) -> bool:
        if not channel.visitor:
            return False
        channel.visitor = False
        self._broker.router.channel_opened(channel)
        self._broker.log.warning(
            "channel.home_taken_over", extra={"channel": channel.id, "transport": "http"}
        )
        return True

    async def _rejoin(self, channel: Channel) -> None:
        with contextlib.suppress(PlaneUnavailable):
            record = ResumeRecord.decode(await self._plane.channel_log.kept(channel.id))
            if channel.closed or channel.visitor:
                return
            if record.groups:
                channels = self._broker.channels
                for group in record.groups:
                    channels.join(group, [channel])
                self._broker.log.info(
                    "channel.groups_rejoined",
                    extra={"channel": channel.id, "groups": len(record.groups)},
                )
            resumes = self._resumes
            if record.subjects and resumes is not None:
                restored = resumes.restore(channel, record.subjects)
                self._broker.log.info(
                    "channel.subjects_taken_over",
                    extra={"channel": channel.id, "subjects": restored, "from": record.home},
                )
                self._record(channel)  # kept here now: out of the record

    @property
    def _resumes(self) -> SubjectResume | None:
        auth = self._broker.router.auth
        return None if auth is None else auth.resumes

    def _record(self, channel: Channel) -> None:
        """A home HTTP Channel's groups changed: its record beside the log follows
        (with the Subjects it hands over, once its broker is stopping)."""
        if not _home_copy(channel):
            return
        with contextlib.suppress(PlaneUnavailable):
            self._plane.channel_log.keep(channel.id, self._record_of(channel).encode())

    def _record_of(self, channel: Channel) -> ResumeRecord:
        resumes = self._resumes
        if not channel.handed_over or resumes is None:
            return ResumeRecord.of(channel.groups)
        kept = [k for k in resumes.kept(channel) if k.id in channel.handed_over]
        return ResumeRecord.of(channel.groups, self._plane.broker_id, kept)

    async def hand_over(self, timeout: float) -> int:
        """The broker is stopping: each HTTP Channel homed here keeps its signed-in
        Subjects in the record beside its log, for the broker that takes it over
        (see the module docstring). Returns how many Channels did; a Channel whose
        record could not be written in ``timeout`` seconds ends its Subjects at
        its close, as before."""
        resumes = self._resumes
        if resumes is None:
            return 0
        writes: dict[Channel, asyncio.Future[None]] = {}
        for channel in list(self._broker.channels):
            if not _home_copy(channel):
                continue
            kept = resumes.kept(channel)
            if not kept:
                continue
            channel.handed_over = frozenset(k.id for k in kept)
            try:
                writes[channel] = self._plane.channel_log.keep(
                    channel.id, self._record_of(channel).encode()
                )
            except PlaneUnavailable:
                channel.handed_over = frozenset()
        if not writes:
            return 0
        await asyncio.wait(writes.values(), timeout=timeout)
        handed = 0
        for channel, written in writes.items():
            if written.done() and not written.cancelled() and written.exception() is None:
                handed += 1
            else:
                written.cancel()
                channel.handed_over = frozenset()  # not kept: they end at its close
        return handed

    def inbound(self, envelope: Envelope) -> None:
        """A Command another broker handed on for an HTTP Channel whose home is here."""
        try:
            command = asbp.decode(envelope.frame, limits=self._broker.config.limits)
        except ProtocolError:  # pragma: no cover - checked by the broker that took it in
            return
        channel = self._broker.channels.get(envelope.channel)
        if channel is None or channel.closed or channel.kind is not ChannelKind.HTTP:
            # The home's copy went (its idle check raced the client's return):
            # serve it again from the log, which the sender found alive.
            self._spawn(self._adopt_and_route(envelope, command))
            return
        if channel.visitor:
            self.take_over(channel)  # the directory says it is here: so it is
        channel.last_seen = time.monotonic()
        self._broker.router.channel_command(channel, command, envelope.frame)

    async def _adopt_and_route(self, envelope: Envelope, command: Command) -> None:
        with contextlib.suppress(PlaneUnavailable):
            digest = await self._plane.channel_log.digest(envelope.channel)
            if digest is None:
                self._broker.log.info("plane.channel_gone", extra={"channel": envelope.channel})
                return
            channel = self._broker.adopt_http_channel(
                envelope.channel, digest, envelope.origin, address=None, tls=False
            )
            self.take_over(channel)
            self._broker.router.channel_command(channel, command, envelope.frame)

    def idle(self, channel: Channel) -> None:
        """The home's copy of ``channel`` is idle here: close it only if its log
        expired bus-wide (its client may be using other brokers)."""
        channel.last_seen = time.monotonic()
        self._spawn(self._close_if_gone(channel))

    async def _close_if_gone(self, channel: Channel) -> None:
        with contextlib.suppress(PlaneUnavailable):
            if await self._plane.channel_log.digest(channel.id) is None:
                if not channel.closed:
                    self._broker.close_channel(channel, FaultCode.UNKNOWN_CHANNEL)
                return
            self._broker.log.debug("channel.idle_here", extra={"channel": channel.id})

    def closed_by_operator(self, channel: Channel) -> None:
        """An operator closed ``channel`` here, its home (the management API, here
        or handed on from another broker): its log goes too, so the Channel is gone
        bus-wide. A visitor that serves it next finds no log: it closes its copy
        (2104) rather than take the Channel over."""
        if channel.visitor or not isinstance(channel.outbox, LogMailbox):
            return
        with contextlib.suppress(PlaneUnavailable):
            self._plane.channel_log.drop(channel.id)

    def gone(self, channel: Channel) -> None:
        """A long-poll found no log for ``channel``: closed or expired bus-wide."""
        if not channel.closed:
            self._broker.close_channel(channel, FaultCode.UNKNOWN_CHANNEL)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        # Named after the work, so that a failure's log line says which.
        task = asyncio.get_running_loop().create_task(
            work, name=getattr(work, "__qualname__", None)
        )
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        # Each piece of work handles the failures it expects (an unreachable bus
        # faults the sender); anything else is a bug, and it must be seen in the
        # broker's log when it happens, not as asyncio's "exception was never
        # retrieved" whenever the task is collected.
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self._broker.log.error(
                "http_bus.task_failed",
                exc_info=(type(error), error, error.__traceback__),
                extra={"task": task.get_name()},
            )

    async def stop(self) -> None:
        """End what is still running (the broker is stopping)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _home_copy(channel: Channel) -> bool:
    """Whether ``channel`` is an open HTTP Channel whose home is this broker, its
    mailbox the Channel log: the copy that keeps the record beside the log."""
    return (
        channel.kind is ChannelKind.HTTP
        and not channel.visitor
        and not channel.closed
        and isinstance(channel.outbox, LogMailbox)
    )

"""Resuming a WebSocket Channel on any broker of the bus (docs/protocol.md, "Resuming a Channel").

Theory of operation
-------------------
A resumable WebSocket Channel has a Channel log in the routing plane
(:class:`gateway.plane.base.ChannelLog`), opened with the digest of its secret
right after its greeting, and *held* by the broker its connection is on. Its
outbox is a :class:`HeldOutbox`: every frame the router leaves for it is queued
for the socket as before and, in the same call, submitted to the plane's
batched writer (``held_append``), never awaited. The log therefore numbers the
frames in the order this broker delivered them: frame ``n`` of the log is the
``n``-th frame the client received after its greeting, which is why a client
only counts frames (``received``) instead of every frame carrying a number,
and frames spliced once for many readers stay shared.

While a broker holds the log, a frame routed to the Channel from another broker
goes to the holder (the plane's ``forward_to_channel``), which delivers and logs
it. When the connection drops, the outbox closes and ``release``\\ s the log: from
then on frames routed to the Channel, from any broker, go into the log, as for
an HTTP Channel, until the client resumes or the log expires (``log_max_age``
after the last use). A holder that dies is forgotten by the plane's scripts when
its lease runs out, with the same effect.

Resuming (:meth:`ChannelResume.accept`): the client opens ``/asbp?resume=<i>``
and sends ``c=asbp.resume,i=<i>,secret=<s>,received=<K>``. The broker reads the
digest from the log and compares in constant time (no log, a wrong or missing
secret: the same fault 2110, so nobody learns whether a Channel exists), holds
the log (``hold``: the previous holder, if any, is told with a ``RESUMED``
envelope and closes its connection with fault 2112), registers the Channel
under the same ``i``, answers ``asbp.resumed`` and writes the logged frames
after ``K`` up to the newest at the moment it took hold, then lets the outbox
(frames routed since, already logged after them) drain. Frames that retention
dropped are reported first as fault 2111 with their count.

What follows the Channel: its ``i``, its secret, everything routed to it, its
groups, its signed-in Subjects and its topic and queue subscriptions (a record
kept beside its log, gateway.connections.resume_state, rewritten on every change
to any of them and read back here before ``asbp.resumed``, which says so with
``kept=groups,subjects,subscriptions``; gateway.routing.resume_subjects for the
Subjects, gateway.messaging.service "Resumed Channels" for the subscriptions).

Topic subscriptions are *parked* at the broker the connection dropped from:
they keep feeding the Channel's log while it is away (a publication made then
is one more Command routed to it, logged in order), and the broker it resumes
on subscribes it again before ``asbp.resumed``, holding its notifications back,
then tells the parked broker (the ``RESUMED`` envelope, whose frame
``handover?`` asks for the *handover*), which ends them and answers with the
last topic message it sent on (a RESUMED envelope whose frame is ``last=<id>``;
a broker from before the handover ignores the question); the resuming broker then sends what it held
after that one, so each publication arrives once, in order
(gateway.messaging.service, "Resumed Channels"). A broker that does not answer
(dead) is waited for at most the bus lease. A parked subscription ends
``log_max_age`` after the drop if the
Channel never resumes, and leaves the record then. Queue subscriptions are not
parked: the messages leased to the Channel go back to their queue at the drop,
and the queue is consumed again once it resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import asbp
from asbp import ChannelId, Command, FaultCode, ProtocolError
from asbp.fault_commands import fault_command
from asbp.names import RESUME, RESUMED
from gateway.acl import AccessContext, channel_properties
from gateway.connections.channel_secret import matches
from gateway.connections.channels import Channel, ChannelKind
from gateway.connections.outboxes import StreamOutbox
from gateway.connections.resume_state import KeptSubject, KeptSubscription, ResumeRecord
from gateway.engines.base import EngineUnavailable
from gateway.errors import GatewayError
from gateway.plane.base import ChannelLog, Envelope, EnvelopeKind, Plane

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.routing.resume_subjects import ResumeSubjects

__all__ = ["ChannelResume", "HeldOutbox", "Refused", "Resumed"]

_log = logging.getLogger("asbp.plane")

#: Logged frames read per call while replaying (bounds what a resume holds at once).
REPLAY_PAGE: Final = 1000
#: The query parameter of ``/asbp`` that asks to resume instead of opening a Channel.
QUERY: Final = "resume"
#: The frame of the RESUMED envelope to the broker where the Channel's topic
#: subscriptions were parked: answer with the last one sent on. A broker from before
#: the handover ignores it (and is waited for at most the bus lease).
HANDOVER_ASK: Final = b"handover?"
#: Starts the frame of the RESUMED envelope that answers it: the id that follows is
#: the last topic message the parked subscriptions sent on ('' none).
HANDOVER: Final = "last="
#: Seconds a resume waits for the broker its connection dropped from to release
#: the log (:meth:`ChannelResume._released`): that broker's last appends land
#: within a pipeline of the drop; one that has not noticed the drop in this time
#: is asked to close its connection (LET_GO), and waited for up to the bus lease.
RELEASE_WAIT: Final = 1.0
#: Seconds between looks at whether it did.
_RELEASE_CHECK: Final = 0.005
#: ``kept`` of ``asbp.resumed``: what followed the Channel (docs/protocol.md).
KEPT: Final = ("groups", "subjects", "subscriptions")


def _unawaited(future: asyncio.Future[Any], call: str, channel_id: str) -> None:
    """A call on the Channel's log that nobody awaits (the connection is going, or
    the caller must not wait): its failure, an unreachable bus, is logged once here
    instead of as asyncio's "exception was never retrieved". What it costs is said
    where each is called."""

    def done(settled: asyncio.Future[Any]) -> None:
        if settled.cancelled():
            return
        error = settled.exception()
        if error is not None:
            _log.warning(
                "channel.log_call_failed",
                extra={"call": call, "channel": channel_id, "error": str(error)},
            )

    future.add_done_callback(done)


class HeldOutbox(StreamOutbox):
    """A WebSocket Channel's outbox that also appends each frame to the Channel's log.

    Appends start with :meth:`start_logging` (after the greeting, which carries
    the secret and is never logged). The frames offered in one turn of the event
    loop go to the log in one call (``held_append``), submitted at the end of
    that turn and never awaited. Frames whose append finds that another broker
    holds the log now (the Channel resumed there while this connection
    lingered) are forwarded to that broker instead.
    """

    __slots__ = (
        "_confirmed",
        "_handing_over",
        "_holder",
        "_logging",
        "_pending",
        "_plane",
        "_unconfirmed",
        "channel_id",
        "read",
        "released",
        "sealed",
    )

    def __init__(self, max_frames: int, max_bytes: int, plane: Plane) -> None:
        super().__init__(max_frames, max_bytes)
        self._plane = plane
        self.channel_id = ""
        self._logging = False
        self._holder: ChannelLog | None = None
        #: Whether closing left the log for a resume (the Channel's Subjects wait).
        self.released = False
        #: Frames offered this turn, not yet submitted to the log.
        self._pending: list[bytes] = []
        #: The broker is stopping (gateway.drain): frames go to the log only.
        self._handing_over = False
        #: Frames submitted to the log whose append has not come back yet, and
        #: who waits for none to be left (:meth:`logged`).
        self._unconfirmed = 0
        self._confirmed: asyncio.Future[None] | None = None
        #: Frames read from the client on this connection and routed (after its
        #: greeting or resume): a stopping broker's close reason says how many.
        self.read = 0
        #: The close is on its way (gateway.drain): frames read from now on are not
        #: routed; the client sends them again where it resumes.
        self.sealed = False

    @property
    def logging(self) -> bool:
        """Whether frames offered now go to the Channel's log (it can resume)."""
        return self._logging

    def start_logging(self, channel_id: str) -> None:
        """Append every frame offered from now on to ``channel_id``'s log (held here)."""
        self.channel_id = channel_id
        self._holder = self._plane.channel_log
        self._logging = True

    def hand_over(self) -> None:
        """The broker is stopping (gateway.drain): the writer sends what is queued and
        closes the socket (1012), while frames offered from now on go to the log only,
        for the client to get when it resumes elsewhere. The log stays held until
        :meth:`close` (the connection ended: its client sends nothing more)."""
        self._handing_over = True
        super().close()

    def offer(self, frame: bytes) -> bool:
        if self._handing_over:
            # Not for this socket any more: numbered in the log after what it got.
            if not self._logging:
                return False
            if not self._pending:
                asyncio.get_running_loop().call_soon(self._submit)
            self._pending.append(frame)
            return True
        if not super().offer(frame):
            return False
        if self._logging:
            pending = self._pending
            if not pending:
                asyncio.get_running_loop().call_soon(self._submit)
            pending.append(frame)
        return True

    def offer_delivery(self, frame: bytes) -> bool:
        """A queue delivery: sent, never logged, and not counted by the client.

        The queue is its log: its lease went back to the queue when the
        connection dropped (gateway.messaging.service, "Resumed Channels"), so
        the message is delivered again, with a new receipt, rather than
        replayed from here. Logging it would cost Redis a second copy of every
        queue message and, on resume, deliver it twice (the replay and the
        redelivery).
        """
        if self._handing_over:
            # Not for this socket any more: its lease is released with the Channel.
            return True
        return StreamOutbox.offer(self, frame)

    def _submit(self) -> None:
        frames, self._pending = self._pending, []
        holder = self._holder
        if not frames or holder is None or not self._logging:
            return
        try:
            appended = holder.held_append(self.channel_id, frames)
        except EngineUnavailable as exc:
            self._lost(exc)
            return
        self._unconfirmed += len(frames)
        appended.add_done_callback(lambda future: self._appended(frames, future))

    async def logged(self) -> None:
        """Return once every frame offered so far is in the log (or the log is lost).

        A stopping broker (gateway.drain) closes the socket only then: a client
        that resumes elsewhere the moment it hears the close must find in the log
        every frame it was sent, or it would count frames the log lacks.
        """
        self._submit()
        while self._unconfirmed > 0:
            if self._confirmed is None:
                self._confirmed = asyncio.get_running_loop().create_future()
            await self._confirmed

    def _appended(self, frames: list[bytes], future: asyncio.Future[int]) -> None:
        self._unconfirmed -= len(frames)
        if self._unconfirmed <= 0 and self._confirmed is not None:
            confirmed, self._confirmed = self._confirmed, None
            if not confirmed.done():
                confirmed.set_result(None)
        if future.cancelled():
            return
        error = future.exception()
        number = 0 if error is not None else future.result()
        if number > 0:
            return
        if number < 0:
            # Resumed elsewhere meanwhile: the frames go where the Channel is now.
            for frame in frames:
                envelope = Envelope(
                    EnvelopeKind.CHANNEL, self._plane.broker_id, self.channel_id, frame
                )
                with contextlib.suppress(EngineUnavailable):
                    self._plane.forward_to_channel(self.channel_id, envelope)
            return
        self._lost(error)

    def _lost(self, error: BaseException | None) -> None:
        # The log is gone or missed frames: its numbers no longer match what the
        # client counts, so it is dropped and a resume is refused (2110) rather
        # than replaying the wrong frames.
        if not self._logging:
            return
        self._logging = False
        _log.warning(
            "plane.resume_log_lost",
            extra={"channel": self.channel_id, "error": str(error or "no such log")},
        )
        with contextlib.suppress(EngineUnavailable):
            self._plane.channel_log.drop(self.channel_id)

    def close(self) -> None:
        super().close()
        if self._logging and self._holder is not None:
            self._submit()  # what this turn offered goes first, then the release
            self._logging = False
            self.released = True
            # The log outlives the connection: frames go into it until a resume.
            # Unreleased (the bus unreachable), a resume elsewhere waits RELEASE_WAIT
            # for this broker, then tells it to let go.
            with contextlib.suppress(EngineUnavailable):
                _unawaited(self._holder.release(self.channel_id), "release", self.channel_id)


class Refused(GatewayError):
    """A resume that cannot happen: the fault to send before closing."""

    def __init__(self, code: FaultCode, message: str) -> None:
        super().__init__(message, code=code)

    @property
    def frame(self) -> bytes:
        return asbp.encode(fault_command(self.code, self.message))


class Resumed:
    """A Channel resumed here: what to write before its outbox drains."""

    __slots__ = ("channel", "outbox")

    def __init__(self, channel: Channel, outbox: HeldOutbox) -> None:
        self.channel = channel
        self.outbox = outbox


class ChannelResume:
    """One broker's resumable WebSocket Channels; see the module docstring.

    Args:
        broker: the broker (its registries, router, plane and settings).
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        mode = broker.config.channels.resume
        self.enabled = mode == "on" or (mode == "auto" and broker.plane.spans_brokers)
        self._toucher: asyncio.Task[None] | None = None
        #: Records being rewritten (kept until done, so none is collected midway).
        self._rewrites: set[asyncio.Future[None]] = set()
        self._subjects: ResumeSubjects | None = None
        #: Channels with topic subscriptions parked here -> the timer that ends them.
        self._parked: dict[str, asyncio.TimerHandle] = {}
        if self.enabled:
            broker.channels.on_membership = self._record
            broker.messaging.parks = self._parks
            broker.messaging.on_subscriptions = self._subscriptions_changed
            auth = broker.router.auth
            if auth is not None:
                from gateway.routing.resume_subjects import ResumeSubjects

                self._subjects = ResumeSubjects(
                    auth,
                    broker_id=broker.broker_id,
                    wait=broker.config.channels.log_max_age,
                    clock=time.monotonic,
                    changed=self._record,
                    forgotten=self._forget_subjects,
                    log=broker.log,
                )
                auth.resumes = self._subjects
        #: Channels resumed here whose former broker has not answered yet -> the timer
        #: that stops waiting for it (gateway.messaging.service, "Resumed Channels").
        self._handovers: dict[str, asyncio.TimerHandle] = {}
        #: The Channel whose parked topic subscriptions the last RESUMED envelope
        #: ended here, and the last topic message they sent on (read by the handover
        #: asked for in that same envelope).
        self._unparked: tuple[str, str] | None = None
        remote = broker.router.remote
        if remote is not None:
            remote.on_resumed = self._resumed_elsewhere
            remote.on_handover = self._on_handover
            remote.on_let_go = self._let_go
        elif self.enabled:
            # A lone broker asks no plane when a Channel is not here: it asks this.
            broker.router.away = self._away

    def _away(self, channel_id: str, frame: bytes) -> bool:
        """Into the log of a resumable Channel whose connection dropped (a lone broker's
        log is in memory: the future is settled already)."""
        logged = self._broker.plane.channel_log.append(channel_id, frame)
        if not logged.done():  # pragma: no cover - one broker's log is in memory
            _unawaited(logged, "append", channel_id)
            return False
        return logged.exception() is None and logged.result() > 0

    def _record(self, channel: Channel) -> None:
        """A resumable Channel's groups or Subjects changed: its record beside the log
        follows."""
        outbox = channel.outbox
        if not isinstance(outbox, HeldOutbox) or not outbox.logging or channel.closed:
            return
        kept: list[KeptSubject] = []
        if self._subjects is not None:
            kept = self._subjects.kept(channel)
        home = self._broker.broker_id if kept else ""
        subscriptions = self._subscriptions(channel.id)
        parked = self._broker.broker_id if subscriptions else ""
        record = ResumeRecord.of(
            channel.groups, home, kept, subscriptions, parked, channel.count
        ).encode()
        # Unkept (the bus unreachable), a resume elsewhere finds the record before.
        with contextlib.suppress(EngineUnavailable):
            _unawaited(self._broker.plane.channel_log.keep(channel.id, record), "keep", channel.id)

    def _subscriptions(self, channel_id: str) -> list[KeptSubscription]:
        return [
            KeptSubscription(kind, name, subject)
            for kind, name, subject in self._broker.messaging.subscriptions(channel_id)
        ]

    def _subscriptions_changed(self, channel_id: str) -> None:
        channel = self._broker.channels.get(channel_id)
        if channel is not None:
            self._record(channel)

    # -- parked topic subscriptions (gateway.messaging.service, "Resumed Channels") --

    def _parks(self, channel: Channel) -> Callable[[bytes], object] | None:
        """Where ``channel``'s topic notifications go while it is away; None: it
        cannot resume (its subscriptions end)."""
        outbox = channel.outbox
        if not isinstance(outbox, HeldOutbox) or not outbox.released:
            return None
        channel_id = channel.id
        previous = self._parked.pop(channel_id, None)
        if previous is not None:
            previous.cancel()  # pragma: no cover - parked once per drop
        self._parked[channel_id] = asyncio.get_running_loop().call_later(
            self._idle, self._park_expired, channel_id
        )
        return functools.partial(self._to_away, channel_id)

    def _to_away(self, channel_id: str, frame: bytes) -> None:
        """A notification for a Channel whose topic subscriptions are parked here: to
        its log while it is away, to the broker it resumed on once it has."""
        here = self._broker.channels.get(channel_id)
        if here is not None:
            # Resumed here, its parked endpoint not yet bound to it (accept awaits in
            # between): through its outbox, numbered with everything else it gets.
            self._broker.router.deliver(here, frame)
            return
        plane = self._broker.plane
        if not plane.spans_brokers:
            if not self._away(channel_id, frame):
                self._unpark(channel_id)  # its log is gone: it can no longer resume
            return
        envelope = Envelope(EnvelopeKind.CHANNEL, plane.broker_id, channel_id, frame)
        try:
            forwarded = plane.forward_to_channel(channel_id, envelope)
        except EngineUnavailable:
            return  # pragma: no cover - the bus is unreachable: the resume will say so
        forwarded.add_done_callback(lambda future: self._forwarded(channel_id, future))

    def _forwarded(self, channel_id: str, future: asyncio.Future[str | None]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        if future.result() is None:
            self._unpark(channel_id)  # no log and no holder: the Channel is gone

    def _unpark(self, channel_id: str) -> str | None:
        timer = self._parked.pop(channel_id, None)
        if timer is not None:
            timer.cancel()
        return self._broker.messaging.unpark(channel_id)

    def _park_expired(self, channel_id: str) -> None:
        """``log_max_age`` passed since the drop without a resume: the parked topic
        subscriptions end, and leave the record (a resume after this, of a log kept
        alive by what was routed to it, must not claim them kept)."""
        self._parked.pop(channel_id, None)
        if self._broker.messaging.unpark(channel_id) is None:
            return  # pragma: no cover - ended by a resume meanwhile
        task = asyncio.ensure_future(self._rewrite_without_subscriptions(channel_id))
        self._rewrites.add(task)
        task.add_done_callback(self._rewrites.discard)

    async def _rewrite_without_subscriptions(self, channel_id: str) -> None:
        log = self._broker.plane.channel_log
        with contextlib.suppress(EngineUnavailable):
            record = ResumeRecord.decode(await log.kept(channel_id))
            if not record.subscriptions or record.parked != self._broker.broker_id:
                return  # pragma: no cover - resumed elsewhere, which wrote its own
            await log.keep(
                channel_id,
                ResumeRecord.of(
                    record.groups, record.home, record.subjects, count=record.count
                ).encode(),
            )

    def _forget_subjects(self, channel_id: str) -> None:
        """Subjects that waited for ``channel_id`` ended: out of its record."""
        task = asyncio.ensure_future(self._rewrite_without_subjects(channel_id))
        self._rewrites.add(task)
        task.add_done_callback(self._rewrites.discard)

    async def _rewrite_without_subjects(self, channel_id: str) -> None:
        log = self._broker.plane.channel_log
        with contextlib.suppress(EngineUnavailable):
            record = ResumeRecord.decode(await log.kept(channel_id))
            if not record.subjects or record.home != self._broker.broker_id:
                return
            auth = self._broker.router.auth
            live = [
                kept
                for kept in record.subjects
                if auth is not None and auth.subjects.get(kept.id) is not None
            ]
            home = record.home if live else ""
            await log.keep(
                channel_id,
                ResumeRecord.of(
                    record.groups, home, live, record.subscriptions, record.parked, record.count
                ).encode(),
            )

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        """Keep the logs of connected Channels from expiring while they are quiet."""
        if self.enabled and self._toucher is None:
            self._toucher = asyncio.create_task(self._touch(), name="asbp-resume-touch")

    async def stop(self) -> None:
        for timers in (self._parked, self._handovers):
            for timer in timers.values():
                timer.cancel()
            timers.clear()
        if self._toucher is not None:
            self._toucher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._toucher
            self._toucher = None

    async def _touch(self) -> None:
        # A log expires ``log_max_age`` after its last use; a held one is used by
        # this broker, so it is touched well within that.
        period = max(1.0, self._broker.config.channels.log_max_age / 4)
        log = self._broker.plane.channel_log
        while True:
            await asyncio.sleep(period)
            held = [
                channel.id
                for channel in self._broker.channels
                if isinstance(channel.outbox, HeldOutbox) and not channel.closed
            ]
            # Submitted a page at a time: the Batcher sends each page in one pipeline.
            for start in range(0, len(held), REPLAY_PAGE):
                page = held[start : start + REPLAY_PAGE]
                await asyncio.gather(*(log.digest(i) for i in page), return_exceptions=True)

    # -- opening -------------------------------------------------------------------

    def open(self, remote: str, *, address_key: str | None) -> tuple[Channel, HeldOutbox]:
        """Open a WebSocket Channel that can resume (as Broker.open_websocket_channel)."""
        broker = self._broker
        limits = broker.config.channels
        outbox = HeldOutbox(limits.outbox_frames, limits.outbox_bytes, broker.plane)
        channel = broker.channels.open(
            ChannelKind.WEBSOCKET, outbox, remote=remote, address_key=address_key
        )
        channel.access = _access(channel.id)
        broker.router.channel_opened(channel)
        broker.log.info("channel.open", extra={"channel": channel.id, "remote": remote})
        return channel, outbox

    def greeted(self, channel: Channel, outbox: HeldOutbox) -> None:
        """The greeting (with the secret) is out: the log starts, held here, empty."""
        log = self._broker.plane.channel_log
        try:
            _unawaited(
                log.open(channel.id, digest=channel.secret_digest, idle=self._idle),
                "open",
                channel.id,
            )
            _unawaited(log.hold(channel.id), "hold", channel.id)
        except EngineUnavailable:
            return  # the bus is unreachable: this Channel cannot resume, and says so then
        outbox.start_logging(channel.id)
        if channel.count != 1:
            # How its client counts goes with the log from the start: a broker it
            # resumes on must leave out of the log what that client does not count.
            self._record(channel)

    @property
    def _idle(self) -> float:
        return self._broker.config.channels.log_max_age

    # -- resuming ------------------------------------------------------------------

    async def accept(
        self,
        data: bytes,
        write: Callable[[bytes], Awaitable[None]],
        *,
        remote: str,
        address_key: str | None,
    ) -> Resumed:
        """Resume the Channel ``data`` (the client's first frame) asks for.

        Writes ``asbp.resumed`` and the logged frames the client lacks with
        ``write``; the caller then drains the returned outbox to the socket.

        Raises:
            Refused: with the fault to write before closing.
        """
        if not self.enabled:
            raise Refused(
                FaultCode.RESUME_UNAVAILABLE,
                "this broker does not resume Channels ([channels] resume): open a new Channel",
            )
        channel_id, secret, received = _parse(data, self._broker.config.limits)
        broker = self._broker
        log = broker.plane.channel_log
        refused = Refused(
            FaultCode.RESUME_REFUSED,
            f"no Channel {channel_id} to resume: unknown, expired or not this secret's;"
            " open a new Channel",
        )
        try:
            expected = await log.digest(channel_id)
        except EngineUnavailable as exc:
            raise Refused(FaultCode.RESUME_UNAVAILABLE, f"the bus is unreachable: {exc}") from exc
        if expected is None or not matches(secret, expected):
            raise refused
        try:
            record = ResumeRecord.decode(await log.kept(channel_id))
        except EngineUnavailable as exc:
            raise Refused(FaultCode.RESUME_UNAVAILABLE, f"the bus is unreachable: {exc}") from exc
        lingering = broker.channels.get(channel_id)
        if lingering is not None:
            # The old connection here has not noticed it is gone yet.
            broker.close_channel(lingering, FaultCode.CHANNEL_RESUMED)
        await self._released(channel_id)
        limits = broker.config.channels
        outbox = HeldOutbox(limits.outbox_frames, limits.outbox_bytes, broker.plane)
        # Hold first, then register, in one turn: every frame this broker logs for
        # the Channel from now on is numbered after the newest the hold reports.
        held = log.hold(channel_id)
        channel = broker.channels.adopt(
            channel_id, ChannelKind.WEBSOCKET, outbox, remote=remote, address_key=address_key
        )
        channel.secret_digest = expected
        # As its client counted since it opened (count=2 or not), whatever this
        # connection's URL says: the log's numbers so far agree with that.
        channel.count = record.count
        channel.access = _access(channel.id)
        outbox.start_logging(channel_id)
        broker.router.channel_opened(channel)
        try:
            found = await held
        except EngineUnavailable as exc:
            broker.close_channel(channel)
            raise Refused(FaultCode.RESUME_UNAVAILABLE, f"the bus is unreachable: {exc}") from exc
        if found is None:
            broker.close_channel(channel)
            raise refused
        previous, newest = found
        for group in record.groups:
            # Back in its groups before asbp.resumed: a group Command routed after
            # the client hears it reaches the Channel here.
            broker.channels.join(group, [channel])
        subjects = self._subjects
        if subjects is not None and not subjects.resumed_here(channel):
            subjects.restore(channel, record.subjects)
        await self._subscribe_again(channel, record.subscriptions, record.parked)
        if channel.closed:
            # Resumed again elsewhere while subscribing (another connection won).
            raise refused
        me = broker.broker_id
        # Its Subjects waited at ``home`` and its topic subscriptions fed its log from
        # ``parked``: those brokers let them go; ``previous`` closes its connection.
        told = dict.fromkeys(b for b in (record.home, record.parked, previous) if b and b != me)
        self._record(channel)
        for other in told:
            ask = HANDOVER_ASK if other == record.parked else b""
            envelope = Envelope(EnvelopeKind.RESUMED, me, channel_id, ask)
            try:
                sent = broker.plane.send_to(other, envelope)
            except EngineUnavailable:  # pragma: no cover - the bus went away meanwhile
                continue
            if other == record.parked:
                sent.add_done_callback(functools.partial(self._parked_told, channel_id))
        broker.log.info(
            "channel.resume",
            extra={"channel": channel_id, "remote": remote, "previous": previous or None},
        )
        try:
            await self._replay(channel, write, min(received, newest), newest)
        except BaseException:
            broker.close_channel(channel)
            raise
        return Resumed(channel, outbox)

    async def _released(self, channel_id: str) -> None:
        """Wait until no live broker holds the log or has frames for it on their way
        (``ChannelLog.pending``), for at most the bus lease.

        Where the connection dropped, the outbox's last appends were submitted
        before its release, on one Batcher, so once the log is released they are
        in it. Held now, their appends would be refused (-1) and forwarded here
        as new frames: a frame the client already had would come twice, after
        frames routed since (the numbers of ``newest`` would miss it). Frames
        forwarded to that broker while it held the log and not read by it yet
        are forwarded on into the log once it reads them: held here before
        that, they would arrive after newer frames (issue 11; the release
        barrier, gateway.plane.redis.release_barriers). A holder whose
        connection lingers (it has not noticed the drop) is asked after
        RELEASE_WAIT to close it (LET_GO), which releases the log behind what it
        was sent. A broker that does neither within the lease (one from before
        LET_GO, or a stuck one) is taken from anyway: told with RESUMED, after
        the hold, as before.
        """
        plane = self._broker.plane
        log = plane.channel_log
        me = self._broker.broker_id
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + max(RELEASE_WAIT, plane.lease)
        asked = False
        with contextlib.suppress(EngineUnavailable):
            while waited := await log.pending(channel_id):
                now = loop.time()
                if now >= deadline:
                    _log.warning(
                        "plane.resume_not_released",
                        extra={"channel": channel_id, "broker": waited},
                    )
                    return
                if waited == me and await log.holder(channel_id) == me:
                    return  # held here already (a connection here that never logged)
                if waited != me:
                    if not await plane.alive(waited):
                        return  # the hold salvages what it left
                    if not asked and now >= start + RELEASE_WAIT:
                        asked = True
                        let_go = Envelope(EnvelopeKind.LET_GO, me, channel_id, b"")
                        _unawaited(plane.send_to(waited, let_go), "let_go", channel_id)
                # A release, or the reader passing what was sent before it, is a
                # pipeline or a stream read away: a few of these at most.
                await asyncio.sleep(_RELEASE_CHECK)

    def _let_go(self, channel_id: str) -> None:
        """Another broker waits to resume ``channel_id`` (LET_GO): a connection for it
        here that has not noticed its drop is closed, releasing its log."""
        channel = self._broker.channels.get(channel_id)
        if channel is not None and channel.kind is ChannelKind.WEBSOCKET:
            self._broker.close_channel(channel, FaultCode.CHANNEL_RESUMED)

    async def _replay(
        self, channel: Channel, write: Callable[[bytes], Awaitable[None]], after: int, newest: int
    ) -> None:
        log = self._broker.plane.channel_log
        first = await log.read(channel.id, after, REPLAY_PAGE, 0)
        if first is None:
            raise Refused(
                FaultCode.RESUME_REFUSED,
                f"no Channel {channel.id} to resume: its log expired; open a new Channel",
            )
        lost = max(0, first.lost_through - after)
        if lost:
            message = (
                f"{lost} Commands for Channel {channel.id} passed the log's retention"
                f" before it resumed (numbers {after + 1} to {after + lost}); it carries on"
            )
            await write(asbp.encode(fault_command(FaultCode.RESUME_GAP, message)))
        start = after + lost
        greeting = Command(
            c=RESUMED,
            i=channel.id,
            b=self._broker.broker_id,
            received=str(start),
            lost=str(lost),
            # Subjects follow only where there are any (an Authenticate-Command).
            kept=KEPT if self._subjects is not None else (KEPT[0], KEPT[2]),
        )
        auth = self._broker.router.auth
        kept = sorted(s.id for s in auth.subjects.on_channel(channel)) if auth is not None else []
        if kept:
            # Which Subjects followed it: any other it had ended while it was away.
            greeting = greeting.with_keys(subjects=tuple(kept))
        if channel.count != 1:
            # How the log counts from here (as when it opened): the client follows.
            greeting = greeting.with_keys(count=str(channel.count))
        await write(asbp.encode(greeting))
        page = first
        while True:
            cursor = start
            for number, frame in page.frames:
                if number > newest:
                    return
                await write(frame)
                cursor = number
            if cursor >= newest or not page.frames:
                return
            start = cursor
            # Reading after ``cursor`` also trims what the client now has.
            read = await log.read(channel.id, cursor, REPLAY_PAGE, 0)
            if read is None:
                return
            page = read

    async def _subscribe_again(
        self, channel: Channel, kept: tuple[KeptSubscription, ...], parked: str
    ) -> None:
        """The Channel's subscriptions, here, before ``asbp.resumed``: its parked
        endpoint bound to it again if it dropped from here, the rest subscribed anew
        (with the access of the Subject each was made as, when it followed)."""
        messaging = self._broker.messaging
        timer = self._parked.pop(channel.id, None)
        if timer is not None:
            timer.cancel()
        if not kept and not messaging.parked(channel.id):
            return
        auth = self._broker.router.auth

        def access_of(subject_id: str | None) -> AccessContext:
            if subject_id is not None and auth is not None:
                subject = auth.subjects.get(subject_id)
                if subject is not None and subject.channel is channel:
                    return subject.access
            return channel.access

        # Another broker's parked topic subscriptions feed it until that broker hears
        # of the resume: the new ones hold their notifications back until it answers.
        me = self._broker.broker_id
        hold = bool(parked) and parked != me and any(e.type == "TOPIC" for e in kept)
        if hold:
            self._handovers[channel.id] = asyncio.get_running_loop().call_later(
                self._broker.plane.lease, self._handover, channel.id, b""
            )
        await messaging.resume_channel(
            channel,
            [(entry.type, entry.name, entry.subject) for entry in kept],
            access_of,
            hold=hold,
        )

    def _resumed_elsewhere(self, channel_id: str, broker_id: str) -> None:
        channel = self._broker.channels.get(channel_id)
        if channel is not None and channel.kind is ChannelKind.WEBSOCKET:
            self._broker.close_channel(channel, FaultCode.CHANNEL_RESUMED)
        if self._subjects is not None:
            self._subjects.handed_over(channel_id, broker_id)
        # Its parked topic subscriptions, if any, end here; the handover asked for
        # with this envelope (Remote calls _on_handover next, in the same turn) says
        # which was the last one they sent on.
        self._unparked = (channel_id, self._unpark(channel_id) or "")

    def _on_handover(self, channel_id: str, origin: str, frame: bytes) -> None:
        """A RESUMED envelope's frame: the handover asked of this broker, or answered."""
        if frame != HANDOVER_ASK:
            self._handover(channel_id, frame)
            return
        unparked, self._unparked = self._unparked, None
        last = unparked[1] if unparked is not None and unparked[0] == channel_id else ""
        # The broker it resumed at sends what it held back after ``last`` (this
        # answer follows the frames sent on before it, on the same stream).
        envelope = Envelope(
            EnvelopeKind.RESUMED, self._broker.broker_id, channel_id, (HANDOVER + last).encode()
        )
        with contextlib.suppress(EngineUnavailable):
            self._broker.plane.send_to(origin, envelope)

    def _parked_told(self, channel_id: str, sent: asyncio.Future[bool]) -> None:
        """A parked broker that is gone will not answer: no need to wait for it."""
        if sent.cancelled() or (sent.exception() is None and sent.result()):
            return
        self._handover(channel_id, b"")

    def _handover(self, channel_id: str, frame: bytes) -> None:
        """The parked broker's answer (see :meth:`_resumed_elsewhere`)."""
        timer = self._handovers.pop(channel_id, None)
        if timer is not None:
            timer.cancel()
        text = frame.decode("utf-8", "replace")
        last = text[len(HANDOVER) :] if text.startswith(HANDOVER) else None
        self._broker.messaging.handover(channel_id, last)


def _parse(data: bytes, limits: asbp.Limits) -> tuple[str, str | None, int]:
    """``i``, ``secret`` and ``received`` of an ``asbp.resume``; Refused when it is not one."""
    try:
        command = asbp.decode(data, limits=limits)
    except ProtocolError as exc:
        raise Refused(exc.code, exc.message) from exc
    if command.name != RESUME:
        raise Refused(
            FaultCode.UNEXPECTED_MESSAGE_TYPE,
            f"a WebSocket opened to resume sends {RESUME} first, not {command.name!r}",
        )
    channel_id = command.channel_id
    received = command.get("received") or "0"
    secret = command.get("secret")
    if (
        channel_id is None
        or not isinstance(received, str)
        or not received.isdigit()
        or isinstance(secret, tuple)
    ):
        raise Refused(
            FaultCode.INVALID_MESSAGE_FORMAT,
            f"{RESUME} needs i (the Channel) and received (frames counted, a whole number)",
        )
    return str(channel_id), secret, int(received)


def _access(channel_id: ChannelId) -> AccessContext:
    """What the ACL knows of a Channel: as Broker.open_websocket_channel gives it."""
    return AccessContext(channel_properties=channel_properties(tls=False), channel_id=channel_id)

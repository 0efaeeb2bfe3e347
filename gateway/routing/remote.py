"""Routing across brokers: what the router does when a target is not at this broker.

The router (gateway.routing.router) calls :class:`Remote` only when its own
tables miss: no Tube here serves ``c``, or no Channel here has the ``d``. A
broker alone on its bus has no ``Remote`` at all, so local routing costs what it
always did.

Theory of operation
-------------------
*A User-Agent Command for a Respondent elsewhere* (broker A): the frame the
router would have written to a local Tube (``i`` and ``b`` spliced in) goes to
the routing plane, which hands it to a broker serving ``c`` (broker B). If it
carries ``u``, A keeps it in flight in a table of its own, charged first to a
placeholder and, once the plane says where it went, to that broker. The
deadline there is the Respondent timeout plus the bus lease: B keeps the
same Command in flight with the plain Respondent timeout and faults first
(2103, or 2102 when its Tube closes), and A's deadline only fires when B
cannot say anything. When the plane reports B gone, A faults what B owed with
2102, within the lease.

*The Respondent's broker* (B) stands for the remote Channel with a *proxy*: a
:class:`~gateway.connections.channels.Channel` whose outbox forwards every
frame to A. The Command goes to the least busy Tube for ``c`` (among a
Subject's agents if A said so) and into B's ordinary in-flight table under the
proxy, so the reply with ``d``, a stream's parts, the timeout and the Tube
closing all take the router's ordinary paths; only the final ``offer`` goes
over the bus. Proxies are kept in a bounded LRU: a proxy pushed out still
works for the entries that hold it, and an agent's later ``d`` to that
Channel is looked up on the bus.

What B routes a request by (its name and ``u``) and what A closes its books
by (a whole answer's ``u``) ride beside the frames (``Envelope.name``,
``command_id``; gateway.plane.redis.batches, "Beside the records"), so neither
broker decodes again what the other already decoded; without them (an older
broker, a stream's part) each decodes the frame as before.

*An HTTP Channel on a bus* needs no affinity: any broker serves its client,
and what is sent to it goes into its Channel log in the plane: its requests
travel as ``LOGGED_REQUEST``, whose proxy at the serving broker appends to the
log instead of forwarding to the origin, and ``forward_to_channel`` (an
agent's ``d``) puts a frame for a Channel with a log there in the same call.
The serving broker's books (2103, 2102 when its Tube closes) answer into the
log; the origin keeps the request in flight too, and the serving broker tells
it which of them its books let go of (``REQUESTS_DONE``: one envelope per
origin per loop turn, :meth:`Remote._flush_done`), so that when the serving
broker dies the origin faults those left with 2102, within the lease. (Its
Subjects and groups live at its home broker: gateway.routing.http_bus.)

*An agent's Command for a Channel elsewhere*: ``d`` is looked up and forwarded
by the plane in one call; a Channel that exists nowhere on the bus gets the
agent fault 2104 as a Command, with its ``u``.

*Groups, agents and Subjects across brokers*: a ``g`` goes once to each
broker holding members of its groups, which delivers it to each member once;
``asbp.join``/``asbp.leave`` for a Channel elsewhere goes to its broker (a
forwarded join writes the group's directory entry in the same script, so a
``g`` sent after the acceptance finds it); an agent's Command that no other
Tube here serves goes to a broker that serves it; signing a Subject in goes to
every broker serving the Authenticate-Command
(:mod:`gateway.routing.remote_subjects`).

*Balancing*: ``forward_request`` picks the broker with the fewest Commands in
flight for the name. Each broker reports its count about every second
(:meth:`Remote.report_loads`, from the housekeeping tick), the forward script
counts each Command it places, and this broker lowers the count when the
answer comes back (``request_done``), so a slow broker is passed over within
a round trip.

The routing rules hold across brokers because each check stays where it is:
A checks the User-Agent's ACL and Subject before forwarding; B's router
writes ``a`` and removes ``d`` before anything leaves for a User-Agent.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Final

import asbp
from asbp import ApplicationAgentId, ChannelId, Command, FaultCode, ProtocolError
from asbp.fault_commands import fault_command
from asbp.names import JOIN
from gateway.connections.channels import Channel, ChannelKind, ChannelRegistry
from gateway.connections.log_mailbox import LogMailbox
from gateway.connections.outboxes import StreamOutbox
from gateway.connections.tubes import RespondentTable, Tube
from gateway.plane.base import Envelope, EnvelopeKind, Plane, pick_among
from gateway.routing.inflight import InFlight, InFlightTable
from gateway.routing.remote_subjects import RemoteSubjects
from gateway.routing.replies import ReplySender

__all__ = ["ForwardingOutbox", "Remote"]

#: The envelopes gateway.routing.remote_subjects takes.
_SUBJECT_KINDS: Final = frozenset(
    kind.value
    for kind in (
        EnvelopeKind.SUBJECT_ASK,
        EnvelopeKind.SUBJECT_ASKED,
        EnvelopeKind.SUBJECT_ANSWER,
        EnvelopeKind.SUBJECT_END,
        EnvelopeKind.END_SUBJECT,
    )
)
#: Proxies of remote Channels kept at most (least recently used go first).
MAX_PROXIES: Final = 65_536


class _Placing:
    """What a User-Agent's request forwarded to the bus does once placed, or not:
    the books (``Remote._placed``), then the event log's row if one waits for the
    outcome (``Remote.outcome_later``). One callback for both, so a request costs
    one loop callback when its placing settles, not two."""

    __slots__ = ("_channel", "_command_id", "_name", "_remote", "_subject", "record")

    def __init__(
        self,
        remote: Remote,
        channel: Channel,
        command_id: int | None,
        name: str,
        *,
        subject: bool,
    ) -> None:
        self._remote = remote
        self._channel = channel
        self._command_id = command_id
        self._name = name
        self._subject = subject
        #: Told the fault (None once placed on a broker), after the books.
        self.record: Callable[[int | None], object] | None = None

    def __call__(self, future: asyncio.Future[str | None]) -> None:
        try:
            self._remote._placed(future, self._channel, self._command_id, self._name, self._subject)
        finally:
            record = self.record
            if record is not None:
                placed = (
                    not future.cancelled()
                    and future.exception() is None
                    and future.result() is not None
                )
                record(None if placed else int(FaultCode.NO_RESPONDENT))


class ForwardingOutbox:
    """The outbox of a proxy Channel: every frame goes to the Channel's own broker."""

    __slots__ = (
        "_broker",
        "_channel",
        "_closed",
        "_following",
        "_log",
        "_offered",
        "_plane",
        "_sending",
        "_unsent",
        "logged",
    )

    def __init__(
        self,
        plane: Plane,
        broker_id: str,
        channel_id: str,
        log: logging.Logger,
        *,
        logged: bool = False,
        offered: Callable[[str], object] | None = None,
    ) -> None:
        self._plane = plane
        self._broker = broker_id
        self._channel = channel_id
        self._log = log
        self._closed = False
        #: Told the Channel's id after each frame put in its log: the requests of
        #: the Channel this broker serves may have ended (Remote._logged_offered).
        self._offered = offered
        #: Its broker is gone (:meth:`follow`): frames go wherever the Channel is now.
        self._following = False
        #: The Channel has a Channel log (an HTTP Channel on a bus): frames go
        #: there, whichever broker its client asks next, and survive its origin.
        self.logged = logged
        #: The plane's future for the frame offered last, and the frames it stands
        #: for: the plane gathers a Channel's frames into one call, one future
        #: for them all (gateway.plane.redis.batches.FrameBatch), and one callback
        #: serves them, where a callback a frame was a loop callback a frame.
        self._sending: asyncio.Future[bool] | None = None
        self._unsent: list[Envelope] = []

    @property
    def broker_id(self) -> str:
        """Where the Channel is."""
        return self._broker

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, frame: bytes, command_id: int | None = None) -> bool:
        """Send ``frame`` to the Channel's broker; ``command_id``: the frame is a
        whole answer to that ``u`` (Envelope.command_id: it rides beside the frame,
        so that broker closes its books without decoding it)."""
        if self._closed:
            return False
        if self.logged:
            self._plane.channel_log.append(self._channel, frame).add_done_callback(self._logged)
            if self._offered is not None:
                self._offered(self._channel)
            return True
        envelope = Envelope(
            EnvelopeKind.CHANNEL, self._plane.broker_id, self._channel, frame, (), None, command_id
        )
        if self._following:
            self._plane.forward_to_channel(self._channel, envelope).add_done_callback(
                self._followed
            )
            return True
        sending = self._plane.send_to(self._broker, envelope)
        if sending is self._sending:
            self._unsent.append(envelope)
            return True
        self._sending = sending
        self._unsent = [envelope]
        sending.add_done_callback(functools.partial(self._all_sent, self._unsent))
        return True

    @property
    def following(self) -> bool:
        """Whether its broker is gone and frames follow the Channel (:meth:`follow`)."""
        return self._following

    def follow(self) -> None:
        """The Channel's broker is gone (it stopped, or died): frames owed to the
        Channel follow it from now on, to its log or the broker that resumed it."""
        self._following = True

    def _logged(self, future: asyncio.Future[int]) -> None:
        if future.cancelled() or (future.exception() is None and future.result()):
            return
        # The log expired or the bus is unreachable: only the operator can be told.
        self._log.warning(
            "plane.forward_lost",
            extra={"channel": self._channel, "broker": self._broker},
        )

    def _all_sent(self, envelopes: list[Envelope], future: asyncio.Future[bool]) -> None:
        if self._sending is future:
            self._sending = None  # settled: the next frame is another call's
        if future.cancelled() or (future.exception() is None and future.result()):
            return
        for envelope in envelopes:  # in order, as they were offered
            self._sent(envelope, future)

    def _sent(self, envelope: Envelope, future: asyncio.Future[bool]) -> None:
        if future.cancelled() or (future.exception() is None and future.result()):
            return
        if future.exception() is None:
            # The Channel's broker left the bus (it stopped, or its lease ran out)
            # before the frame got there: a resumable Channel's log or the broker
            # that resumed it takes the frame (gateway.drain), as any forward would.
            self._plane.forward_to_channel(self._channel, envelope).add_done_callback(
                self._followed
            )
            return
        self._followed(future)

    def _followed(self, future: asyncio.Future[str | None] | asyncio.Future[bool]) -> None:
        if future.cancelled() or (
            future.exception() is None and future.result() not in (None, False)
        ):
            return
        # No log and no broker for the Channel (its User-Agent got or gets 2102),
        # or the bus is unreachable: nobody is left to tell but the operator.
        self._log.warning(
            "plane.forward_lost",
            extra={"channel": self._channel, "broker": self._broker},
        )

    @property
    def queued_bytes(self) -> int:
        """Nothing waits here: each frame is handed to the plane as it is offered."""
        return 0

    def on_relief(self, callback: Callable[[], object]) -> None:
        """Never full, so never holds a publisher back (flow control is per broker)."""
        callback()

    def stalled(self) -> None:
        """Nothing to give up on: frames leave as they are offered."""

    def room(self) -> tuple[int, int]:
        # The bus, not this process, bounds what is on its way (the stream's cap).
        return (0, 0) if self._closed else (sys.maxsize, sys.maxsize)

    def when_drained(self, callback: Callable[[], object] | None) -> None:
        if callback is not None:
            callback()

    def close(self) -> None:
        self._closed = True

    def abort(self) -> None:
        self._closed = True


def _settled(future: asyncio.Future[bool]) -> None:
    """A send whose outcome changes nothing: its error is read, so never reported."""
    if not future.cancelled():
        future.exception()


def _placeholder(name: str) -> Tube:
    """A Tube that stands for a whole broker in the in-flight books; it is never written to."""
    outbox = StreamOutbox(1, 1)
    outbox.close()
    # One agent identity for all: the books match an answer by Channel and ``u``.
    return Tube(ApplicationAgentId(""), outbox, remote=name)


class Remote:
    """The router's routes to other brokers; see the module docstring."""

    def __init__(
        self,
        plane: Plane,
        *,
        channels: ChannelRegistry,
        respondents: RespondentTable,
        replies: ReplySender,
        in_flight: InFlightTable,
        limits: asbp.Limits,
        timeout: float,
        log: logging.Logger,
        close_channel: Callable[[Channel], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plane = plane
        #: How a Channel here is closed (the router's ``close_channel``): a CLOSE
        #: envelope closes it exactly as a local close does.
        self._close_channel = close_channel
        self._channels = channels
        self._respondents = respondents
        self._replies = replies
        self._in_flight = in_flight
        self._limits = limits
        self._timeout = timeout
        self._log = log
        #: Commands this broker's User-Agents sent to other brokers, by where they went.
        self.waiting = InFlightTable(timeout=timeout + plane.lease, clock=clock)
        self._unplaced = _placeholder("")
        self._brokers: dict[str, Tube] = {}
        self._proxies: OrderedDict[ChannelId, Channel] = OrderedDict()
        #: The callback of the placing of the request just made, for :meth:`outcome_later`.
        self._placing: _Placing | None = None
        #: Subjects across brokers (gateway.routing.remote_subjects); None while
        #: Subjects are off.
        self.subjects: RemoteSubjects | None = None
        self._turns = itertools.count()
        #: The loads last reported to the plane, by Command-Name.
        self._loads: dict[str, int] = {}
        #: Names other brokers forwarded requests for since the last report: each
        #: forward raised the count in the directory, which a report corrects.
        self._forwarded: set[str] = set()
        #: Requests of HTTP Channels served here, by proxy: their ``u`` whose end
        #: the broker that took them in (any broker: the client goes where it
        #: likes) has not been told of (REQUESTS_DONE), with that broker.
        self._logged_owed: dict[ChannelId, tuple[Channel, dict[int, str]]] = {}
        #: Proxies whose logs got a frame since the last flush of REQUESTS_DONE.
        self._logged_touched: set[ChannelId] = set()
        #: Called with ``i`` when a WebSocket Channel of this broker was resumed at
        #: another (gateway.connections.resume closes its connection here).
        #: Also called with the broker it resumed at.
        self.on_resumed: Callable[[str, str], object] | None = None
        #: Called with ``i``, the sender and the frame of a RESUMED envelope that
        #: carries one: the handover of a resumed Channel's parked topic
        #: subscriptions between brokers (gateway.connections.resume).
        self.on_handover: Callable[[str, str, bytes], object] | None = None
        #: Called with ``i`` of a LET_GO envelope: a broker waits to resume it.
        self.on_let_go: Callable[[str], object] | None = None
        #: Called with a Channel an operator closed here through another broker's
        #: API (an HTTP Channel's log goes too: gateway.routing.http_bus).
        self.on_operator_close: Callable[[Channel], object] | None = None
        respondents.on_first = plane.serving
        respondents.on_last = plane.not_serving
        channels.on_group_first = plane.group_joined
        channels.on_group_last = plane.group_left

    # -- this broker's User-Agents ---------------------------------------------

    def request(
        self,
        channel: Channel,
        command: Command,
        frame: bytes,
        among: tuple[str, ...],
        prefer: tuple[str, ...] = (),
    ) -> None:
        """Send ``frame`` (spliced for a Respondent) to a broker serving ``command.name``:
        one of ``prefer`` if given (a Subject's Command: where its agents said yes)."""
        name = command.name
        assert name is not None
        command_id = command.command_id
        if command_id is not None:
            # An HTTP Channel's answers, faults included, go from the serving
            # broker straight into its log, never through here: that broker says
            # which of them ended (REQUESTS_DONE), so that those left get 2102
            # here if it dies.
            self.waiting.start(channel, command_id, self._unplaced, name)
        kind = (
            EnvelopeKind.LOGGED_REQUEST
            if isinstance(channel.outbox, LogMailbox)
            else EnvelopeKind.REQUEST
        )
        # The name and ``u`` ride beside the frame: the serving broker routes it
        # without decoding it again (gateway.plane.redis.batches, "Beside the records").
        envelope = Envelope(kind, self.plane.broker_id, channel.id, frame, among, name, command_id)
        if prefer:
            placing = self._send_to(pick_among(prefer, next(self._turns)), envelope)
        else:
            placing = self.plane.forward_request(name, envelope)
        placed = _Placing(self, channel, command_id, name, subject=bool(among))
        placing.add_done_callback(placed)
        self._placing = placed

    def _send_to(self, broker_id: str, envelope: Envelope) -> asyncio.Future[str | None]:
        """``plane.send_to``, answering like ``forward_request``: the broker, or None."""
        placing: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()

        def sent(future: asyncio.Future[bool]) -> None:
            if future.cancelled():
                placing.cancel()
            elif future.exception() is not None:
                placing.set_exception(future.exception())  # type: ignore[arg-type]  # checked
            else:
                placing.set_result(broker_id if future.result() else None)

        self.plane.send_to(broker_id, envelope).add_done_callback(sent)
        return placing

    def outcome_later(self, record: Callable[[int | None], object]) -> None:
        """Call ``record`` with the fault of the request just made (None once it is
        placed on a broker), after its fault, if any, went to the User-Agent.

        The event log's row of a Command handed to the bus waits for this, so a Command
        nobody on the bus serves is logged with fault 2101, as on one broker.
        """
        placed, self._placing = self._placing, None
        if placed is None:
            record(None)
            return
        # The request's own callback calls it, after the books (and the fault):
        # one loop callback per request where a second one was added here.
        placed.record = record

    def _placed(
        self,
        future: asyncio.Future[str | None],
        channel: Channel,
        command_id: int | None,
        name: str,
        subject: bool,
    ) -> None:
        if future.cancelled():
            return
        error = future.exception()
        target = None if error is not None else future.result()
        entry = self.waiting.get(channel.id, command_id) if command_id is not None else None
        if target is not None:
            if entry is not None and entry.tube is self._unplaced:
                self.waiting.reassign(entry, self._broker(target))
            return
        if command_id is not None and entry is None:
            return  # answered or closed meanwhile: nothing is owed
        if entry is not None:
            self.waiting.finish(entry)
        if channel.closed:
            return
        if error is not None:
            message = f"the bus is unreachable, so nothing serves {name!r}: {error}"
        else:
            message = f"no Command-Respondent serves {name!r}" + (
                " among the agents that authenticated this Subject" if subject else ""
            )
        self._replies.fault(
            channel, FaultCode.NO_RESPONDENT, message, command_id=command_id, cause=name
        )

    def _broker(self, broker_id: str) -> Tube:
        tube = self._brokers.get(broker_id)
        if tube is None:
            tube = self._brokers[broker_id] = _placeholder(broker_id)
        return tube

    def report_loads(self) -> None:
        """Tell the plane the Commands in flight here per name served, where changed
        (the housekeeping tick calls this: about once a second)."""
        loads = {name: self._respondents.load(name) for name in self._respondents.names()}
        forwarded, self._forwarded = self._forwarded, set()
        for name, load in loads.items():
            if self._loads.get(name) != load or name in forwarded:
                self.plane.report_load(name, functools.partial(self._respondents.load, name))
        self._loads = loads

    def expired(self) -> Iterator[InFlight]:
        """The forwarded Commands whose broker said nothing in time."""
        return self.waiting.expired()

    def channel_opened(self, channel: Channel) -> None:
        self.plane.channel_opened(channel.id)

    def channel_closed(self, channel: Channel) -> None:
        self.plane.channel_closed(channel.id)
        self.waiting.close_channel(channel)

    def lost(self, broker_id: str) -> None:
        """``broker_id`` is gone: what it owed gets 2102, and its proxies go."""
        tube = self._brokers.pop(broker_id, None)
        stranded = self.waiting.served_by(tube) if tube is not None else []
        for entry in stranded:
            self.waiting.finish(entry)
            self._replies.fault(
                entry.channel,
                FaultCode.RESPONDENT_LEFT,
                f"the broker serving {entry.name!r} left before answering",
                command_id=entry.command_id,
                cause=entry.name,
            )
        for proxy in list(self._proxies.values()):
            outbox = proxy.outbox
            # A logged proxy does not depend on its origin: its frames go to the log.
            if (
                isinstance(outbox, ForwardingOutbox)
                and outbox.broker_id == broker_id
                and not outbox.logged
            ):
                # Answers still owed to it follow the Channel (to its log, if it
                # can resume), and are still booked as answers; new requests from
                # it, wherever it resumed, make a proxy of their own (_proxy).
                outbox.follow()
        if self.subjects is not None:
            self.subjects.broker_lost(broker_id)
        self._log.warning(
            "plane.broker_lost", extra={"broker": broker_id, "stranded": len(stranded)}
        )

    # -- other brokers' User-Agents --------------------------------------------

    def proxy(self, channel_id: str) -> Channel | None:
        """The proxy of a remote Channel this broker has served, if it still has it."""
        return self._proxies.get(ChannelId(channel_id))

    def deliver(
        self, proxy: Channel, frame: bytes, command: Command, command_id: int | None
    ) -> None:
        """Leave ``frame`` (``command``, whose ``u`` is ``command_id``, as the
        User-Agent gets it) for ``proxy``; a whole answer (``u``, no ``t``, no
        ``o``) says its ``u`` beside the frame, so the Channel's broker closes its
        books without decoding it (_for_channel)."""
        outbox = proxy.outbox
        if isinstance(outbox, ForwardingOutbox):
            if command_id is not None and ("t" in command or "o" in command):
                command_id = None  # a stream's part: its broker reads t and o itself
            offered = outbox.offer(frame, command_id)
        else:
            offered = outbox.offer(frame)
        if not offered and not proxy.closed:
            self._replies.cut_channel(proxy)

    def _proxy(self, channel_id: str, broker_id: str, *, logged: bool = False) -> Channel:
        key = ChannelId(channel_id)
        proxy = self._proxies.get(key)
        current = proxy.outbox if proxy is not None else None
        if (
            proxy is None
            or proxy.outbox.closed
            # The Channel resumed at another broker: answers go there now.
            or (
                isinstance(current, ForwardingOutbox)
                and not current.logged
                and (current.broker_id != broker_id or current.following)
            )
        ):
            outbox = ForwardingOutbox(
                self.plane,
                broker_id,
                channel_id,
                self._log,
                logged=logged,
                offered=self._logged_offered if logged else None,
            )
            proxy = Channel(key, ChannelKind.REMOTE, outbox, remote=broker_id)
            self._proxies[key] = proxy
            while len(self._proxies) > MAX_PROXIES:
                self._proxies.popitem(last=False)
        else:
            self._proxies.move_to_end(key)
        return proxy

    def to_channel(self, tube: Tube, channel_id: str, frame: bytes, command: Command) -> None:
        """Forward ``frame`` from ``tube`` to the Channel ``channel_id`` wherever it is."""
        envelope = Envelope(EnvelopeKind.CHANNEL, self.plane.broker_id, channel_id, frame)
        self.plane.forward_to_channel(channel_id, envelope).add_done_callback(
            lambda future: self._delivered(future, tube, channel_id, command)
        )

    def _delivered(
        self, future: asyncio.Future[str | None], tube: Tube, channel_id: str, command: Command
    ) -> None:
        if future.cancelled() or tube.closed:
            return
        error = future.exception()
        if error is None and future.result() is not None:
            return
        message = (
            f"no Channel {channel_id} on the bus"
            if error is None
            else f"the bus is unreachable, so Channel {channel_id} was not reached: {error}"
        )
        self._replies.fault_tube(
            tube,
            FaultCode.UNKNOWN_CHANNEL,
            message,
            command_id=command.command_id,
            cause=command.name,
        )

    def to_groups(self, frame: bytes, command: Command) -> None:
        """Forward ``frame`` to the members of ``command``'s groups at other brokers.

        Each broker holding members gets it once and delivers it to each of them
        once, skipping the Channels of ``d`` (they got it by ``d``).
        """
        envelope = Envelope(
            EnvelopeKind.GROUP,
            self.plane.broker_id,
            ",".join(command.destinations),
            frame,
            command.groups,
        )
        self.plane.forward_to_groups(envelope).add_done_callback(self._grouped)

    def _grouped(self, future: asyncio.Future[tuple[str, ...]]) -> None:
        if not future.cancelled() and future.exception() is not None:
            # Members elsewhere missed it; the agent was not promised delivery to
            # a group (a group with no member is not an error either).
            self._log.warning(
                "plane.group_forward_failed", extra={"error": str(future.exception())}
            )

    def membership(
        self,
        tube: Tube,
        name: str,
        groups: list[str],
        channel_ids: list[str],
        acceptance: Command,
    ) -> None:
        """``asbp.join`` or ``asbp.leave`` for Channels at other brokers, then
        ``acceptance`` (or fault 2104 naming those that exist nowhere: the others
        joined) to ``tube`` once every broker concerned has it in its stream."""
        kind = EnvelopeKind.JOIN if name == JOIN else EnvelopeKind.LEAVE
        origin = self.plane.broker_id
        placing = [
            self.plane.forward_to_channel(
                channel_id, Envelope(kind, origin, channel_id, b"", tuple(groups))
            )
            for channel_id in channel_ids
        ]

        def placed(future: asyncio.Future[list[str | BaseException | None]]) -> None:
            if future.cancelled() or tube.closed:
                return
            results = future.result()
            missing = [
                channel_id
                for channel_id, result in zip(channel_ids, results, strict=True)
                if not isinstance(result, str)
            ]
            errors = [result for result in results if isinstance(result, BaseException)]
            if kind is EnvelopeKind.JOIN and missing:
                reason = (
                    f"the bus is unreachable ({errors[0]}), so Channel {', '.join(missing)} "
                    "did not join; the others did"
                    if errors
                    else f"no Channel {', '.join(missing)} on the bus; the others joined"
                )
                self._replies.fault_tube(
                    tube,
                    FaultCode.UNKNOWN_CHANNEL,
                    reason,
                    command_id=acceptance.command_id,
                    cause=name,
                )
                return
            self._replies.send_tube(tube, acceptance)

        asyncio.gather(*placing, return_exceptions=True).add_done_callback(placed)

    def to_agent(self, tube: Tube, frame: bytes, command: Command, via: str | None) -> None:
        """An agent's Command without ``d`` or ``g`` that no other Tube here serves:
        to a broker that serves it, or to ``via`` when the agent named that broker in
        ``b`` (fault 2101 to ``tube`` when none does)."""
        name = command.name
        assert name is not None
        envelope = Envelope(EnvelopeKind.AGENT, self.plane.broker_id, tube.id, frame)
        placing = (
            self._send_to(via, envelope)
            if via is not None
            else self.plane.forward_request(name, envelope)
        )
        placing.add_done_callback(
            lambda future: self._agent_placed(future, tube, name, command.command_id)
        )

    def _agent_placed(
        self,
        future: asyncio.Future[str | None],
        tube: Tube,
        name: str,
        command_id: int | None,
    ) -> None:
        if future.cancelled() or tube.closed:
            return
        error = future.exception()
        if error is None and future.result() is not None:
            return
        message = (
            f"no other Command-Respondent serves {name!r}"
            if error is None
            else f"the bus is unreachable, so nothing else serves {name!r}: {error}"
        )
        self._replies.fault_tube(
            tube, FaultCode.NO_RESPONDENT, message, command_id=command_id, cause=name
        )

    # -- envelopes from other brokers ------------------------------------------

    def inbound(self, envelope: Envelope) -> None:
        """An envelope another broker forwarded here."""
        kind = envelope.kind
        if kind is EnvelopeKind.CHANNEL:
            self._for_channel(envelope)
        elif kind is EnvelopeKind.REQUEST or kind is EnvelopeKind.LOGGED_REQUEST:
            self._for_respondent(envelope)
        elif kind is EnvelopeKind.GROUP:
            self._for_groups(envelope)
        elif kind is EnvelopeKind.AGENT:
            self._for_agent(envelope)
        elif kind.value in _SUBJECT_KINDS:
            if self.subjects is not None:
                self.subjects.inbound(envelope)
        elif kind is EnvelopeKind.TUBE:
            tube = self._respondents.get(envelope.channel)
            if tube is not None and not tube.closed:
                self._replies.send_tube_frame(tube, envelope.frame)
        elif kind is EnvelopeKind.CLOSE:
            self._for_close(envelope)
        elif kind is EnvelopeKind.REQUESTS_DONE:
            self._for_done(envelope)
        elif kind is EnvelopeKind.RESUMED:
            # A frame is the handover of parked topic subscriptions: asked for with
            # the resume (after it is acted on), or answered (``last=<id>``).
            answer = envelope.frame.startswith(b"last=")
            if not answer and self.on_resumed is not None:
                self.on_resumed(envelope.channel, envelope.origin)
            if envelope.frame and self.on_handover is not None:
                self.on_handover(envelope.channel, envelope.origin, envelope.frame)
        elif kind is EnvelopeKind.LET_GO:
            if self.on_let_go is not None:
                self.on_let_go(envelope.channel)
        else:
            self._for_membership(envelope)

    def _for_close(self, envelope: Envelope) -> None:
        """An operator at ``origin`` closes a Channel here (gateway.api.operations)."""
        reason = envelope.frame.decode("utf-8", "replace")
        principal = envelope.among[0] if envelope.among else ""
        channel = self._channels.get(envelope.channel)
        if channel is None:
            # Closed by its client between the lookup at origin and now: nothing to do.
            self._log.info(
                "plane.channel_gone", extra={"channel": envelope.channel, "reason": reason}
            )
            return
        # The same record and fault as a close asked of this broker's own API, and
        # which broker's API was asked.
        self._log.warning(
            "management.write",
            extra={
                "action": "channel.close",
                "principal": principal,
                "channel": channel.id,
                "reason": reason,
                "via": envelope.origin,
            },
        )
        if channel.fault is None:
            # 2104: the Channel is gone; the reason is in the log, with who asked.
            channel.fault = FaultCode.UNKNOWN_CHANNEL
        self._close_channel(channel)
        if self.on_operator_close is not None:
            self.on_operator_close(channel)

    def _for_groups(self, envelope: Envelope) -> None:
        skip = set(envelope.channel.split(",")) if envelope.channel else set()
        for channel in self._channels.members(envelope.among):
            if channel.id not in skip:
                self._replies.deliver(channel, envelope.frame)

    def _for_membership(self, envelope: Envelope) -> None:
        channel = self._channels.get(envelope.channel)
        joining = envelope.kind is EnvelopeKind.JOIN
        for group in envelope.among:
            if channel is None:
                if joining and not self._channels.members((group,)):
                    # The sender wrote this broker into the group's entry; with no
                    # member here after all, it comes out again.
                    self.plane.group_left(group)
            elif joining:
                self._channels.join(group, [channel])
            else:
                self._channels.leave(group, [channel])

    def _for_agent(self, envelope: Envelope) -> None:
        try:
            command = asbp.decode(envelope.frame, limits=self._limits)
        except ProtocolError as exc:
            self._log.warning("plane.bad_envelope", extra={"error": exc.message})
            return
        name = command.name
        if name is None:
            return
        tube = self._respondents.pick(name)
        if tube is not None:
            self._replies.send_tube_frame(tube, envelope.frame)
            return
        # This broker's last Tube for the name left after the sender's broker chose it.
        fault = fault_command(
            FaultCode.NO_RESPONDENT,
            f"no other Command-Respondent serves {name!r}",
            command_id=command.command_id,
            cause=name,
        )
        reply = Envelope(
            EnvelopeKind.TUBE, self.plane.broker_id, envelope.channel, asbp.encode(fault)
        )
        self.plane.send_to(envelope.origin, reply)

    def _for_channel(self, envelope: Envelope) -> None:
        channel = self._channels.get(envelope.channel)
        if channel is None:
            if envelope.origin != self.plane.broker_id:
                # Sent while the Channel was held here and gone by the time it was
                # read: once more, from here, to where it is now (a resumable
                # WebSocket Channel's log, or the broker that resumed it). Once:
                # what this broker forwards is not forwarded again.
                again = Envelope(
                    EnvelopeKind.CHANNEL, self.plane.broker_id, envelope.channel, envelope.frame
                )
                self.plane.forward_to_channel(envelope.channel, again).add_done_callback(
                    functools.partial(self._forwarded_again, envelope.channel)
                )
                return
            self._log.info("plane.channel_gone", extra={"channel": envelope.channel})
            return
        frame = envelope.frame
        self._replies.deliver(channel, frame)
        if channel.in_flight:
            answered = envelope.command_id
            if answered is not None:
                # The serving broker says this frame is a whole answer to ``u``: no
                # decoding, and no stream to follow (as the decoded path below).
                entry = self.waiting.get(channel.id, answered)
                if entry is not None:
                    self.waiting.finish(entry)
                    self.plane.request_done(entry.name, envelope.origin)
                return
            try:
                command = asbp.decode(frame, limits=self._limits)
            except ProtocolError:
                return
            command_id = command.command_id
            if command_id is not None and command_id in channel.in_flight:
                entry = self.waiting.get(channel.id, command_id)
                self.waiting.answered(self._unplaced, channel, command, command_id)
                if entry is not None and self.waiting.get(channel.id, command_id) is not entry:
                    # Answered: the serving broker (the envelope's sender: the
                    # answer may overtake the news of where the request went) has
                    # one fewer on its plate.
                    self.plane.request_done(entry.name, envelope.origin)

    def _logged_offered(self, channel_id: str) -> None:
        """A frame went into the log of an HTTP Channel served here: once this loop
        turn is over, tell the brokers that took its requests in which ended."""
        if channel_id not in self._logged_owed:
            return
        if not self._logged_touched:
            asyncio.get_running_loop().call_soon(self._flush_done)
        self._logged_touched.add(ChannelId(channel_id))

    def _flush_done(self) -> None:
        """One REQUESTS_DONE per broker of origin for what ended this turn."""
        touched, self._logged_touched = self._logged_touched, set()
        ended: dict[str, list[str]] = {}
        for channel_id in touched:
            owed = self._logged_owed.get(channel_id)
            if owed is None:
                continue
            proxy, origins = owed
            finished = [u for u in origins if u not in proxy.in_flight]
            for u in finished:
                ended.setdefault(origins.pop(u), []).append(f"{channel_id}:{u}")
            if not origins:
                del self._logged_owed[channel_id]
        me = self.plane.broker_id
        for origin, pairs in ended.items():
            envelope = Envelope(EnvelopeKind.REQUESTS_DONE, me, "", ",".join(pairs).encode())
            # A broker of origin that is gone needs no word: nothing waits there.
            self.plane.send_to(origin, envelope).add_done_callback(_settled)

    def _for_done(self, envelope: Envelope) -> None:
        """The serving broker ``origin`` let go of these requests: nothing is owed."""
        for pair in envelope.frame.decode("ascii", "replace").split(","):
            channel_id, _, command_id = pair.partition(":")
            if not command_id.isdigit():
                continue
            entry = self.waiting.get(ChannelId(channel_id), int(command_id))
            if entry is not None:
                self.waiting.finish(entry)
                self.plane.request_done(entry.name, envelope.origin)

    def _forwarded_again(self, channel_id: str, future: asyncio.Future[str | None]) -> None:
        if future.cancelled() or (future.exception() is None and future.result() is not None):
            return
        self._log.info("plane.channel_gone", extra={"channel": channel_id})

    def _for_respondent(self, envelope: Envelope) -> None:
        logged = envelope.kind is EnvelopeKind.LOGGED_REQUEST
        proxy = self._proxy(envelope.channel, envelope.origin, logged=logged)
        name = envelope.name
        command_id = envelope.command_id
        if name is None:
            # The sender did not say (an older broker, or a record that lost its
            # meta on the way): the frame's own header says.
            try:
                command = asbp.decode(envelope.frame, limits=self._limits)
            except ProtocolError as exc:
                self._log.warning("plane.bad_envelope", extra={"error": exc.message})
                return
            name = command.name
            if name is None:
                return
            command_id = command.command_id
        self._forwarded.add(name)
        self.plane.request_received(name)
        among = frozenset(ApplicationAgentId(a) for a in envelope.among) if envelope.among else None
        tube = self._respondents.pick(name, among=among)
        if logged and command_id is not None:
            # Owed to the broker that took it in until the books here let go of it.
            owed = self._logged_owed.get(proxy.id)
            if owed is None or owed[0] is not proxy:
                owed = self._logged_owed[proxy.id] = (proxy, {})
            owed[1][command_id] = envelope.origin
        if tube is None:
            self._replies.fault(
                proxy,
                FaultCode.NO_RESPONDENT,
                f"no Command-Respondent serves {name!r}",
                command_id=command_id,
                cause=name,
            )
            return
        if command_id is not None:
            self._in_flight.start(proxy, command_id, tube, name)
        self._replies.send_tube_frame(tube, envelope.frame)

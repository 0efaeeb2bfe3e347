"""The routing plane's interface: the bus-wide directory and forwarding between brokers.

Theory of operation
-------------------
The router (gateway.routing.router) decides with what this broker holds: its
Channels and the Tubes registered at it. The plane is what it asks when the
target is *not* here:

* **The directory** says where things are: which broker holds each Channel
  (``channel_opened`` / ``channel_closed``) and which brokers hold Tubes
  registered for each Command-Name (``serving`` / ``not_serving``, announced
  by the Respondent table when a name gains its first Tube or loses its last).
  Every entry belongs to the broker that announced it and lives only as long
  as that broker's *lease*, which the broker renews; a broker that dies drops
  out of every lookup within ``lease`` seconds, and its leftovers are swept
  by the survivors. The *address index* says which brokers hold Subjects
  signed in with each Conversation-Address (``address_held`` /
  ``address_released``), so a Command addressed ``r=alice*example.org``
  (courses/) reaches alice on whichever broker her Channels are.
  ``claim_channel`` takes a Channel whose holder died, for one broker only.
* **Forwarding** hands an :class:`Envelope` to another broker: a User-Agent
  Command for a Respondent (``forward_request``: the plane picks a live
  broker serving the name), Commands for a Channel (``forward_to_channel``:
  the plane finds its broker) and, once the broker is known, anything for it
  (``send_to``). The frame inside is the one the router would have written to
  a local outbox, so ``i``, ``s``, ``b`` and ``u`` arrive intact and nothing is
  encoded twice.

Every announcement is fire and forget and every forward returns a future: the
router never awaits the plane, and it calls the plane only when the target is
not local, so a Command whose target is here costs exactly what it did before
the plane existed. When the plane reports that a broker it talked to is gone
(``lost``), the router faults what that broker owed (2102).

*The Channel log* (:class:`ChannelLog`, the plane's ``channel_log``) keeps, per
Channel and bus-wide, an ordered and bounded retention of the Commands routed
to it: numbered from 1 (the numbers HTTP long-polls acknowledge as
``ASBP-Seq``), read after a number from any broker, acknowledged (trimmed),
woken across brokers within milliseconds, expired when idle, and held to the
bus's :class:`LogRetention` (time, Commands, bytes). What retention drops
before it was acknowledged is reported as a gap (``LogRead.lost_through``), so
a reader always knows what it missed. The log also keeps the digest of the
Channel's secret, so that any broker can check a client's credential.

Implementations: :mod:`gateway.plane.memory` (brokers in one process; a single
broker by default, where the router never calls it at all) and
:mod:`gateway.plane.redis` (many brokers on one Redis).
tests/conformance/plane/ runs one suite on both.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, Protocol

from gateway.engines.base import EngineUnavailable

__all__ = [
    "DEFAULT_LEASE",
    "Balance",
    "ChannelListing",
    "ChannelLog",
    "Envelope",
    "EnvelopeKind",
    "Inbound",
    "LogRead",
    "LogRetention",
    "Lost",
    "Plane",
    "PlaneUnavailable",
]

#: Seconds within which a dead broker drops out of the directory, by default.
DEFAULT_LEASE: Final = 10.0


class PlaneUnavailable(EngineUnavailable):
    """The plane cannot reach the other brokers (Redis down): a forward may not have happened."""


class EnvelopeKind(enum.Enum):
    """What a forwarded frame is, and so what the receiving broker does with it.

    ``w`` is taken: the Redis plane's wake-up of a parked Channel-log reader.
    """

    #: A User-Agent Command for a Respondent at the receiving broker; its answers
    #: go back to ``origin`` as ``CHANNEL`` envelopes.
    REQUEST = "q"
    #: A frame for the Channel ``channel`` at the receiving broker, ready to deliver.
    CHANNEL = "c"
    #: The Channel ``channel`` at the receiving broker joins the groups ``among``.
    JOIN = "j"
    #: The Channel ``channel`` at the receiving broker leaves the groups ``among``.
    LEAVE = "l"
    #: A frame for the members of the groups ``among`` at the receiving broker, but
    #: not the Channels listed in ``channel`` (joined by ","): those got it by ``d``.
    GROUP = "g"
    #: An agent's Command for a Respondent at the receiving broker (agent to agent,
    #: no ``d``), from the Tube ``channel`` at ``origin``: to the least busy Tube
    #: serving its name, nothing kept in flight.
    AGENT = "a"
    #: A frame (a fault) for the Tube ``channel`` at the receiving broker.
    TUBE = "t"
    #: Subjects (gateway.routing.remote_subjects). The Authenticate-Command
    #: ``frame`` for the agents at the receiving broker; ``channel`` is ``s``.
    SUBJECT_ASK = "s"
    #: The agents asked about ``s`` (``channel``): ``among`` is Tube, agent, ...
    SUBJECT_ASKED = "r"
    #: An agent's answer (``frame``) about ``s``; ``among`` is its Tube and agent.
    SUBJECT_ANSWER = "n"
    #: ``s`` ended: ``frame`` is the notice for the agents that authenticated it.
    SUBJECT_END = "e"
    #: A REQUEST from a Channel with a Channel log (an HTTP Channel on a bus): its
    #: answers go into that log (``channel_log.append``), not back to ``origin``.
    LOGGED_REQUEST = "h"
    #: An operator closes the Channel ``channel`` at the receiving broker (the
    #: management API of ``origin`` was asked): ``frame`` is the reason (UTF-8),
    #: ``among`` the principal who asked, for the receiving broker's log.
    CLOSE = "x"
    #: An operator ends the Subject ``channel`` (its ``s``) if it lives at the
    #: receiving broker (the management API of ``origin`` was asked and sent it to
    #: every live broker); ``among`` is the principal who asked. Not SUBJECT_END,
    #: the notice a Subject's own broker sends once it has ended one.
    END_SUBJECT = "z"
    #: A Command addressed by ``r`` (courses/), ``p`` already stamped by the broker
    #: that took it in, for the Subjects at the receiving broker holding the
    #: Conversation-Addresses ``among``; ``channel`` is the crossing's id, if any.
    ADDRESSED = "p"
    #: An agent's Command with ``r`` for the Subject ``s`` at the receiving broker,
    #: from the Tube ``channel`` at ``origin``, ``a`` set there to the agent's
    #: verified identity; faults go back to that Tube as TUBE envelopes.
    FOR_SUBJECT = "f"
    #: The WebSocket Channel ``channel`` was resumed at ``origin``: the receiving
    #: broker closes its own connection for it, if it still has one (fault 2112).
    #: Its ``frame`` (gateway.connections.resume, the handover): ``handover?`` asks
    #: the broker where its topic subscriptions were parked for the id of the last
    #: publication it forwarded to it, and ``last=<id>`` is that broker's answer.
    RESUMED = "m"
    #: A Command from the HTTP Channel ``channel`` for the broker where its Subjects
    #: and groups live (its *home*, the directory's entry for it): ``origin``
    #: checked the Channel's secret and hands ``frame`` on as the client sent it
    #: (gateway.routing.http_bus).
    HTTP_COMMAND = "v"
    #: The requests from HTTP Channels at the receiving broker (their ``origin``
    #: side) that this broker's books no longer hold (answered, faulted or
    #: timed out): ``frame`` is ``<i>:<u>`` pairs joined by ",", so that the
    #: broker that took each request in faults only those left (2102) when this
    #: broker dies (gateway.routing.remote).
    REQUESTS_DONE = "k"
    #: The WebSocket Channel ``channel`` is resuming at ``origin``, which waits for
    #: the receiving broker to let go of its log first: a connection for it still
    #: open there (its drop not noticed yet) is closed (fault 2112), and the log
    #: released behind the frames already on their way to it (ChannelLog.pending).
    LET_GO = "y"


class Envelope(NamedTuple):
    """One frame forwarded from broker ``origin`` to another broker.

    A named tuple, not a frozen dataclass: as immutable, and made several times per
    forwarded round trip (the request at its origin and as its reader unpacks it,
    the answer likewise), where a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``: about 0.8 µs a construction against 0.25
    (bench/README.md, "Beside the records").
    """

    kind: EnvelopeKind
    #: The Broker-Identifier of the broker that forwarded it.
    origin: str
    #: The Channel-Identifier the frame comes from (REQUEST) or goes to (CHANNEL).
    channel: str
    #: The encoded Command, exactly as a local outbox would have got it.
    frame: bytes
    #: REQUEST: the Application-Agents allowed to answer (a Subject's), or empty;
    #: JOIN, LEAVE and GROUP: the groups; ADDRESSED: the Conversation-Addresses.
    among: tuple[str, ...] = ()
    #: REQUEST and LOGGED_REQUEST: the frame's Command-Name, when the sender says
    #: it (the receiving broker then need not decode the frame to route it: the
    #: sender's router decoded it already); None: decode it.
    name: str | None = None
    #: With ``name``: the frame's ``u``, or None when it has none. CHANNEL: when
    #: set, the frame is a whole answer (no ``t``, no ``o``) to the Command ``u``
    #: of the Channel, which the receiving broker's books close without decoding
    #: it; None: decode it.
    command_id: int | None = None


@dataclass(frozen=True, slots=True)
class ChannelListing:
    """A page of the bus's Channels, in identifier order (``Plane.channel_page``)."""

    #: Channels of live brokers on the whole bus.
    total: int
    #: ``(channel id, broker id)``, at most the ``limit`` asked for.
    channels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class LogRetention:
    """What a Channel log keeps at most, bus-wide: the oldest Commands go first."""

    #: Seconds a Command stays in the log unacknowledged.
    max_age: float = 600.0
    #: Commands per Channel.
    max_frames: int = 10_000
    #: Bytes of Commands per Channel (the newest Command is kept even if larger).
    max_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogRead:
    """What a read of a Channel log found."""

    #: ``(number, frame)`` after the number asked for, oldest first.
    frames: tuple[tuple[int, bytes], ...]
    #: The number of the newest Command ever appended (0: none).
    last_seq: int
    #: The newest number that retention dropped before it was acknowledged
    #: (0: none): a reader that had read only up to a lower number lost
    #: ``reader's number + 1 .. lost_through``.
    lost_through: int


class ChannelLog(Protocol):
    """Per Channel, the Commands routed to it, bus-wide; see the module docstring.

    Writes (``open``, ``append``, ``acknowledge``, ``drop``) are submitted at
    once and return futures the caller need not await: routing never waits
    for the log. A broker's writes reach the log in the order it made them, so
    a read made after an append sees it.
    """

    @property
    def retention(self) -> LogRetention:
        """What every Channel's log keeps at most."""
        ...

    def open(self, channel_id: str, *, digest: bytes, idle: float) -> asyncio.Future[None]:
        """Start the log of ``channel_id``, empty, holding the digest of its secret.

        The log (and the Channel, bus-wide) expires after ``idle`` seconds without
        an append, a read or a ``touch``.
        """
        ...

    def append(self, channel_id: str, frame: bytes) -> asyncio.Future[int]:
        """Append ``frame``; the future: its number, or 0 when no such log exists.

        Behind another broker's release barrier (``pending``) the frame waits until
        the barrier lifts and is numbered then: the future is positive all the same.
        """
        ...

    def acknowledge(self, channel_id: str, through: int) -> asyncio.Future[None]:
        """Forget every Command numbered ``through`` or less (the reader has them)."""
        ...

    def drop(self, channel_id: str) -> asyncio.Future[None]:
        """Forget the log of ``channel_id`` altogether (the Channel closed)."""
        ...

    async def digest(self, channel_id: str) -> bytes | None:
        """The digest given to ``open``, or None when no such log exists (it also touches it)."""
        ...

    async def read(self, channel_id: str, after: int, limit: int, wait: float) -> LogRead | None:
        """Acknowledge through ``after``, then up to ``limit`` Commands numbered above it.

        When there are none, waits up to ``wait`` seconds for one to be appended
        at any broker. None when no such log exists (never opened, dropped or expired).
        """
        ...

    # A WebSocket Channel that can resume (gateway.connections.resume) is *held*
    # by the broker its connection is on: while held, a frame routed to it goes
    # to that broker (``append`` returns 0 for it), which delivers it and logs it
    # with ``held_append`` in the order it delivered; released (the connection
    # dropped, or its holder died), frames go into the log as for an HTTP Channel.

    def hold(self, channel_id: str) -> asyncio.Future[tuple[str, int] | None]:
        """This broker holds the log from now on (it touches it too).

        The future: the broker that held it before ('' none) and the number of
        the newest Command in it, or None when no such log exists.
        """
        ...

    async def holder(self, channel_id: str) -> str:
        """The broker holding the log now ('' none, or no such log).

        A resume waits for the previous holder to release it (its connection
        closed there): its last appends are in the log by then
        (gateway.connections.resume)."""
        ...

    async def pending(self, channel_id: str) -> str:
        """Whom a resume waits for before it holds the log ('' nobody, or no such log).

        The broker holding it; else the broker that released it last, until that
        broker has handled every frame for the Channel that was on its way to it
        when it released it (forwarded to it while it held the log: it forwards
        them on, into the log, in order). Frames routed after those go into the log
        after them, so a resume that waits for '' replays them all in order. A
        broker that died is passed over: its unread frames for the Channel go
        into the log first (where the implementation can tell that it died).
        """
        ...

    def held_append(self, channel_id: str, frames: Sequence[bytes]) -> asyncio.Future[int]:
        """Append ``frames``, in order, if this broker holds the log: the number of
        the last, 0 (no such log) or -1 (another broker holds it now: none appended)."""
        ...

    def release(self, channel_id: str) -> asyncio.Future[None]:
        """Stop holding the log, if this broker holds it; it expires when idle from now.

        Until this broker has handled the frames already on their way to it, the
        log is ``pending`` on it (a release barrier)."""
        ...

    # What a resumable Channel takes with it (gateway.connections.resume_state): a
    # small record kept beside its log, read by the broker it resumes on, gone
    # with the log.

    def keep(self, channel_id: str, record: bytes) -> asyncio.Future[None]:
        """Replace the record kept with the log of ``channel_id`` (nothing if no log)."""
        ...

    async def kept(self, channel_id: str) -> bytes:
        """The record kept with the log of ``channel_id``; empty when none or no log."""
        ...


#: Called with each envelope that arrives for this broker, on the event loop.
Inbound = Callable[[Envelope], None]
#: Called with the Broker-Identifier of a broker this one talked to, once it is gone;
#: or with this broker's own, when the bus took it for dead while it ran (a stalled
#: loop outlived its lease) and it is about to take its lease back: what it held may
#: have been given to others meanwhile, so it fences itself first (gateway.fence).
Lost = Callable[[str], None]


class Plane(Protocol):
    """The bus-wide directory and forwarding; see the module docstring."""

    @property
    def broker_id(self) -> str:
        """This broker's Broker-Identifier."""
        ...

    @property
    def spans_brokers(self) -> bool:
        """Whether other brokers may exist: False lets the router never call the plane."""
        ...

    @property
    def bus_id(self) -> str:
        """The bus's identifier, the same at every broker on it (known once started).

        Agents read it from the ``asbp.tube`` greeting (``bus``): one Tube per bus
        is enough to reach every Channel and group on it, and a Command with ``g``
        sent on two Tubes of one bus would reach each member twice.
        """
        ...

    @property
    def lease(self) -> float:
        """Seconds within which a dead broker's entries stop being found."""
        ...

    @property
    def channel_log(self) -> ChannelLog:
        """The bus-wide Channel logs (usable once the plane has started)."""
        ...

    async def start(self, inbound: Inbound, lost: Lost) -> None:
        """Join the bus: take the lease, read envelopes for this broker.

        Raises:
            PlaneUnavailable: the bus cannot be reached.
        """
        ...

    async def close(self) -> None:
        """Leave the bus: drop this broker's entries and stop reading (idempotent)."""
        ...

    def channel_opened(self, channel_id: str) -> None:
        """The Channel ``channel_id`` is at this broker from now on."""
        ...

    def channel_closed(self, channel_id: str) -> None:
        """The Channel ``channel_id`` is gone from this broker."""
        ...

    def claim_channel(self, channel_id: str) -> asyncio.Future[str]:
        """Make this broker the holder of ``channel_id`` unless a live broker holds it.

        A compare-and-set of the directory's entry, atomic bus-wide: it is swapped
        for this broker only if it names no broker, this one, or a broker whose
        lease ran out. So when several brokers find a Channel's holder dead at
        once (the visitors of an HTTP Channel whose home died:
        gateway.routing.http_bus), exactly one of them takes it over; the others
        learn which.

        Returns:
            A future: the holder afterwards (this broker's identifier: it won). It
            fails with PlaneUnavailable when the bus cannot be reached.
        """
        ...

    def serving(self, name: str) -> None:
        """Tubes at this broker serve ``name`` from now on."""
        ...

    def not_serving(self, name: str) -> None:
        """No Tube at this broker serves ``name`` any more."""
        ...

    def written(self) -> asyncio.Future[None]:
        """A future that is done once every announcement made so far is in the
        directory, where every broker's lookups find it.

        ``asbp.register`` is accepted only then, so a User-Agent Command sent on
        any broker once the agent knows it serves a name cannot get 2101. It
        fails with PlaneUnavailable when the bus cannot be reached.
        """
        ...

    def report_load(self, name: str, in_flight: Callable[[], int]) -> None:
        """Report this broker's Commands in flight for ``name``: what
        ``forward_request`` balances by (each broker reports about every second).

        ``in_flight`` is called when the report is written, not before, so a
        report never lands after a write it is older than (the origin lowering the
        count for an answer that left here later). Requests forwarded here and not
        yet read count on top, so a report never forgets them either."""
        ...

    def request_received(self, name: str) -> None:
        """A request for ``name`` forwarded here was read (see ``report_load``)."""
        ...

    def request_done(self, name: str, broker_id: str) -> None:
        """A request for ``name`` that ``forward_request`` gave ``broker_id`` is
        answered (or faulted): its count there goes down at once, not at the next
        report, so balancing follows a slow broker within a round trip."""
        ...

    def group_joined(self, group: str) -> None:
        """Channels at this broker are members of ``group`` from now on."""
        ...

    def group_left(self, group: str) -> None:
        """No Channel at this broker is a member of ``group`` any more."""
        ...

    def address_held(self, address: str) -> None:
        """Subjects at this broker hold the Conversation-Address ``address`` from now
        on (announced when the address gains its first Subject here)."""
        ...

    def address_released(self, address: str) -> None:
        """No Subject at this broker holds ``address`` any more."""
        ...

    async def address_brokers(self, address: str) -> frozenset[str]:
        """The live brokers holding Subjects with the Conversation-Address ``address``."""
        ...

    async def alive(self, broker_id: str) -> bool:
        """Whether ``broker_id`` holds a lease on the bus now."""
        ...

    async def locate_channel(self, channel_id: str) -> str | None:
        """The live broker holding the Channel, or None."""
        ...

    async def channel_page(self, after: str, offset: int, limit: int) -> ChannelListing:
        """The bus's Channels at live brokers, by identifier: skipping ``offset``
        of those after ``after`` ("": from the first), at most ``limit``.

        For the management API, never on a Command's path. On Redis one script
        over a sorted set of identifiers kept beside the directory, so a page
        costs its offset and size, not the size of the bus. It reads the
        directory as written: await ``written()`` first to see this broker's
        latest announcements.

        Raises:
            PlaneUnavailable: the bus cannot be reached.
        """
        ...

    async def group_brokers(self, group: str) -> frozenset[str]:
        """The live brokers holding members of ``group``."""
        ...

    async def respondents(self, name: str) -> frozenset[str]:
        """The live brokers holding Tubes registered for ``name``."""
        ...

    def forward_request(self, name: str, envelope: Envelope) -> asyncio.Future[str | None]:
        """Hand ``envelope`` to a live broker other than this one serving ``name``.

        Balanced ``in_flight`` (the default): the broker with the fewest Commands in
        flight for ``name`` (its last report, plus one for each Command forwarded to
        it since), ties taken in turn; ``turns``: each in turn.

        Returns:
            A future: that broker's identifier, or None when no other broker serves it.
            It fails with PlaneUnavailable when the bus cannot be reached.
        """
        ...

    def forward_to_channel(self, channel_id: str, envelope: Envelope) -> asyncio.Future[str | None]:
        """Hand ``envelope`` to the live broker holding ``channel_id``.

        A JOIN also writes that broker into the directory of each group it names,
        before the envelope is read there: a GROUP forwarded once the join's future
        is done finds the broker (and, on the same stream, arrives after the join).

        Returns:
            A future: that broker's identifier, or None when no live broker holds it.
        """
        ...

    def forward_to_servers(self, name: str, envelope: Envelope) -> asyncio.Future[tuple[str, ...]]:
        """Hand ``envelope`` to every live broker other than this one serving ``name``.

        Returns:
            A future: the brokers it went to.
        """
        ...

    def forward_to_groups(self, envelope: Envelope) -> asyncio.Future[tuple[str, ...]]:
        """Hand the GROUP ``envelope`` to every live broker other than this one
        holding members of its groups (``envelope.among``), once each.

        Returns:
            A future: the brokers it went to.
        """
        ...

    def send_to(self, broker_id: str, envelope: Envelope) -> asyncio.Future[bool]:
        """Hand ``envelope`` to ``broker_id``; the future says False if it is gone."""
        ...


#: How ``forward_request`` picks among brokers (gateway.config.model.BusBalance).
Balance = Literal["in_flight", "turns"]


def pick_least(loads: Mapping[str, int], turn: int) -> str:
    """The candidate with the least load; among equals, the one whose turn is next
    (sorted, so every broker agrees on the order)."""
    ordered = sorted(loads)
    best = ordered[turn % len(ordered)]
    for k in range(1, len(ordered)):
        candidate = ordered[(turn + k) % len(ordered)]
        if loads[candidate] < loads[best]:
            best = candidate
    return best


def pick_among(candidates: Collection[str], turn: int) -> str:
    """One of ``candidates``, taking turns (sorted, so every broker agrees on the order)."""
    ordered = sorted(candidates)
    return ordered[turn % len(ordered)]

"""Courses: Commands addressed ``local*domain`` within this bus and across to others.

Theory of operation
-------------------
A Subject that an agent signed in with a Conversation-Address (``p``, §7.3.1) is
reachable as that address. A User-Agent Command with ``r`` (and the sending
Subject's ``s``) reaches the router, which hands it here (:meth:`Courses.route`):

1. The sender must be a Subject with an address (2212 otherwise). ``p`` becomes
   that address, whatever the sender wrote; ``x`` is kept; ``course.*`` keys the
   sender wrote are dropped (they are the buses' own).
2. Recipients are grouped by domain. Those of this bus's domain go to every
   Subject holding the address, on whichever broker of the bus it is (2201 per
   address nobody holds): this broker's Subjects from its registry's address
   index, the others' through the routing plane's (``address_brokers``), one
   ADDRESSED envelope per broker holding any of them. On a bus the lookup makes
   delivery asynchronous, so the Commands awaiting one are chained: those that ask
   in one loop turn are looked up together (each address once) on the next, each
   batch is delivered after the one before it, and a sender's order holds. Every other
   domain gets one copy (``r`` narrowed to its recipients) in the queue of the
   Course that reaches it (2202 if none does; 2211 if the peer's policy refuses
   it; 2209 if the queue is full), sent by courses.link.
3. The receiving bus (courses.endpoint, :meth:`Courses.accept_batch`) drops a copy it has
   seen, refuses a loop (its domain in ``course.via``, 2208) or a hop too many
   (2207), delivers to its Subjects or passes it on to a further domain (never back
   to the one it came from), remembers the id and acknowledges it.
4. Faults the receiving bus finds go back to ``p`` as ``asbp.fault`` Commands,
   addressed by ``r``, through the same queues: they too survive an outage. A fault
   is never answered with a fault, so none can circle.

Replies are Commands too: the recipient answers with ``r`` set to the ``p`` it got.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol

import asbp
from asbp import Command, FaultCode, ProtocolError
from asbp.fault_commands import fault_command
from asbp.names import FAULT, NOTIFICATION
from courses.credential import SigningKey
from courses.link import Crossing, OutboundCourse
from courses.seen import MemorySeen, RedisSeen, Seen
from courses.settings import CourseSettings
from courses.wire import (
    BROKER_KEYS,
    DELIVERED,
    ID_KEY,
    VIA_KEY,
    crossing_from,
    domain_of,
    recipients_of,
    split_by_domain,
    via_of,
    with_subject,
)
from gateway.acl import AccessContext
from gateway.auth.credentials import AgentCredentials
from gateway.connections.channels import Channel
from gateway.connections.subjects import Subject
from gateway.connections.tubes import Tube
from gateway.engines.base import Engine
from gateway.plane.base import Envelope, EnvelopeKind, Plane, PlaneUnavailable

__all__ = ["AddressHolders", "Courses", "LocalReplies"]

#: What ``asbp.encode`` allows by default: a splice stays within it too.
_LIMITS: Final = asbp.Limits()
_MAX_HEADER_BYTES: Final = _LIMITS.max_header_bytes
#: Keys a Command loses on its way out of this bus: the sender's and this broker's.
_LOCAL_KEYS = ("s", "i", "a", "b", "d", "g", *BROKER_KEYS)
#: What a crossing's sender stores beside it (never changed: courses.link copies it).
_NOTIFY_DELIVERED: Final[Mapping[str, str]] = MappingProxyType({"notice": DELIVERED})
_NOTIFY_NONE: Final[Mapping[str, str]] = MappingProxyType({})


class LocalReplies(Protocol):
    """What the Courses need of the router: leave frames and faults for Channels
    and faults for Tubes."""

    def deliver(self, channel: Channel, frame: bytes) -> None: ...

    def fault(
        self,
        channel: Channel,
        code: FaultCode,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None: ...

    def fault_tube(
        self,
        tube: Tube,
        code: FaultCode,
        message: str,
        *,
        command_id: int | None = None,
        cause: str | None = None,
    ) -> None: ...


class AddressHolders(Protocol):
    """Where the Subjects at this broker are found by Conversation-Address
    (gateway.connections.subjects.SubjectRegistry)."""

    def holding(self, address: str) -> list[Subject]: ...


#: Conversation-Address -> the other brokers of the bus holding Subjects with it.
Located = Mapping[str, frozenset[str]]


class Courses:
    """This bus's domain, its outbound Courses and the delivery of addressed Commands.

    Args:
        settings: the ``[courses]`` table, checked.
        engine: where the per-domain queues live.
        replies: the router's outboxes and faults.
        subjects: this broker's Subjects by address; None: no Subjects here.
        plane: the bus's routing plane, when other brokers may hold Subjects;
            None: this broker is alone on its bus.
        may_cross: whether a Subject (its access context) may send to a domain (the
            ACL's ``COURSE`` rows); None: every Subject may.
        allow_plain: the Tubes' dev flag: ``ws://`` between loopback addresses.
        redis_url: the engine's Redis (the seen ids survive a restart); None: memory.
        log: the broker's logger.
    """

    def __init__(
        self,
        settings: CourseSettings,
        *,
        engine: Engine,
        replies: LocalReplies,
        subjects: AddressHolders | None,
        plane: Plane | None = None,
        may_cross: Callable[[AccessContext, str], bool] | None = None,
        allow_plain: bool,
        redis_url: str | None,
        log: logging.Logger,
    ) -> None:
        self.settings = settings
        self.domain = settings.domain
        self.allow_plain = allow_plain
        self.signing = SigningKey(settings.signing_key, domain=settings.domain, kid=settings.kid)
        #: Verifies the credentials of peers dialling in (courses.endpoint).
        self.credentials = AgentCredentials(
            {peer.domain: peer.keys for peer in settings.peers.values()},
            audience=settings.domain,
            max_lifetime=max(settings.credential_lifetime, 1.0) + 1,
        )
        self.seen: Seen = (
            RedisSeen(redis_url, settings.dedupe_window)
            if redis_url is not None
            else MemorySeen(settings.dedupe_window)
        )
        #: Whether :meth:`accept_batch` needs no round trip (the claims in this
        #: process, no routing plane to ask): the Course endpoint then accepts a
        #: message on the server's read path rather than in its task
        #: (courses.endpoint).
        self.accepts_at_once = redis_url is None and plane is None
        self._replies = replies
        self._subjects = subjects
        self._plane = plane
        #: The last delivery awaiting a lookup: the next one is made after it.
        self._tail: asyncio.Future[None] | None = None
        #: The deliveries asking for a lookup in this loop turn: looked up together
        #: (each address once, in one round of calls) on the next.
        self._batch: (
            list[tuple[Command, tuple[str, ...], Callable[[FaultCode, str], None]]] | None
        ) = None
        #: Deliveries awaiting a lookup, bounded by ``lookup_max_commands``.
        self.awaiting_lookup = 0
        self._may_cross = may_cross
        #: The broker's logger.
        self.log = self._log = log
        self.links = {
            domain: OutboundCourse(
                settings,
                peer,
                signing=self.signing,
                engine=engine,
                allow_plain=allow_plain,
                on_done=self._crossed,
                log=log,
            )
            for domain, peer in settings.peers.items()
        }
        #: Crossings accepted from peers, and repeats dropped, for the metrics.
        self.accepted = 0
        self.duplicates = 0
        self.spoofed = 0
        self._pending: set[asyncio.Future[Any]] = set()
        self._stopped = False
        #: ``course.id`` values: 32 hex digits, a random half per process and a count
        #: (unique per sending bus, restarts included, at a fraction of a random id's
        #: cost per crossing).
        self._id_prefix = os.urandom(8).hex()
        self._ids = itertools.count()
        #: ``course.via`` of a Command leaving from this bus: never changed (read only
        #: by crossing_from and the encoder), so made once.
        self._left_here = [self.domain]

    def peers(self) -> list[tuple[str, bool, int, int, int]]:
        """Per peer dialled: (domain, up, queued, sent, acknowledged), for the metrics."""
        return [
            (domain, link.connected.is_set(), link.depth, link.sent, link.acknowledged)
            for domain, link in self.links.items()
            if link.peer.urls
        ]

    async def start(self) -> None:
        """Start dialling the peers."""
        for link in self.links.values():
            await link.start()

    async def stop(self) -> None:
        """Stop dialling; queued Commands stay queued. Idempotent (the server and the
        lifespan both call it)."""
        if self._stopped:
            return
        self._stopped = True
        for link in self.links.values():
            await link.stop()
        if self._pending:
            await asyncio.wait(self._pending)
        await self.seen.close()

    # -- from this bus's User-Agents ------------------------------------------------

    def route(
        self,
        channel: Channel,
        subject: Subject | None,
        command: Command,
        frame: bytes | None = None,
    ) -> None:
        """A Command with ``r`` from a User-Agent: to its recipients, here or across.
        ``frame``: the bytes it arrived in, from which its crossings are spliced
        (courses.wire.crossing_from) rather than encoded."""

        def refuse(code: FaultCode, message: str) -> None:
            # ``u`` and ``c`` read only for a fault: none in the common case.
            self._replies.fault(
                channel, code, message, command_id=command.command_id, cause=command.name or ""
            )

        self._route(subject, command, refuse, frame)

    def route_for_agent(self, tube: Tube, subject: Subject | None, command: Command) -> None:
        """A Command with ``r`` from an Application-Agent, sent for ``subject`` (one
        that agent signed in at this broker: the router checked): ``p`` is the
        Subject's address, and faults go to the agent's Tube."""
        command_id = command.command_id
        name = command.name or ""

        def refuse(code: FaultCode, message: str) -> None:
            self._replies.fault_tube(tube, code, message, command_id=command_id, cause=name)

        self._route(subject, command, refuse)

    def route_for(
        self,
        subject: Subject,
        command: Command,
        refuse: Callable[[FaultCode, str], None],
    ) -> None:
        """A Command with ``r`` sent for ``subject`` by an agent on another broker of
        the bus (the router checked it signed the Subject in); faults to ``refuse``."""
        self._route(subject, command, refuse)

    def _route(
        self,
        subject: Subject | None,
        command: Command,
        refuse: Callable[[FaultCode, str], None],
        frame: bytes | None = None,
    ) -> None:
        if subject is None or subject.address is None:
            refuse(
                FaultCode.NO_ADDRESS,
                "'r' needs 's' of a Subject signed in with a Conversation-Address",
            )
            return
        address = subject.address
        may_cross = self._may_cross
        # Dropping the UA's own keys and stamping ``p`` changes none of ``c``, ``r``,
        # ``x`` or ``notice``: they are read from the Command as it came.
        by_domain = split_by_domain(recipients_of(command))
        if may_cross is not None:
            access = subject.access
            for domain in by_domain:
                if domain != self.domain and not may_cross(access, domain):
                    # Checked before anything is sent, so a refusal sends nothing at all.
                    refuse(FaultCode.ACCESS_DENIED, f"sending to {domain} is denied")
                    return
        built: list[Command] = []

        def stamped() -> Command:
            """The Command as it goes on: the UA's own keys dropped, ``p`` stamped."""
            if not built:
                outbound = command.without_keys(*(k for k in _LOCAL_KEYS if k in command))
                built.append(outbound.with_keys(p=address))
            return built[0]

        if frame is not None and self.domain not in by_domain:
            # Every recipient is on other buses, and each crossing is spliced from the
            # bytes the UA sent (courses.wire.crossing_from): the stamped Command is
            # built only for a crossing that cannot be spliced, two copies of the
            # Command saved per crossing in the common case.
            self._send(
                command,
                via=(),
                came_from=None,
                refuse=refuse,
                sent=(frame, command),
                by_domain=by_domain,
                publisher=address,
                stamped=stamped,
            )
            return
        self._send(
            stamped(),
            via=(),
            came_from=None,
            refuse=refuse,
            sent=(frame, command) if frame is not None else None,
            by_domain=by_domain,
        )

    # -- from other brokers of this bus ---------------------------------------------------

    def forwarded(self, envelope: Envelope) -> None:
        """An ADDRESSED envelope: for the Subjects here holding ``envelope.among``."""
        try:
            command = asbp.decode(envelope.frame)
        except ProtocolError as exc:  # pragma: no cover - a broker of this bus encoded it
            self._log.warning("course.bad_envelope", extra={"error": exc.message})
            return

        def gone(code: FaultCode, message: str) -> None:
            # Its Subjects ended between the sender's lookup and now: within the
            # plane's own round trip, as a Channel closing under a forward.
            self._log.info("course.address_gone", extra={"code": int(code), "reason": message})

        self._deliver_here(command, envelope.among, gone, located={})

    # -- from peer buses ---------------------------------------------------------------

    async def locate(self, commands: Iterable[Command]) -> Located | None:
        """Where this bus's recipients of ``commands`` are, in one round of lookups
        (a batch of crossings: :meth:`accept_batch` then needs none); None off a bus.

        Raises:
            PlaneUnavailable: the bus cannot be reached.
        """
        if self._plane is None:
            return None
        wanted: dict[str, None] = {}
        for command in commands:
            for address in split_by_domain(recipients_of(command)).get(self.domain, ()):
                wanted[address] = None
        return await self._locate(wanted) if wanted else {}

    async def accept_batch(
        self,
        peer: str,
        crossings: Sequence[tuple[str, Command, bytes | None]],
        *,
        located: Located | None = None,
    ) -> None:
        """The crossings of one message from ``peer``, each as (``course.id``,
        Command, the bytes it arrived in), in order: each delivered or passed on,
        or dropped if it is a repeat; one claim for them all
        (:meth:`Seen.claim_many`: one Redis round trip, not one per crossing).

        The bytes are what recipients' frames are spliced from
        (courses.wire.with_subject) rather than encoded again. ``located``: from
        :meth:`locate`, made before the claim; None: looked up here.

        The batch is claimed before any of it is delivered, and all of it is handed to
        outboxes and to the other brokers' streams with no await after the claim, so
        a receiver killed mid-batch has either claimed nothing (the peer sends it
        all again) or lost the Channels it was delivering to as well, as one claim
        per crossing does (docs/courses.md, "Store and forward").

        Returns once all are accepted (delivered here, or stored for the next
        Course), when the peer may be acknowledged.
        """
        if not crossings:
            return
        if self._plane is not None:
            # Looked up before the claim, so that between the claim and handing the
            # Commands to outboxes and to the other brokers' streams there is no
            # await. Off a bus (one broker) there is nothing to look up.
            own = [
                address
                for _, command, _ in crossings
                for address in split_by_domain(recipients_of(command)).get(self.domain, ())
            ]
            if own and (located is None or any(address not in located for address in own)):
                located = await self._locate(dict.fromkeys(own))
        # Claimed before delivery, with no await between the claim and handing the
        # Commands to the Channels' outboxes: a receiver killed after the claim has
        # lost those Channels too, while one that delivered has always claimed, so a
        # copy resent after a crash is never delivered twice (docs/courses.md).
        claims = await self.seen.claim_many(peer, [crossing_id for crossing_id, _, _ in crossings])
        waits: list[asyncio.Future[Any]] = []
        for (_, command, frame), claimed in zip(crossings, claims, strict=True):
            if claimed:
                self._accept_claimed(peer, command, frame, located, waits)
            else:
                self.duplicates += 1
        # Stored for the next Course (or refused, and then faulted): accepted. The
        # crossings stored in one loop turn share one future.
        for wait in dict.fromkeys(waits):
            await asyncio.gather(wait, return_exceptions=True)

    def _accept_claimed(
        self,
        peer: str,
        command: Command,
        frame: bytes | None,
        located: Located | None,
        waits: list[asyncio.Future[Any]],
    ) -> None:
        """A crossing claimed: delivered or passed on, with no await (the futures of
        what must be stored first are added to ``waits``)."""
        via = via_of(command)
        publisher = command.publisher
        looped = self.domain in via
        if (not looped and publisher is not None and domain_of(publisher) == self.domain) or (
            not via or via[-1] != peer
        ):
            # A peer speaking for this bus's own users, or hiding where it came from:
            # dropped (and acknowledged, so it is not sent again), never answered,
            # since an answer would go to the user it spoofed.
            self._log.warning(
                "course.spoofed",
                extra={"peer": peer, "publisher": publisher, "via": ",".join(via)},
            )
            self.spoofed += 1
            return
        built: list[Command] = []

        def bare() -> Command:
            """The Command without the crossing's keys: built only if it is encoded
            (a recipient's frame that cannot be spliced, another broker, another
            bus); delivered here, each frame is spliced from the crossing's bytes."""
            if not built:
                built.append(command.without_keys(*(k for k in _LOCAL_KEYS if k in command)))
            return built[0]

        def refuse(code: FaultCode, message: str) -> None:
            name = command.name or ""
            self._log.info(
                "course.refused_command",
                extra={"peer": peer, "code": int(code), "reason": message, "command": name},
            )
            if name == FAULT or publisher is None:
                return  # a fault is never answered with a fault
            fault = fault_command(code, message, command_id=command.command_id, cause=name)
            self._send(
                fault.with_keys(r=[publisher]),
                via=(),
                came_from=None,
                refuse=lambda *_: None,
                waits=waits,
            )

        if looped:
            # Back where it started: the fault goes to its sender, a user of this bus.
            refuse(
                FaultCode.COURSE_LOOP,
                f"the Command came back to {self.domain} (via {', '.join(via)})",
            )
        elif len(via) > self.settings.max_hops:
            refuse(
                FaultCode.HOP_LIMIT,
                f"the Command crossed {len(via)} Courses; at most {self.settings.max_hops}",
            )
        else:
            received = (frame, command) if frame is not None else None
            by_domain = split_by_domain(recipients_of(command))
            own = by_domain.get(self.domain)
            if (
                own is not None
                and len(by_domain) == 1
                and (self._plane is None or located is not None)
            ):
                # All for this bus, nothing to look up (the common case): straight to
                # its Subjects, without the checks of a Command going further.
                self._deliver_here(
                    command,
                    own,
                    refuse,
                    located=located,
                    waits=waits,
                    received=received,
                    stamped=bare,
                )
            else:
                # c, r, x, p and notice read the same on the crossing as on ``bare``.
                self._send(
                    command,
                    via=via,
                    came_from=peer,
                    refuse=refuse,
                    waits=waits,
                    located=located,
                    received=received,
                    by_domain=by_domain,
                    stamped=bare,
                )
        self.accepted += 1

    # -- both ---------------------------------------------------------------------------

    def _send(
        self,
        command: Command,
        *,
        via: tuple[str, ...],
        came_from: str | None,
        refuse: Callable[[FaultCode, str], None],
        waits: list[asyncio.Future[Any]] | None = None,
        located: Located | None = None,
        received: tuple[bytes, Command] | None = None,
        sent: tuple[bytes, Command] | None = None,
        by_domain: Mapping[str, tuple[str, ...]] | None = None,
        publisher: str | None = None,
        stamped: Callable[[], Command] | None = None,
    ) -> None:
        """``command`` to each of its recipients: this bus's Subjects (``located``:
        the other brokers holding them, if already looked up) or one copy per domain.
        ``received``: the crossing's bytes and Command, to splice from; ``sent``:
        the bytes and Command a User-Agent sent, which ``command`` is made from
        (its own keys removed, ``p`` stamped), to splice crossings from;
        ``by_domain``: its recipients split by domain, if the caller already did.

        ``stamped``: given when ``command`` is not yet the Command as it goes on
        (a UA's Command as sent, every recipient on other buses, with ``publisher``
        the ``p`` to stamp; or a crossing as received, its keys still in): makes
        that Command, called only where it must be encoded rather than spliced."""
        name = command.name or ""
        recipients = recipients_of(command)
        if by_domain is None:
            by_domain = split_by_domain(recipients)
        if publisher is None:
            publisher = command.publisher or ""
        for domain, addresses in by_domain.items():
            if domain == self.domain:
                if self._plane is None or located is not None:
                    self._deliver_here(
                        command,
                        addresses,
                        refuse,
                        located=located,
                        waits=waits,
                        received=received,
                        stamped=stamped,
                    )
                else:
                    self._deliver_later(
                        command if stamped is None else stamped(), addresses, refuse
                    )
                continue
            peer = self.settings.course_for(domain)
            if peer is None:
                for address in addresses:
                    refuse(FaultCode.NO_COURSE, f"no Course reaches {domain} (for {address})")
                continue
            if peer.domain == came_from:
                refuse(
                    FaultCode.COURSE_LOOP,
                    f"{domain} is reached over the Course the Command came from",
                )
                continue
            if name != FAULT:
                why = peer.permits(name, command.exchange_name, addresses)
                if why is not None:
                    refuse(FaultCode.COURSE_NOT_PERMITTED, why)
                    continue
            crossing_id = f"{self._id_prefix}{next(self._ids):016x}"
            crossed = [*via, self.domain] if via else self._left_here
            # Read back when it is done, so the common case (acknowledged, no notice
            # asked for) costs no decoding of the frame.
            notify = _NOTIFY_DELIVERED if command.get("notice") == DELIVERED else _NOTIFY_NONE
            link = self.links[peer.domain]
            whole = len(addresses) == len(recipients)
            frame = (
                crossing_from(
                    sent[0],
                    sent[1],
                    publisher,
                    crossed,
                    crossing_id,
                    limits=_LIMITS,
                )
                if sent is not None and whole
                else None
            )
            if frame is not None:
                stored = link.submit_frame(crossing_id, frame, notify=notify, refuse=refuse)
            else:
                keys: dict[str, Any] = {VIA_KEY: crossed, ID_KEY: crossing_id}
                if not whole:
                    # Narrowed to this domain's; when they are all of it (the common
                    # case), ``r`` stays as it was and is not checked a second time.
                    keys["r"] = list(addresses)
                outbound = command if stamped is None else stamped()
                stored = link.submit(outbound.with_keys(keys), notify=notify, refuse=refuse)
            if stored is not None:
                # One future per loop turn's store, shared by its crossings: kept
                # until done so that stopping waits for it.
                pending = self._pending
                if stored not in pending:
                    pending.add(stored)
                    stored.add_done_callback(pending.discard)
                if waits is not None:
                    waits.append(stored)

    async def _locate(self, addresses: Iterable[str]) -> dict[str, frozenset[str]]:
        """The other brokers of the bus holding each of ``addresses``.

        Raises:
            PlaneUnavailable: the bus cannot be reached.
        """
        plane = self._plane
        assert plane is not None
        wanted = tuple(addresses)
        found = await asyncio.gather(*(plane.address_brokers(a) for a in wanted))
        me = plane.broker_id
        return {a: brokers - {me} for a, brokers in zip(wanted, found, strict=True)}

    def _deliver_later(
        self,
        command: Command,
        addresses: tuple[str, ...],
        refuse: Callable[[FaultCode, str], None],
    ) -> None:
        """``_deliver_here`` once the plane said where ``addresses`` are, after every
        delivery started before it (a sender's order holds); fault 2106 past
        ``lookup_max_commands`` of them, since each holds its Command until then."""
        limit = self.settings.lookup_max_commands
        if self.awaiting_lookup >= limit:
            refuse(
                FaultCode.TOO_MANY_IN_FLIGHT,
                f"{limit} Commands already wait here for the bus to say where their addresses are",
            )
            return
        self.awaiting_lookup += 1
        batch = self._batch
        if batch is not None:
            batch.append((command, addresses, refuse))
            return
        batch = self._batch = [(command, addresses, refuse)]
        previous = self._tail

        async def later() -> None:
            # Started on the next loop turn: every delivery that asked for a lookup in
            # this one is in ``batch``, and its addresses are looked up together (one
            # pipeline on the redis plane, each address once however many Commands
            # name it) rather than one lookup per Command.
            self._batch = None
            located: Located | None
            try:
                try:
                    located = await self._locate(
                        dict.fromkeys(a for _, addresses, _ in batch for a in addresses)
                    )
                except PlaneUnavailable:
                    located = None
                if previous is not None:
                    await asyncio.wait([previous])
            finally:
                self.awaiting_lookup -= len(batch)
            for command, addresses, refuse in batch:
                if located is None:
                    # This broker's Subjects still get it; the others cannot be found.
                    self._deliver_here(
                        command,
                        addresses,
                        refuse,
                        located={},
                        unknown=(
                            FaultCode.ENGINE_UNAVAILABLE,
                            "the bus's address index cannot be reached",
                        ),
                    )
                else:
                    self._deliver_here(command, addresses, refuse, located=located)

        task = asyncio.ensure_future(later())
        self._tail = task
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _deliver_here(
        self,
        command: Command,
        addresses: tuple[str, ...],
        refuse: Callable[[FaultCode, str], None],
        *,
        located: Located | None,
        waits: list[asyncio.Future[Any]] | None = None,
        unknown: tuple[FaultCode, str] | None = None,
        received: tuple[bytes, Command] | None = None,
        stamped: Callable[[], Command] | None = None,
    ) -> None:
        """To the Subjects here holding ``addresses``, and to the brokers ``located``
        holding them elsewhere (one envelope each); ``unknown``: the fault for an
        address found nowhere (2201 by default); ``stamped``: as for :meth:`_send`.

        An ``asbp.notification`` carrying a ``receipt`` is refused (3201): it is a
        queue delivery, which only a broker sends its own Channels, and a client
        counting queue deliveries apart (``count=2``) would not count it, though
        the Channel's log numbers it. This bus's brokers refuse it where it starts
        (gateway.routing.router); one can still come over a Course from an older
        peer bus."""
        if "receipt" in command and command.name == NOTIFICATION:
            refuse(
                FaultCode.ACCESS_DENIED,
                f"an {NOTIFICATION} carrying a 'receipt' is a queue delivery, which only"
                " the broker sends: relay it without the receipt (or under another key)",
            )
            return
        registry = self._subjects
        elsewhere: dict[str, list[str]] = {}
        if located:
            for address in addresses:
                brokers = located.get(address)
                if brokers:
                    for broker_id in sorted(brokers):
                        elsewhere.setdefault(broker_id, []).append(address)
        if elsewhere:
            self._forward(command if stamped is None else stamped(), elsewhere, refuse, waits)
        # A Subject holds one address, so it is met once unless an address repeats
        # under another spelling: tracked only when there are several.
        delivered: set[str] | None = set() if len(addresses) > 1 else None
        deliver = self._replies.deliver
        for address in addresses:
            subjects = registry.holding(address) if registry is not None else ()
            if not subjects:
                if not any(address in held for held in elsewhere.values()):
                    code, message = unknown or (
                        FaultCode.UNKNOWN_ADDRESS,
                        f"no Subject at {self.domain} is {address}",
                    )
                    refuse(code, message)
                continue
            for subject in subjects:
                if delivered is not None:
                    if subject.id in delivered:
                        continue
                    delivered.add(subject.id)
                frame = (
                    with_subject(
                        received[0],
                        received[1],
                        subject.id,
                        max_header_bytes=_MAX_HEADER_BYTES,
                    )
                    if received is not None
                    else None
                )
                if frame is None:
                    outbound = command if stamped is None else stamped()
                    try:
                        frame = asbp.encode(outbound.with_keys(s=subject.id))
                    except ProtocolError as exc:
                        refuse(exc.code, exc.message)
                        return
                deliver(subject.channel, frame)

    def _forward(
        self,
        command: Command,
        elsewhere: Mapping[str, list[str]],
        refuse: Callable[[FaultCode, str], None],
        waits: list[asyncio.Future[Any]] | None,
    ) -> None:
        """One ADDRESSED envelope to each broker holding some of the addresses."""
        plane = self._plane
        assert plane is not None
        try:
            frame = asbp.encode(command)
        except ProtocolError as exc:  # pragma: no cover - it decoded at this size
            refuse(exc.code, exc.message)
            return
        for broker_id, addresses in elsewhere.items():
            envelope = Envelope(
                EnvelopeKind.ADDRESSED, plane.broker_id, "", frame, tuple(addresses)
            )
            sent = plane.send_to(broker_id, envelope)
            self._pending.add(sent)

            def done(future: asyncio.Future[bool], addresses: list[str] = addresses) -> None:
                self._pending.discard(future)
                if future.cancelled():
                    return
                exc = future.exception()
                if exc is not None:
                    refuse(FaultCode.ENGINE_UNAVAILABLE, f"the bus cannot be reached: {exc}")
                elif not future.result():
                    for address in addresses:
                        refuse(
                            FaultCode.UNKNOWN_ADDRESS,
                            f"the broker holding {address} at {self.domain} is gone",
                        )

            sent.add_done_callback(done)
            if waits is not None:
                waits.append(sent)

    def _crossed(self, crossing: Crossing) -> None:
        """A crossing was acknowledged or expired: tell its sender, if it asked or failed."""
        if crossing.delivered and "notice" not in crossing.headers:
            return
        try:
            command = asbp.decode(crossing.frame)
        except ProtocolError:  # pragma: no cover - we encoded it
            return
        publisher = command.publisher
        name = command.name or ""
        if publisher is None or name == FAULT:
            return
        if crossing.delivered:
            if command.get("notice") != DELIVERED:
                return
            header: dict[str, Any] = {
                "c": "asbp.notice",
                "event": DELIVERED,
                "r": [publisher],
                ID_KEY: crossing.id,
            }
            if command.command_id is not None:
                header["u"] = command.command_id
            notice = Command(header)
        else:
            notice = fault_command(
                FaultCode.COURSE_EXPIRED,
                f"not accepted by {', '.join(sorted(split_by_domain(recipients_of(command))))} "
                f"within {self.settings.max_age:g} seconds",
                command_id=command.command_id,
                cause=name,
            ).with_keys(r=[publisher])
        self._send(notice, via=(), came_from=None, refuse=lambda *_: None)

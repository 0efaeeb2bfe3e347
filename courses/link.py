"""One outbound Course: the queue for a peer domain, drained over a WebSocket to it.

Theory of operation
-------------------
Every Command for the peer is first stored in the engine's queue ``course <domain>``
(a name no client can write: it holds a space), then sent from there: while the
Course is down it waits, in order, bounded in count and bytes; on the ``redis``
engine it survives a broker restart. As NATS gateways do, a bus sends only on the
Course it dialled, and receives on the one the peer dialled.

The sender leases up to ``window`` crossings from the queue and sends them; the peer
acknowledges each once it has accepted it, and only then is it removed from the
queue. When the link drops, the leases are released and the same crossings go again,
first, on the next link: the peer drops copies it has seen (courses.seen), so each is
accepted once. Reconnection waits ``backoff_min`` doubled per failure up to
``backoff_max``, each wait drawn from its upper half (jitter), so buses restarted
together do not dial in step.

On the ``memory`` engine (whose queue is this process's, every crossing reaching it
through :meth:`OutboundCourse.submit_frame`), the crossings a loop turn stored are
sent by the store itself when the link is up, its window has room and the pump task
is idle: leased and written in that same callback, with no wake-up of the pump (an
event, a task step and an awaited fetch per Course message). Nothing else changes:
they are leased from the queue as the pump leases them, held in the same in-flight
table until acknowledged, and released to the head of the queue when the link drops.
Only one of the two sends at a time (the pump is idle, and a send of the store that
had to wait for the socket is awaited by the pump before its own), so the order of
the queue is the order on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias, runtime_checkable
from urllib.parse import urlsplit

from websockets.exceptions import WebSocketException

import asbp
from asbp import Command, FaultCode, ProtocolError
from courses.credential import SigningKey, answer_jti
from courses.settings import CourseSettings, PeerSettings
from courses.transport import CourseSocket, Dialler
from courses.wire import ACK, HELLO, ID_KEY, pack
from gateway.auth.credentials import AgentCredentials, CredentialRefused
from gateway.engines.base import (
    Delivery,
    Engine,
    EngineLimits,
    Message,
    NoticeEvent,
    QueueFull,
    new_message,
)
from gateway.errors import LocalError
from gateway.messaging.eager import start_eagerly
from gateway.tasks import cancel_and_wait

__all__ = ["CourseRefusedError", "Crossing", "OutboundCourse", "queue_name"]

#: Seconds one fetch waits for a crossing before the sender looks again.
_FETCH_WAIT: Final = 0.5
_LOOPBACK: Final = frozenset({"127.0.0.1", "::1", "localhost"})
_NO_NOTICES: Final[frozenset[NoticeEvent]] = frozenset()

#: Where a refusal goes: the sender's fault (code, message).
Refuse: TypeAlias = Callable[[FaultCode, str], None]
#: A crossing submitted in this loop turn: (course.id, frame, notify, refuse).
_Submitted: TypeAlias = tuple[str, bytes, Mapping[str, str], Refuse]


class _Live:
    """The link up now, as the store's own sending path needs it (see the module's
    docstring): its socket, its in-flight crossings and whether the pump is idle."""

    __slots__ = ("consumer", "idle", "in_flight", "room", "sending", "ws")

    def __init__(
        self,
        ws: CourseSocket,
        in_flight: dict[str, Delivery],
        room: asyncio.Event,
        consumer: str,
    ) -> None:
        self.ws = ws
        self.in_flight = in_flight
        self.room = room
        self.consumer = consumer
        #: Whether the pump waits for a wake-up (and for nothing else): the store
        #: may send then.
        self.idle = False
        #: The store's last send, if it had to wait for the socket to drain: the
        #: pump awaits it before sending, and the store sends nothing until it is done.
        self.sending: asyncio.Future[None] | None = None


@runtime_checkable
class _StoresMany(Protocol):
    """An engine that stores several messages in one call, done on return
    (gateway.engines.memory's ``enqueue_many``)."""

    @property
    def limits(self) -> EngineLimits: ...

    def enqueue_many(self, messages: Sequence[Message]) -> list[Exception | None]: ...


def queue_name(domain: str) -> str:
    """The engine queue holding the Commands for ``domain``."""
    return f"course {domain}"


@dataclass(frozen=True, slots=True)
class Crossing:
    """What the sender learns about a crossing when it is done."""

    #: The ``course.id``.
    id: str
    #: The encoded Command.
    frame: bytes
    #: Whether it was acknowledged (True) or expired (False).
    delivered: bool
    #: What the sender stored beside it (``notice`` when a notice was asked for).
    headers: Mapping[str, str]


class CourseRefusedError(LocalError):
    """The peer's answer did not verify (a wrong domain, key or handshake): logged
    (``course.answer_refused``) and retried with backoff, never sent anywhere."""


class OutboundCourse:
    """The queue for one peer and the link that drains it.

    Args:
        settings: this bus's Course settings.
        peer: the peer dialled.
        signing: this bus's signing key.
        engine: where the queue lives.
        allow_plain: ``ws://`` to a loopback address allowed (the Tubes' dev flag).
        on_done: called for each crossing expired, and for each acknowledged whose
            sender asked for a notice.
        log: the broker's logger.
    """

    def __init__(
        self,
        settings: CourseSettings,
        peer: PeerSettings,
        *,
        signing: SigningKey,
        engine: Engine,
        allow_plain: bool,
        on_done: Callable[[Crossing], None],
        log: logging.Logger,
    ) -> None:
        self.peer = peer
        self.queue = queue_name(peer.domain)
        self._settings = settings
        self._signing = signing
        self._engine = engine
        self._allow_plain = allow_plain
        self._on_done = on_done
        self._log = log
        self._verifier = AgentCredentials(
            {peer.domain: peer.keys},
            audience=settings.domain,
            max_lifetime=max(settings.credential_lifetime, 1.0) + 1,
        )
        #: Commands waiting (or in flight), and their bytes, for the bounds.
        self.depth = 0
        self.bytes = 0
        #: Crossings sent and acknowledged, for the metrics.
        self.sent = 0
        self.acknowledged = 0
        #: Set while a link is up.
        self.connected = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Whether the link up (or last up) runs on HTTP/2 (RFC 8441); None: never up.
        self.http2: bool | None = None
        self._dialler = Dialler(ca=settings.ca, http2=peer.http2)
        #: Crossings submitted in this loop turn, and the future of their store.
        self._batch: list[_Submitted] = []
        self._stored: asyncio.Future[None] | None = None
        #: The engine calls made for them, when it stores one message per call.
        self._calls: list[asyncio.Future[None]] = []
        self._stores_many = engine if isinstance(engine, _StoresMany) else None
        #: The link up now (memory engine only): see :meth:`_send_stored`.
        self._live: _Live | None = None
        #: Course messages sent, by the pump and by the store (for the tests and
        #: the benchmark: crossings per message).
        self.messages = 0
        self.sent_by_store = 0
        #: Sends of the store that waited for the socket to drain.
        self.store_sends_waited = 0

    async def start(self) -> None:
        """Count what the queue already holds and start dialling (if there are URLs)."""
        self.depth = await self._engine.depth(self.queue)
        if self.peer.urls:
            self._task = asyncio.create_task(self._run(), name=f"asbp-course-{self.peer.domain}")

    async def stop(self) -> None:
        """Stop dialling; what is queued stays queued."""
        self._stopping.set()
        if self._task is not None:
            await cancel_and_wait(self._task)

    def submit(
        self, command: Command, *, notify: Mapping[str, str], refuse: Refuse
    ) -> asyncio.Future[None] | None:
        """Queue ``command`` for the peer with its ``course.id`` (a fresh one if it
        has none); as :meth:`submit_frame`."""
        given = command.get(ID_KEY)
        if isinstance(given, str):
            # Set by the caller along with its own keys: one Command built, not two.
            crossing_id = given
        else:
            crossing_id = uuid.uuid4().hex
            command = command.with_keys(**{ID_KEY: crossing_id})
        try:
            frame = asbp.encode(command)
        except ProtocolError as exc:
            refuse(exc.code, exc.message)
            return None
        return self.submit_frame(crossing_id, frame, notify=notify, refuse=refuse)

    def submit_frame(
        self, crossing_id: str, frame: bytes, *, notify: Mapping[str, str], refuse: Refuse
    ) -> asyncio.Future[None] | None:
        """Queue a crossing already encoded, with ``crossing_id`` as its ``course.id``
        (courses.wire.crossing_from).

        It is stored at the end of this loop turn together with every crossing
        submitted in the turn, in one call to an engine that has one (the memory
        engine's ``enqueue_many``; another's ``enqueue`` is called now, one per
        crossing), and sent no sooner.
        Returns the future of that store, shared by the turn's crossings, done once
        each is stored or refused; None when it is refused at once (past the
        queue's bounds). A refusal is told to ``refuse``: 2209 past the bounds,
        2005 when the engine cannot store it.
        """
        settings = self._settings
        if (
            self.depth >= settings.queue_max_commands
            or self.bytes + len(frame) > settings.queue_max_bytes
        ):
            refuse(FaultCode.COURSE_QUEUE_FULL, f"the queue for {self.peer.domain} is full")
            return None
        self.depth += 1
        self.bytes += len(frame)
        self._batch.append((crossing_id, frame, notify, refuse))
        if self._stores_many is None:
            # An engine without a call for several (redis): its call made now, in
            # order, as the Commands of this turn make theirs, so that its batcher
            # sends them in the same round trip; settled together at the turn's end.
            self._calls.append(self._enqueue(crossing_id, frame, notify))
        stored = self._stored
        if stored is None:
            loop = asyncio.get_running_loop()
            stored = self._stored = loop.create_future()
            # After the callbacks already due in this turn (the rest of a read's
            # Commands, the rest of a Course message's crossings): one store for all,
            # which on the memory engine also sends them (_send_stored) or wakes the
            # pump.
            loop.call_soon(self._store)
        return stored

    def _enqueue(
        self, crossing_id: str, frame: bytes, notify: Mapping[str, str]
    ) -> asyncio.Future[None]:
        """One crossing stored by the engine's ``enqueue``, started now."""
        now = time.time()
        headers = {**notify, "expires": repr(now + self._settings.max_age)}
        awaitable = self._engine.enqueue(
            new_message(
                crossing_id, self.queue, frame, now, None, 4, None, None, _NO_NOTICES, headers
            )
        )
        if isinstance(awaitable, asyncio.Future):
            return awaitable
        assert isinstance(awaitable, Coroutine), awaitable
        return start_eagerly(awaitable)

    def _store(self) -> None:
        """Store the crossings submitted in the last loop turn, in order, in one call
        (or settle the calls made for them)."""
        batch, self._batch = self._batch, []
        stored, self._stored = self._stored, None
        assert stored is not None
        many = self._stores_many
        if many is None:
            calls, self._calls = self._calls, []
            gathered = asyncio.gather(*calls, return_exceptions=True)

            def settled(done: asyncio.Future[list[BaseException | None]]) -> None:
                if done.cancelled():
                    outcomes: list[BaseException | None] = [asyncio.CancelledError()] * len(batch)
                else:
                    outcomes = done.result()
                self._settle(batch, outcomes, stored)

            gathered.add_done_callback(settled)
            return
        now = time.time()
        queue = self.queue
        # One headers mapping for the crossings that asked for no notice: a
        # message's headers are never changed once stored.
        plain = {"expires": repr(now + self._settings.max_age)}
        # The engine's own expiration, as it would set it (its ``default_ttl``), so
        # that it stores the message as given rather than a copy with one; the
        # Course's ``max_age`` is judged by the sender (``expires``).
        expiration = now + many.limits.default_ttl
        messages = [
            new_message(
                crossing_id,
                queue,
                frame,
                now,
                expiration,
                4,
                None,
                None,
                _NO_NOTICES,
                {**notify, **plain} if notify else plain,
            )
            for crossing_id, frame, notify, _ in batch
        ]
        try:
            outcomes: list[BaseException | None] = list(many.enqueue_many(messages))
        except Exception as exc:  # the engine closed: none was stored
            outcomes = [exc] * len(messages)
        self._settle(batch, outcomes, stored, wake=False)
        if not self._send_stored():
            self._wake.set()

    def _settle(
        self,
        batch: list[_Submitted],
        outcomes: Sequence[BaseException | None],
        stored: asyncio.Future[None],
        *,
        wake: bool = True,
    ) -> None:
        """Undo the bounds and tell the senders of what was not stored; wake the pump
        (unless ``wake`` is False: the caller sends them itself or wakes it)."""
        domain = self.peer.domain
        for (_, frame, _, refuse), outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                continue
            self.depth -= 1
            self.bytes -= len(frame)
            if isinstance(outcome, QueueFull):
                refuse(FaultCode.COURSE_QUEUE_FULL, f"the queue for {domain} is full")
            elif isinstance(outcome, ProtocolError):
                refuse(outcome.code, outcome.message)
            elif isinstance(outcome, Exception):
                refuse(FaultCode.ENGINE_UNAVAILABLE, f"the queue for {domain}: {outcome}")
        if wake:
            self._wake.set()
        if not stored.done():
            stored.set_result(None)

    def _send_stored(self) -> bool:
        """Send what the queue holds now, from the store's own callback, if the link
        is up, the pump idle and the window open (memory engine); whether it did
        what the pump would have (False: wake the pump instead).

        Leased and written as the pump does (:meth:`_lease`), in this callback: the
        memory engine's ``fetch`` and ``ack`` never wait, and a socket's ``send``
        waits only when its buffer is full, in which case the rest of that send is
        left to the socket and the pump waits for it before its own
        (``_Live.sending``).
        """
        live = self._live
        if live is None or not live.idle:
            return False
        if live.sending is not None:
            if not live.sending.done():
                return False
            live.sending = None
        free = self._settings.window - len(live.in_flight)
        if free <= 0:
            # The pump waits for room once it looks: woken, it will.
            return False
        fetched = start_eagerly(self._engine.fetch(self.queue, live.consumer, count=free))
        # The memory engine's fetch without a wait never suspends (gateway.engines.memory).
        assert fetched.done(), "a fetch without a wait suspended"
        if fetched.exception() is not None:
            # The engine closed (the broker stops): the pump, woken, meets it too and
            # ends the link as it did before the store sent anything.
            return False
        deliveries = fetched.result()
        frames, expired = self._lease(deliveries, live.in_flight)
        if expired:
            # The memory engine's ``ack`` never waits either.
            start_eagerly(self._ack_expired(expired))
        # Counted before the writes, as ``sent`` is.
        self.sent_by_store += len(frames)
        for message in pack(frames):
            self.messages += 1
            sent = start_eagerly(live.ws.send(message))
            if not sent.done():
                # The socket's buffer is full: this send ends once it drains. What
                # follows is written behind it (a socket keeps the order of its
                # writes), and the pump, woken, waits for the last before its own.
                if live.sending is not None:
                    live.sending.add_done_callback(_quiet)
                live.sending = sent
                self.store_sends_waited += 1
                self._wake.set()
                continue
            if sent.exception() is not None:
                # The link failed: its reader ends the pump, which releases the
                # leases, and the crossings go again on the next link.
                self._wake.set()
        if len(deliveries) >= free:
            # The window is full or more may wait: the pump looks again once there is
            # room, as after a fetch of its own.
            self._wake.set()
        return True

    def _lease(
        self, deliveries: list[Delivery], in_flight: dict[str, Delivery]
    ) -> tuple[list[bytes], list[Delivery]]:
        """The frames of ``deliveries`` to send, each now in flight, and those that
        expired instead (for :meth:`_ack_expired`)."""
        frames: list[bytes] = []
        expired: list[Delivery] = []
        now = time.time()
        for delivery in deliveries:
            expires = float(delivery.message.headers.get("expires", "inf"))
            if expires <= now:
                expired.append(delivery)
                continue
            in_flight[delivery.message.id] = delivery
            frames.append(delivery.message.payload)
        # Counted before the writes: their acknowledgement (and a notice to the
        # sender) may come back while the last write still waits to drain.
        self.sent += len(frames)
        return frames, expired

    async def _ack_expired(self, expired: list[Delivery]) -> None:
        """Expired crossings out of the queue, and their senders told (2210)."""
        await self._engine.ack(self.queue, [d.receipt for d in expired])
        for delivery in expired:
            self._finish(delivery, delivered=False)

    # -- the link ----------------------------------------------------------------

    async def _run(self) -> None:
        delay = self._settings.backoff_min
        while not self._stopping.is_set():
            for url in self.peer.urls:
                try:
                    if await self._link(url):
                        delay = self._settings.backoff_min
                except CourseRefusedError as exc:
                    # Not a network failure: someone answered who is not our peer.
                    self._log.error(
                        "course.answer_refused",
                        extra={"peer": self.peer.domain, "url": url, "error": str(exc)},
                    )
                except (OSError, WebSocketException, TimeoutError) as exc:
                    self._log.warning(
                        "course.link_failed",
                        extra={"peer": self.peer.domain, "url": url, "error": str(exc)},
                    )
                finally:
                    self.connected.clear()
            # Jitter: a wait from the upper half of the backoff, so peers restarted
            # together do not dial in lockstep.
            wait = delay * random.uniform(0.5, 1.0)
            delay = min(delay * 2, self._settings.backoff_max)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)

    async def _link(self, url: str) -> bool:
        """One link, from dialling to its end; whether it got past the handshake."""
        parts = urlsplit(url)
        if parts.scheme != "wss" and not (self._allow_plain and parts.hostname in _LOOPBACK):
            raise CourseRefusedError(f"{url}: Courses need wss:// (TLS)")
        token, jti = self._signing.sign(
            self.peer.domain, lifetime=self._settings.credential_lifetime
        )
        async with self._dialler.dial(url, headers={"Authorization": f"Bearer {token}"}) as link:
            ws = link.socket
            hello = asbp.decode(_bytes(await asyncio.wait_for(ws.recv(), 10)))
            self._check_hello(hello, jti)
            self.http2 = link.http2
            self.connected.set()
            self._log.info(
                "course.up", extra={"peer": self.peer.domain, "url": url, "http2": link.http2}
            )
            await self._pump(ws)
            return True

    def _check_hello(self, hello: Command, jti: str) -> None:
        if hello.name != HELLO or hello.get("domain") != self.peer.domain:
            raise CourseRefusedError(f"the answer does not come from {self.peer.domain}")
        try:
            verified = self._verifier.verify(hello.body.decode("ascii", "replace"))
        except CredentialRefused as exc:
            raise CourseRefusedError(f"the answer does not verify: {exc.message}") from exc
        if verified.jti != answer_jti(jti):
            raise CourseRefusedError("the answer belongs to another handshake")

    async def _pump(self, ws: CourseSocket) -> None:
        in_flight: dict[str, Delivery] = {}
        room = asyncio.Event()
        room.set()
        reader = asyncio.create_task(self._read_acks(ws, in_flight, room))
        consumer = f"course-{uuid.uuid4().hex}"
        # The memory engine's queue is this process's and every crossing reaches it
        # through this link (_store), which sets ``_wake``: the pump waits on that,
        # and fetches without waiting in the engine, whose waiting fetch costs a
        # waiter, a timeout timer and its queue's timer, armed and cancelled per
        # fetch. A tick every _FETCH_WAIT seconds covers what comes back by itself
        # (a lease run out) and the reader's end is a wake-up too.
        local = self._stores_many is not None
        ticker = asyncio.create_task(self._tick()) if local else None
        live: _Live | None = None
        if local:
            reader.add_done_callback(lambda _: self._wake.set())
            self._wake.set()  # what the last link left unacknowledged goes first
            live = self._live = _Live(ws, in_flight, room, consumer)
        try:
            while not reader.done():
                free = self._settings.window - len(in_flight)
                if free <= 0:
                    room.clear()
                    await _first(room.wait(), reader)
                    continue
                if live is not None:
                    # Idle: the store sends what it stores itself (_send_stored), and
                    # wakes this task only for what it cannot.
                    live.idle = True
                    try:
                        await self._wake.wait()
                    finally:
                        live.idle = False
                    self._wake.clear()
                    if live.sending is not None:
                        # The store's send that waited for the socket goes first.
                        sending, live.sending = live.sending, None
                        await sending
                    free = self._settings.window - len(in_flight)
                    if free <= 0:
                        continue
                    deliveries = await self._engine.fetch(self.queue, consumer, count=free)
                    if len(deliveries) >= free:
                        self._wake.set()  # more may be ready: look again once there is room
                else:
                    deliveries = await self._engine.fetch(
                        self.queue,
                        consumer,
                        count=free,
                        wait=0 if self._wake.is_set() else _FETCH_WAIT,
                    )
                    self._wake.clear()
                frames, expired = self._lease(deliveries, in_flight)
                if expired:
                    await self._ack_expired(expired)
                # A lone crossing as itself, a backlog in batches (courses.wire.pack);
                # never an iterable, which websockets sends as one fragmented message.
                for message in pack(frames):
                    self.messages += 1
                    await ws.send(message)
            await reader
        finally:
            # The store sends no more on this link: what is in flight is released
            # below, and the next link's pump sends it first.
            self._live = None
            if live is not None and live.sending is not None:
                # Settled by the socket's end: read, so that nothing is left unheard.
                live.sending.add_done_callback(_quiet)
            if ticker is not None:
                await cancel_and_wait(ticker)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketException, OSError):
                await reader
            if in_flight:
                # Back to the head of the queue, in order: the next link sends them first.
                await self._engine.release(self.queue, [d.receipt for d in in_flight.values()])

    async def _tick(self) -> None:
        """Wake the pump every _FETCH_WAIT seconds (see :meth:`_pump`)."""
        while True:
            await asyncio.sleep(_FETCH_WAIT)
            self._wake.set()

    async def _read_acks(
        self, ws: CourseSocket, in_flight: dict[str, Delivery], room: asyncio.Event
    ) -> None:
        async for data in ws:
            ack = asbp.decode(_bytes(data))
            if ack.name != ACK:
                continue
            ids = ack.get(ID_KEY)
            acked = [ids] if isinstance(ids, str) else list(ids or ())
            done = [in_flight.pop(i) for i in acked if i in in_flight]
            if not done:
                continue
            await self._engine.ack(self.queue, [d.receipt for d in done])
            self.acknowledged += len(done)
            self.depth -= len(done)
            for delivery in done:
                message = delivery.message
                self.bytes -= len(message.payload)
                if "notice" in message.headers:
                    # Only a sender who asked hears of a delivery (Courses._crossed).
                    self._on_done(Crossing(message.id, message.payload, True, message.headers))
            room.set()

    def _finish(self, delivery: Delivery, *, delivered: bool) -> None:
        message = delivery.message
        self.depth -= 1
        self.bytes -= len(message.payload)
        self._on_done(Crossing(message.id, message.payload, delivered, message.headers))


def _quiet(future: asyncio.Future[None]) -> None:
    """Read a send's outcome nobody awaits (the link ended under it)."""
    if not future.cancelled():
        future.exception()


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


async def _first(event_wait: Coroutine[object, object, object], task: asyncio.Task[None]) -> None:
    """Until ``event_wait`` returns or ``task`` ends, whichever is first."""
    waiter = asyncio.ensure_future(event_wait)
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()

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
            # Commands, the rest of a Course message's crossings): one store for all.
            loop.call_soon(self._store)
            if self._stores_many is not None:
                # The pump, if it waits, resumes right after that store, in the same
                # loop turn: a crossing waits no turn more than an eager enqueue's.
                self._wake.set()
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
        self._settle(batch, outcomes, stored)

    def _settle(
        self,
        batch: list[_Submitted],
        outcomes: Sequence[BaseException | None],
        stored: asyncio.Future[None],
    ) -> None:
        """Undo the bounds and tell the senders of what was not stored; wake the pump."""
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
        self._wake.set()
        if not stored.done():
            stored.set_result(None)

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
        if local:
            reader.add_done_callback(lambda _: self._wake.set())
            self._wake.set()  # what the last link left unacknowledged goes first
        try:
            while not reader.done():
                free = self._settings.window - len(in_flight)
                if free <= 0:
                    room.clear()
                    await _first(room.wait(), reader)
                    continue
                if local:
                    await self._wake.wait()
                    self._wake.clear()
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
                if expired:
                    await self._engine.ack(self.queue, [d.receipt for d in expired])
                    for delivery in expired:
                        self._finish(delivery, delivered=False)
                # Counted before the writes: their acknowledgement (and a notice to the
                # sender) may come back while the last write still waits to drain.
                self.sent += len(frames)
                # A lone crossing as itself, a backlog in batches (courses.wire.pack);
                # never an iterable, which websockets sends as one fragmented message.
                for message in pack(frames):
                    await ws.send(message)
            await reader
        finally:
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


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


async def _first(event_wait: Coroutine[object, object, object], task: asyncio.Task[None]) -> None:
    """Until ``event_wait`` returns or ``task`` ends, whichever is first."""
    waiter = asyncio.ensure_future(event_wait)
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()

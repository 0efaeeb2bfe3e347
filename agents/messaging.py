"""Topics and queues from Python: publish, subscribe, poll and acknowledge over one Channel.

Theory of operation
-------------------
A :class:`MessagingClient` speaks the messaging Commands of docs/protocol.md
("Topics and queues") over one User-Agent Channel (``agents.channel``). It is
separate from :class:`~agents.user_agent.UserAgent` because the shapes of the
answers differ: an ``asbp.poll`` is answered by any number of
``asbp.notification`` Commands carrying its ``u`` and then one
``asbp.accepted`` (or a fault) with the same ``u``, which a request/reply
table cannot express.

So every Command sent gets a fresh ``u`` and a :class:`_Pending` entry that
collects the notifications carrying that ``u`` and ends with the acceptance or
the fault. Notifications without ``u`` (a subscription's) are *pushed*: kept
in a bounded queue for :meth:`MessagingClient.receive`. A full queue drops its
oldest notification, logged: a dropped queue message is not lost, its lease
runs out and the broker delivers it again.

Pipelining: the broker carries out one Channel's messaging Commands in the
order sent and answers them in that order, and lets ``max_pending`` (256) wait
for the engine at once. :func:`publish_all` keeps a bounded window of
publications in flight, which is how a bulk writer reaches the engine's speed
rather than one round trip per message.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from agents import control
from agents.channel import ChannelTransport, WebSocketChannel
from agents.errors import AgentError, ConnectionLost, FaultError, NotConnected
from asbp import Command, HeaderInput

# Re-exported: the messaging Command-Names are protocol vocabulary (asbp.names).
from asbp.names import ACK, NOTIFICATION, POLL, PUBLISH, SUBSCRIBE, UNSUBSCRIBE

__all__ = [
    "ACK",
    "NOTIFICATION",
    "POLL",
    "PUBLISH",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "DestinationType",
    "Message",
    "MessagingClient",
    "Publication",
    "publish_all",
]

#: ``type``: TOPIC, QUEUE or VIRTUAL_QUEUE, spelt exactly so.
DestinationType = Literal["TOPIC", "QUEUE", "VIRTUAL_QUEUE"]

#: The publisher's keys a notification carries (they describe the body).
_CARRIED: Final = ("e", "f", "m", "z", "a")
#: Header bytes one ``asbp.ack`` spends on receipts, well under the codec's
#: 8 KiB header limit (a receipt is at most 256 bytes).
_ACK_HEADER_BUDGET: Final = 6 * 1024


@dataclass(frozen=True, slots=True)
class Message:
    """One ``asbp.notification``: a message delivered to a subscription or a poll.

    Attributes:
        destination: the topic or queue it was published to.
        subscription: the subscription (or polled queue) it came through.
        type: the subscription's destination type.
        id: the broker's message id, 32 hex digits; the same on every redelivery.
        timestamp: when it was published, epoch milliseconds.
        expiration: when it expires, epoch milliseconds; None: never.
        priority: 0 (lowest) to 9.
        receipt: what acknowledges this delivery (queue messages only).
        deliveries: 1, then one more per redelivery (queue messages only).
        keys: the publisher's ``e``, ``f``, ``m``, ``z`` and ``a`` it carried.
        payload: the body.
    """

    destination: str
    subscription: str
    type: str
    id: str
    timestamp: int
    expiration: int | None
    priority: int
    receipt: str | None
    deliveries: int | None
    keys: Mapping[str, str]
    payload: bytes

    @classmethod
    def from_command(cls, command: Command) -> Message:
        """Read an ``asbp.notification``.

        Raises:
            AgentError: a key the broker always sends is missing or malformed.
        """
        try:
            return cls(
                destination=_text(command, "destination"),
                subscription=_text(command, "subscription"),
                type=_text(command, "type"),
                id=_text(command, "id"),
                timestamp=int(_text(command, "ts")),
                expiration=_optional_int(command, "exp"),
                priority=int(_text(command, "priority")),
                receipt=_optional_text(command, "receipt"),
                deliveries=_optional_int(command, "deliveries"),
                keys={k: v for k in _CARRIED if isinstance(v := command.get(k), str)},
                payload=command.body,
            )
        except ValueError as exc:
            raise AgentError(f"a malformed notification: {command!r}") from exc


@dataclass(frozen=True, slots=True)
class Publication:
    """What :meth:`MessagingClient.publish` sends: a body for one destination.

    Attributes:
        destination: the topic or queue.
        body: the payload; a ``str`` goes as UTF-8 with ``e=UTF-8``.
        type: TOPIC or QUEUE.
        priority: 0 to 9; None: the broker's default (4).
        ttl: seconds the message lives; None: the broker's default for a queue.
        media_type: ``m``, the body's media type, carried to consumers.
    """

    destination: str
    body: bytes | str
    type: Literal["TOPIC", "QUEUE"] = "TOPIC"
    priority: int | None = None
    ttl: float | None = None
    media_type: str | None = None


@dataclass(slots=True)
class _Pending:
    """The answers to one ``u``: notifications, then an acceptance or a fault."""

    done: asyncio.Future[Command]
    messages: list[Message] = field(default_factory=list)


class MessagingClient:
    """Publish, subscribe, poll and acknowledge over one Channel.

    ::

        async with MessagingClient.websocket("ws://127.0.0.1:8080/asbp") as bus:
            message_id = await bus.publish(Publication("jobs", b"work", type="QUEUE"))
            for message in await bus.poll("jobs", count=16, wait=1.0):
                ...
            await bus.ack("jobs", [m.receipt for m in messages if m.receipt])

    Args:
        transport: the Channel transport.
        max_pushed: pushed notifications kept for :meth:`receive` before the
            oldest is dropped.
        logger: where to log.
    """

    def __init__(
        self,
        transport: ChannelTransport,
        *,
        max_pushed: int = 4096,
        logger: logging.Logger | None = None,
    ) -> None:
        if max_pushed < 1:
            raise ValueError("max_pushed must be at least 1")
        self._transport = transport
        self._log = logger or logging.getLogger("asbp.messaging")
        self._ids = control.CommandIds()
        self._pending: dict[int, _Pending] = {}
        self._pushed: deque[Message] = deque()
        self._max_pushed = max_pushed
        self._arrived = asyncio.Event()
        self._closed: BaseException | None = None
        self._open = False

    @classmethod
    def websocket(
        cls, url: str, *, timeout: float = 10.0, max_pushed: int = 4096
    ) -> MessagingClient:
        """A client on a WebSocket Channel (``ws(s)://host/asbp``)."""
        return cls(WebSocketChannel(url, timeout=timeout), max_pushed=max_pushed)

    # -- life cycle ------------------------------------------------------------

    async def connect(self) -> None:
        """Open the Channel.

        Raises:
            AgentError: already opened, or the broker's greeting was wrong.
            OSError, websockets errors: could not connect.
        """
        if self._open:
            raise AgentError("a MessagingClient connects once")
        self._open = True
        await self._transport.open(self._deliver, self._on_closed)

    async def close(self) -> None:
        """Close the Channel: the broker releases every lease it holds at once."""
        await self._transport.close()
        self._on_closed(None)

    async def __aenter__(self) -> MessagingClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- Commands ----------------------------------------------------------------

    async def publish(self, publication: Publication, *, timeout: float | None = 30.0) -> str:
        """Publish and wait until the broker has stored it; return the message id.

        Raises:
            FaultError: the broker refused it (a bad destination, a full queue, ...).
            ConnectionLost: the Channel closed first.
            TimeoutError: no answer within ``timeout``.
        """
        keys: dict[str, HeaderInput] = {
            "destination": publication.destination,
            "type": publication.type,
        }
        if publication.priority is not None:
            keys["priority"] = publication.priority
        if publication.ttl is not None:
            keys["ttl"] = repr(float(publication.ttl))
        if publication.media_type is not None:
            keys["m"] = publication.media_type
        accepted, _ = await self._call(PUBLISH, keys, publication.body, timeout)
        message_id = accepted.get("id")
        if not isinstance(message_id, str):
            raise AgentError(f"an acceptance of a publication without an id: {accepted!r}")
        return message_id

    async def subscribe(
        self, destination: str, *, type: DestinationType = "TOPIC", timeout: float | None = 30.0
    ) -> None:
        """Subscribe; messages then arrive through :meth:`receive`.

        A VIRTUAL_QUEUE (``name@pattern``) is declared by its first subscription
        and outlives it: topic messages are copied into it from then on.
        """
        await self._call(SUBSCRIBE, {"destination": destination, "type": type}, b"", timeout)

    async def unsubscribe(
        self, destination: str, *, type: DestinationType = "TOPIC", timeout: float | None = 30.0
    ) -> None:
        """End the subscription to ``destination`` of ``type``."""
        await self._call(UNSUBSCRIBE, {"destination": destination, "type": type}, b"", timeout)

    async def poll(
        self,
        queue: str,
        *,
        count: int = 1,
        wait: float = 0.0,
        timeout: float | None = 30.0,
    ) -> list[Message]:
        """Take up to ``count`` messages of a queue (``name@pattern``: a virtual queue).

        Each is leased to this Channel until acknowledged (:meth:`ack`), until
        the broker's ``ack_timeout`` passes, or until the Channel closes.

        Args:
            count: 1 to the broker's ``prefetch``.
            wait: seconds the broker waits for a first message.
            timeout: seconds to wait for the whole answer, beyond ``wait``.
        """
        keys: dict[str, HeaderInput] = {"destination": queue, "count": count}
        if wait:
            keys["wait"] = repr(float(wait))
        total = None if timeout is None else timeout + wait
        _, messages = await self._call(POLL, keys, b"", total)
        return messages

    async def ack(
        self, queue: str, receipts: Iterable[str], *, timeout: float | None = 30.0
    ) -> int:
        """Acknowledge deliveries; return how many receipts were still live.

        A receipt is dead once its lease ran out (the message was, or will be,
        delivered again with a new one). Large lists go as several Commands,
        pipelined.
        """
        chunks: list[list[str]] = [[]]
        size = 0
        for receipt in receipts:
            if size + len(receipt) + 3 > _ACK_HEADER_BUDGET and chunks[-1]:
                chunks.append([])
                size = 0
            chunks[-1].append(receipt)
            size += len(receipt) + 3
        calls = [
            self._call(ACK, {"destination": queue, "receipt": chunk}, b"", timeout)
            for chunk in chunks
            if chunk
        ]
        live = 0
        for accepted, _ in await asyncio.gather(*calls):
            count = accepted.get("count")
            live += int(count) if isinstance(count, str) and count.isdigit() else 0
        return live

    async def receive(self, timeout: float | None = None) -> Message:
        """The next pushed notification (from a subscription).

        Raises:
            ConnectionLost: the Channel has ended and nothing is queued.
            TimeoutError: nothing within ``timeout``.
        """
        async with asyncio.timeout(timeout):
            while not self._pushed:
                if self._closed is not None:
                    raise ConnectionLost("the Channel has ended") from self._closed
                self._arrived.clear()
                await self._arrived.wait()
        return self._pushed.popleft()

    def pushed(self) -> list[Message]:
        """Take every pushed notification that has arrived, without waiting."""
        taken = list(self._pushed)
        self._pushed.clear()
        return taken

    # -- internals ---------------------------------------------------------------

    async def _call(
        self,
        name: str,
        keys: dict[str, HeaderInput],
        body: bytes | str,
        timeout: float | None,
    ) -> tuple[Command, list[Message]]:
        if not self._open:
            raise NotConnected("the MessagingClient is not connected")
        if self._closed is not None:
            raise ConnectionLost("the Channel has ended") from self._closed
        command_id = self._ids.allocate(self._pending)
        pending = _Pending(asyncio.get_running_loop().create_future())
        self._pending[command_id] = pending
        try:
            data = control.text_body(body, keys)
            keys["c"] = name
            keys["u"] = command_id
            await self._transport.send(Command(keys, data))
            async with asyncio.timeout(timeout):
                answer = await pending.done
        finally:
            self._pending.pop(command_id, None)
        if answer.name == control.FAULT:
            raise FaultError.from_command(answer)
        return answer, pending.messages

    def _deliver(self, command: Command) -> None:
        command_id = command.command_id
        if command_id is None:
            if command.name == NOTIFICATION:
                self._push(command)
            else:
                self._log.debug("messaging: ignored %r", command)
            return
        pending = self._pending.get(command_id)
        if pending is None or pending.done.done():
            self._log.debug("messaging: dropped an answer nobody awaits: %r", command)
        elif command.name == NOTIFICATION:
            pending.messages.append(Message.from_command(command))
        else:
            pending.done.set_result(command)

    def _push(self, command: Command) -> None:
        if len(self._pushed) >= self._max_pushed:
            dropped = self._pushed.popleft()
            self._log.warning("messaging: queue full; dropped the oldest: %s", dropped.id)
        self._pushed.append(Message.from_command(command))
        self._arrived.set()

    def _on_closed(self, error: BaseException | None) -> None:
        if self._closed is not None:
            return
        self._closed = error or ConnectionLost("the Channel was closed")
        for pending in self._pending.values():
            if not pending.done.done():
                lost = ConnectionLost("the Channel ended before the answer came")
                lost.__cause__ = error
                pending.done.set_exception(lost)
        self._arrived.set()


async def publish_all(
    client: MessagingClient,
    publications: Iterable[Publication] | AsyncIterable[Publication],
    *,
    window: int = 128,
    timeout: float | None = 30.0,
) -> list[str]:
    """Publish every publication with at most ``window`` awaiting acceptance.

    Returns the message ids in publication order once every one is stored.
    The first refusal cancels what is still in flight and is raised; messages
    accepted before it stay published.

    Raises:
        ValueError: ``window`` is below 1 or above 256 (the broker's ``max_pending``).
        FaultError, ConnectionLost, TimeoutError: as for :meth:`MessagingClient.publish`.
    """
    if not 1 <= window <= 256:
        raise ValueError("window must be 1 to 256")
    room = asyncio.Semaphore(window)
    tasks: list[asyncio.Task[str]] = []
    failures: list[BaseException] = []

    async def one(publication: Publication) -> str:
        try:
            return await client.publish(publication, timeout=timeout)
        except BaseException as exc:
            failures.append(exc)
            raise
        finally:
            room.release()

    async def start(publication: Publication) -> None:
        await room.acquire()
        if failures:
            room.release()
            raise failures[0]
        tasks.append(asyncio.create_task(one(publication)))

    try:
        if isinstance(publications, AsyncIterable):
            async for publication in publications:
                await start(publication)
        else:
            for publication in publications:
                await start(publication)
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _text(command: Command, key: str) -> str:
    value = command.get(key)
    if not isinstance(value, str):
        raise ValueError(f"no {key!r}")
    return value


def _optional_text(command: Command, key: str) -> str | None:
    value = command.get(key)
    return value if isinstance(value, str) else None


def _optional_int(command: Command, key: str) -> int | None:
    value = command.get(key)
    return int(value) if isinstance(value, str) else None

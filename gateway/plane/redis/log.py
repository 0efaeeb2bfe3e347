"""The Channel log on Redis: a stream per Channel, written through the plane's Batcher.

Every operation is one script call (:mod:`gateway.plane.redis.log_scripts`)
submitted to the plane's :class:`gateway.engines.redis.batch.Batcher`, so
concurrent appends from a busy broker share one pipeline and the router,
which only submits, never waits for Redis. A broker's calls reach Redis in
the order it made them, so its read after its own append sees the append.

A reader that finds nothing parks: the read script adds this broker to the
log's waiting set in the same call that found it empty, and the next append,
at any broker, XADDs a wake-up to this broker's inbound stream. The plane's
reader (already blocked in XREAD on that stream) hands it to :meth:`wake`,
which releases every local reader of that Channel to read again: one
round trip plus one XREAD, a few milliseconds, and no connection held per
parked reader. A waiter is registered locally *before* the read is sent, so
a wake-up that overtakes the read's reply is not lost.

A release puts up a barrier that this broker lifts once its reader has handled
what its inbound stream held then (gateway.plane.redis.release_barriers; on a
Redis Cluster, what was counted as sent to it: gateway.plane.redis.counted_barriers);
a resume elsewhere waits for it (``pending``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from gateway.engines.redis.calls import script_command
from gateway.plane.base import LogRead, LogRetention
from gateway.plane.redis.counted_barriers import CountedBarriers
from gateway.plane.redis.keys import directory_prefix, stream_key
from gateway.plane.redis.log_scripts import (
    LOG_ACK,
    LOG_APPEND,
    LOG_DIGEST,
    LOG_DROP,
    LOG_HELD_APPEND,
    LOG_HOLD,
    LOG_KEEP,
    LOG_KEPT,
    LOG_OPEN,
    LOG_OR_FORWARD,
    LOG_OR_HOLDER,
    LOG_PENDING,
    LOG_READ,
    LOG_RELEASE,
    LOG_RELEASE_COUNTED,
    LOG_SALVAGE,
    LOG_SALVAGED,
    LOG_SETTLED,
    STREAM_TAKE,
)
from gateway.plane.redis.release_barriers import ReleaseBarriers

__all__ = ["LOG_FORMAT", "RedisChannelLog", "Submit"]

#: The value of a broker's lease (``alive:<b>``) when it reads log entries of several
#: frames (log_scripts.py); an older broker's is ``1``. A log is read, trimmed and
#: appended to by any broker of the bus, so a broker packs a call's frames into one
#: entry only while every live broker's lease says this (RedisPlane.learn_log_format).
LOG_FORMAT: Final = "2"

#: Submits one command to the plane's Batcher; the future is settled with
#: ``convert(reply)``, or fails with PlaneUnavailable.
Submit = Callable[[tuple[Any, ...], Callable[[Any], Any]], "asyncio.Future[Any]"]

_NOTHING: Final[tuple[tuple[int, bytes], ...]] = ()


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _none(reply: Any) -> None:
    return None


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _held(reply: Any) -> tuple[str, int] | None:
    if reply is None:
        return None
    return (_text(reply[0]), int(reply[1]))


def _last_forwarded(reply: Any) -> bytes | None:
    """LOG_RELEASE's answer: the last entry forwarded here for the Channel (b'' none),
    None when this broker did not hold the log."""
    return None if reply is None else bytes(reply)


def _pack(frames: Sequence[bytes]) -> bytes:
    """``frames`` as one packed entry: each a 4-byte big-endian length, then the frame."""
    return b"".join(len(frame).to_bytes(4, "big") + frame for frame in frames)


def _read(reply: Any) -> LogRead | None:
    if reply is None:
        return None
    frames = tuple((int(reply[i]), bytes(reply[i + 1])) for i in range(2, len(reply), 2))
    return LogRead(frames, int(reply[0]), int(reply[1]))


class RedisChannelLog:
    """The Channel logs of one bus on Redis, seen from one broker.

    Args:
        submit: the plane's way to its Batcher.
        prefix: the plane's key prefix.
        broker_id: this broker (where appends send wake-ups for its readers).
        retention: what each log keeps at most.
        stream_max: the cap of the brokers' inbound streams.
        clock: seconds since the epoch (the scripts compare times from it).
        cluster: the plane is on a Redis Cluster.
        lease: the bus lease (a cluster's barrier waits for counted frames at most that).
    """

    def __init__(
        self,
        submit: Submit,
        *,
        prefix: str,
        broker_id: str,
        retention: LogRetention,
        stream_max: int,
        clock: Callable[[], float] = time.time,
        cluster: bool = False,
        lease: float = 10.0,
    ) -> None:
        self._submit = submit
        self._prefix = prefix
        #: On a Redis Cluster the scripts cannot reach other brokers' streams (other
        #: slots): they get an empty prefix and return whom to wake (log_scripts.py).
        self._cluster = cluster
        self._broker_id = broker_id
        self._retention = retention
        self._stream_max = stream_max
        self._clock = clock
        self._limits = (
            _ms(retention.max_age),
            retention.max_frames,
            retention.max_bytes,
        )
        #: Every broker of the bus reads packed entries: a held append writes one entry
        #: per call, not one per frame (set by the plane, from the brokers' leases).
        self.packs = False
        #: Channel → the futures of this broker's readers parked on its log.
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        #: The release barriers this broker has up; its plane's reader says how far
        #: it has handled the inbound stream (:meth:`handled`).
        self._barriers = ReleaseBarriers(self._settled)
        #: On a Redis Cluster: the frames counted as sent here, read, per Channel held.
        self._counted = CountedBarriers(self._settled, give_up=lease)
        #: On a Redis Cluster: sends a frame salvaged from a dead broker's stream on to
        #: the Channel (held by another broker by then); the plane sets it.
        self.forward: Callable[[str, bytes], object] | None = None

    @property
    def retention(self) -> LogRetention:
        return self._retention

    def _keys(self, channel_id: str) -> tuple[str, str, str, str]:
        tag = "{" + channel_id + "}"
        prefix = self._prefix
        return (
            f"{prefix}log:{tag}",
            f"{prefix}logs:{tag}",
            f"{prefix}logw:{tag}",
            # Frames held back behind a release barrier (release_barriers.py).
            f"{prefix}logv:{tag}",
        )

    def meta_key(self, channel_id: str) -> str:
        """The hash of the Channel's log: its holder (``w``), its numbers, its record."""
        return self._keys(channel_id)[0]

    def _now(self) -> int:
        return _ms(self._clock())

    def open(self, channel_id: str, *, digest: bytes, idle: float) -> asyncio.Future[None]:
        command = script_command(LOG_OPEN, self._keys(channel_id), (digest, _ms(idle), self._now()))
        return self._submit(command, _none)

    def _append_args(self, channel_id: str, frame: bytes) -> tuple[Any, ...]:
        prefix = "" if self._cluster else self._prefix
        return (frame, self._now(), *self._limits, prefix, channel_id, self._stream_max)

    def append(self, channel_id: str, frame: bytes) -> asyncio.Future[int]:
        command = script_command(
            LOG_APPEND,
            self._keys(channel_id),
            (*self._append_args(channel_id, frame), self._broker_id),
        )
        if not self._cluster:
            return self._submit(command, int)
        return self._submit(command, lambda reply: self._woken(channel_id, reply[1:], reply[0]))

    def hold(self, channel_id: str) -> asyncio.Future[tuple[str, int] | None]:
        if self._cluster:
            # Counted from the hold's submission: a frame counted once it ran may be
            # read before its reply comes back.
            self._counted.holding(channel_id)
        # As an append's arguments (a dead holder's frames are appended), then this broker.
        args = (*self._append_args(channel_id, b"")[1:], self._broker_id)
        return self._submit(script_command(LOG_HOLD, self._keys(channel_id), args), _held)

    def held_append(self, channel_id: str, frames: Sequence[bytes]) -> asyncio.Future[int]:
        # Several frames go packed, one argument, and into one stream entry for the call
        # once every broker reads those (log_scripts.py): Redis adds one entry instead of
        # one per frame. Until then the script unpacks them into an entry each.
        packed = frames[0] if len(frames) == 1 else _pack(frames)  # none: b""
        args = (
            *self._append_args(channel_id, b"")[1:],
            self._broker_id,
            packed,
            len(frames),
            "1" if self.packs else "",
        )
        return self._submit(script_command(LOG_HELD_APPEND, self._keys(channel_id), args), int)

    def release(self, channel_id: str) -> asyncio.Future[None]:
        if self._cluster:
            return self._release_counted(channel_id)
        command = script_command(
            LOG_RELEASE, self._keys(channel_id), (self._broker_id, self._now())
        )
        released: asyncio.Future[bytes | None] = self._submit(command, _last_forwarded)
        released.add_done_callback(functools.partial(self._released, channel_id))
        return self._submit_after(released)

    def _submit_after(self, future: asyncio.Future[bytes | None]) -> asyncio.Future[None]:
        """``future``, settled with None (the release's caller learns only that it ran)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settle(settled: asyncio.Future[bytes | None]) -> None:
            if done.done():  # pragma: no cover - nothing else settles it
                return
            if settled.cancelled():
                done.cancel()
            elif (error := settled.exception()) is not None:
                done.set_exception(error)
            else:
                done.set_result(None)

        future.add_done_callback(settle)
        return done

    def _released(self, channel_id: str, future: asyncio.Future[bytes | None]) -> None:
        """The release ran; if it put up the barrier, it is lifted once the reader has
        handled the last entry forwarded here for the Channel (release_barriers.py)."""
        if future.cancelled() or future.exception() is not None:
            return  # the bus is unreachable: a resume waits for the barrier at most a lease
        last = future.result()
        if last:
            self._barriers.released(channel_id, last)

    def _release_counted(self, channel_id: str) -> asyncio.Future[None]:
        """A Redis Cluster's release: the barrier waits for the counted frames not read
        yet (gateway.plane.redis.counted_barriers)."""
        args = (self._broker_id, self._now(), self._counted.count(channel_id))
        command = script_command(LOG_RELEASE_COUNTED, self._keys(channel_id), args)
        released: asyncio.Future[Any] = self._submit(
            command, lambda reply: None if reply is None else int(reply)
        )
        released.add_done_callback(functools.partial(self._released_counted, channel_id))
        return self._submit_after(released)

    def _released_counted(self, channel_id: str, future: asyncio.Future[int | None]) -> None:
        if future.cancelled() or future.exception() is not None:
            # The bus is unreachable: a resume waits for the barrier at most a lease.
            self._counted.forget(channel_id)
            return
        self._counted.released(channel_id, future.result())

    def counted(self, channel_id: str) -> None:
        """The plane's reader handed on a frame for ``channel_id`` that was counted as
        sent here (a Redis Cluster): a barrier waiting for it may lift."""
        self._counted.read(channel_id)

    def expire_barriers(self) -> None:
        """Lift the counted barriers up for longer than the bus lease."""
        self._counted.expire()

    def _settled(self, channel_id: str) -> None:
        args = (*self._append_args(channel_id, b"")[1:], self._broker_id)
        self._submit(script_command(LOG_SETTLED, self._keys(channel_id), args), _none)

    def handled(self, entry_id: bytes) -> None:
        """The plane's reader handed every entry of the inbound stream through
        ``entry_id`` to the router: the barriers waiting for it are lifted."""
        self._barriers.handled(entry_id)

    async def pending(self, channel_id: str) -> str:
        waited = await self._pending(channel_id)
        if not self._cluster or not waited or await self._alive(waited):
            return waited
        # On a Redis Cluster the script cannot see leases (another slot): a dead holder's
        # or barrier's unread frames for the Channel are salvaged here, as the script
        # does on one Redis, and the hold and the barrier go with them.
        await self.salvage_from(waited, channel_id)
        return await self._pending(channel_id)

    async def _alive(self, broker_id: str) -> bool:
        key = f"{directory_prefix(self._prefix)}alive:{broker_id}"
        return bool(await self._submit(("EXISTS", key), lambda reply: reply))

    async def salvage_from(self, gone: str, channel_id: str = "") -> int:
        """On a Redis Cluster: the frames in the dead broker ``gone``'s inbound stream for
        ``channel_id`` (every Channel when '') go into their logs, oldest first, ahead of
        those held back behind its release barrier, which lifts; a log held by another
        broker by then gets them forwarded (:attr:`forward`). Two calls per Channel (the
        stream's slot, then the log's): a broker that dies between them loses them.

        Returns:
            How many frames were taken out of the stream.
        """
        command = script_command(STREAM_TAKE, (stream_key(self._prefix, gone),), (channel_id,))
        reply = await self._submit(command, lambda reply: reply)
        taken: dict[str, list[bytes]] = {channel_id: []} if channel_id else {}
        for n in range(0, len(reply), 2):
            taken.setdefault(_text(reply[n]), []).append(bytes(reply[n + 1]))
        # One call per Channel, all in the Batcher's pipelines at once (a broker that
        # held many Channels is saved in a round trip or two, not one each).
        calls = [
            self._submit(
                script_command(
                    LOG_SALVAGED,
                    self._keys(channel),
                    (*self._append_args(channel, b"")[1:], gone, *frames),
                ),
                lambda reply: reply,
            )
            for channel, frames in taken.items()
        ]
        for (channel, frames), saved in zip(
            taken.items(), await asyncio.gather(*calls), strict=True
        ):
            if int(saved[0]) >= 0:
                self._woken(channel, saved[2:], saved[0])
            elif self.forward is not None:
                for frame in frames:
                    self.forward(channel, frame)
        return len(reply) // 2

    async def _pending(self, channel_id: str) -> str:
        prefix = "" if self._cluster else self._prefix
        args = (self._now(), *self._limits, prefix, channel_id, self._stream_max)
        reply = await self._submit(
            script_command(LOG_PENDING, self._keys(channel_id), args), lambda reply: reply
        )
        return "" if reply is None else _text(reply)

    def salvage(self, stream: str, broker_id: str) -> tuple[Any, ...]:
        """The script call that saves into their logs the frames the dead broker
        ``broker_id`` held Channels for and never read from its ``stream``."""
        args = (self._prefix, broker_id, self._now(), *self._limits, self._stream_max)
        return script_command(LOG_SALVAGE, (stream, "", ""), args)

    def _woken(self, channel_id: str, brokers: Any, result: Any) -> int:
        """Send the wake-ups a cluster's script left to us; ``result`` as an int."""
        for broker in brokers:
            stream = stream_key(self._prefix, _text(broker))
            wake_up = ("k", "w", "o", "", "i", channel_id, "g", "", "f", "")
            self._submit(("XADD", stream, "MAXLEN", "~", self._stream_max, "*", *wake_up), _none)
        return int(result)

    def _dropped(self, channel_id: str, brokers: Any) -> None:
        self._woken(channel_id, brokers, 0)

    def append_or_holder(self, channel_id: str, frame: bytes) -> asyncio.Future[tuple[int, str]]:
        """On a Redis Cluster: ``frame`` into the log (its number), or, while a broker
        holds the log, that broker, the frame counted as on its way there (number 0):
        the caller sends it, marked :data:`~gateway.plane.redis.counted_barriers.COUNTED`."""
        command = script_command(
            LOG_OR_HOLDER,
            self._keys(channel_id),
            (*self._append_args(channel_id, frame), self._broker_id),
        )

        def placed(reply: Any) -> tuple[int, str]:
            holder = _text(reply[1])
            return (self._woken(channel_id, reply[2:], reply[0]), holder)

        return self._submit(command, placed)

    def log_or_forward(self, channel_id: str, frame: bytes, directory: str) -> tuple[Any, ...]:
        """The script call of ``forward_to_channel``: its log if it has one, else its broker."""
        return script_command(
            LOG_OR_FORWARD,
            (*self._keys(channel_id), directory),
            (*self._append_args(channel_id, frame), self._broker_id),
        )

    def acknowledge(self, channel_id: str, through: int) -> asyncio.Future[None]:
        command = script_command(LOG_ACK, self._keys(channel_id), (through, self._now()))
        return self._submit(command, _none)

    def drop(self, channel_id: str) -> asyncio.Future[None]:
        self._counted.forget(channel_id)
        prefix = "" if self._cluster else self._prefix
        command = script_command(
            LOG_DROP, self._keys(channel_id), (prefix, channel_id, self._stream_max)
        )
        return self._submit(command, lambda reply: self._dropped(channel_id, reply))

    async def digest(self, channel_id: str) -> bytes | None:
        command = script_command(LOG_DIGEST, self._keys(channel_id), (self._now(),))
        reply = await self._submit(command, lambda reply: reply)
        return bytes(reply) if reply is not None else None

    def keep(self, channel_id: str, record: bytes) -> asyncio.Future[None]:
        command = script_command(LOG_KEEP, self._keys(channel_id), (self._now(), record))
        return self._submit(command, _none)

    async def holder(self, channel_id: str) -> str:
        # A plain read: the field ``w`` of the log's hash (absent: not held).
        reply = await self._submit(("HGET", self._keys(channel_id)[0], "w"), lambda reply: reply)
        return bytes(reply).decode() if reply else ""

    async def kept(self, channel_id: str) -> bytes:
        command = script_command(LOG_KEPT, self._keys(channel_id), (self._now(),))
        reply = await self._submit(command, lambda reply: reply)
        return bytes(reply) if reply else b""

    async def read(self, channel_id: str, after: int, limit: int, wait: float) -> LogRead | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            remaining = deadline - loop.time()
            waiter: asyncio.Future[None] = loop.create_future()
            waiters = self._waiters.setdefault(channel_id, set())
            waiters.add(waiter)
            try:
                command = script_command(
                    LOG_READ,
                    self._keys(channel_id),
                    (
                        max(after, 0),
                        limit,
                        self._broker_id if remaining > 0 else "",
                        self._now(),
                        *self._limits,
                    ),
                )
                found: LogRead | None = await self._submit(command, _read)
                if found is None or found.frames or remaining <= 0:
                    return found
                try:
                    async with asyncio.timeout(remaining):
                        await waiter
                except TimeoutError:
                    return found
            finally:
                waiters.discard(waiter)
                if not waiters and self._waiters.get(channel_id) is waiters:
                    del self._waiters[channel_id]
                waiter.cancel()

    def wake(self, channel_id: str) -> None:
        """An append (or a drop) happened on ``channel_id``'s log: its readers read again."""
        for waiter in self._waiters.get(channel_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    def wake_all(self) -> None:
        """Every parked reader reads again (the plane is closing: they find out)."""
        for channel_id in list(self._waiters):
            self.wake(channel_id)

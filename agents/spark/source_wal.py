"""The ``asbp`` source's write-ahead log: replayable offsets for queues that have none.

Theory of operation
-------------------
A queue hands a message out, and takes it back unless it is acknowledged; it
keeps no log a consumer could re-read. Spark's streaming sources need one: a
micro-batch is planned as a range of offsets, written to the checkpoint, and
after a crash planned *again* with the same range, which must give the same
rows. So the source keeps its own log of what it took from the queue.

Every message taken gets the next *sequence number* and is appended here, and
the log is flushed and fsynced before the sequence number is shown to Spark.
Everything below :attr:`WriteAheadLog.base` has been committed by Spark and
acknowledged to the broker; the entries from ``base`` up are the messages
taken but not yet committed, kept in memory too for planning.

Redeliveries: the broker gives an unacknowledged message out again (with a
new receipt, same id) when its lease runs out or when the Channel holding it
closes, which happens on every restart. The log knows every id it holds, so a
redelivery of an uncommitted message only refreshes its receipt and keeps its
sequence number: nothing is duplicated. A redelivery of a message committed
already (its acknowledgement came too late, with a dead receipt) is kept as a
*tombstone* id and acknowledged again on sight. Tombstones are few and
bounded: the oldest are forgotten past :data:`MAX_TOMBSTONES`.

Receipts are not written down: a new process has a new Channel, and the old
Channel's leases died with it, so loaded entries wait for their redelivery.

The file is JSON lines: a ``{"base": n}`` header, ``{"t": id}`` tombstones,
then one ``{"m": ...}`` per message. Committing rewrites it (to a temporary
file, fsynced, renamed over) with only what is left, so it stays as small as
the uncommitted backlog.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from agents.messaging import Message
from agents.spark.errors import SparkError

__all__ = ["MAX_TOMBSTONES", "Entry", "WalError", "WriteAheadLog"]

#: Committed ids remembered for a late redelivery, at most.
MAX_TOMBSTONES: Final = 10_000
_FILE: Final = "wal.jsonl"
_LOCK: Final = "wal.lock"
#: Seconds between attempts to take a busy lock.
_LOCK_RETRY: Final = 0.05


class WalError(SparkError):
    """The log cannot serve what was asked: a range it no longer holds, a corrupt file."""


@dataclass(slots=True)
class Entry:
    """One message taken from the queue, at its sequence number.

    ``receipt`` is the live receipt of its current delivery, None until the
    message is delivered to this process (entries loaded from the file).
    """

    seq: int
    message: Message
    receipt: str | None


class WriteAheadLog:
    """The log in ``directory`` (created if missing), locked against a second user.

    Args:
        directory: where the log lives; it must outlive the query, like its checkpoint.
        fsync: whether :meth:`sync` fsyncs (off only for throwaway runs).
        lock_timeout: seconds to wait for another process to let go of the log (a
            restarted query can start before the old query's worker has exited).

    Raises:
        WalError: the log is still in use after ``lock_timeout``, or corrupt.
    """

    def __init__(self, directory: Path, *, fsync: bool = True, lock_timeout: float = 30.0) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(directory / _LOCK, lock_timeout)
        try:
            self._open(directory, fsync)
        except BaseException:
            os.close(self._lock)
            raise

    def _open(self, directory: Path, fsync: bool) -> None:
        self._path = directory / _FILE
        self._fsync = fsync
        self.base = 0
        self._entries: list[Entry] = []
        self._by_id: dict[str, Entry] = {}
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        #: Payload bytes of the entries held (the uncommitted backlog).
        self.payload_bytes = 0
        if self._path.exists():
            self._load()
        self._file = self._path.open("a", encoding="utf-8")
        self._dirty = False

    @property
    def end(self) -> int:
        """One past the last sequence number taken."""
        return self.base + len(self._entries)

    def close(self) -> None:
        """Close the file (synced first) and let go of the lock."""
        try:
            self.sync()
            self._file.close()
        finally:
            os.close(self._lock)

    # -- taking messages ---------------------------------------------------------

    def add(self, messages: Iterable[Message]) -> list[Message]:
        """Append new messages; return the redeliveries of committed ones to acknowledge.

        A redelivery of an uncommitted message refreshes its receipt only.
        """
        again: list[Message] = []
        lines: list[str] = []
        for message in messages:
            known = self._by_id.get(message.id)
            if known is not None:
                known.receipt = message.receipt
            elif message.id in self._tombstones:
                again.append(message)
            else:
                entry = Entry(self.end, message, message.receipt)
                self._entries.append(entry)
                self._by_id[message.id] = entry
                self.payload_bytes += len(message.payload)
                lines.append(json.dumps({"m": _encode(entry)}, separators=(",", ":")))
        if lines:
            self._file.write("\n".join(lines) + "\n")
            self._dirty = True
        return again

    def sync(self) -> None:
        """Make every appended entry durable (called before offsets are shown)."""
        if not self._dirty:
            return
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        self._dirty = False

    def entries(self, start: int, end: int) -> list[Entry]:
        """The entries with ``start <= seq < end``.

        Raises:
            WalError: part of the range was committed (and dropped) or never taken.
        """
        if start < self.base or end > self.end or start > end:
            raise WalError(
                f"offsets {start}..{end} are not in the log, which holds {self.base}..{self.end}"
                " (was the walPath changed or deleted while the checkpoint was kept?)"
            )
        return self._entries[start - self.base : end - self.base]

    # -- committing --------------------------------------------------------------

    def commit(self, end: int, unconfirmed: Iterable[str]) -> None:
        """Drop the entries below ``end``: Spark committed them and they were acknowledged.

        Args:
            end: the new base (beyond :attr:`end` too: a checkpoint ahead of a
                lost log fast-forwards it).
            unconfirmed: ids among them whose acknowledgement may not have
                counted; they become tombstones.
        """
        if end <= self.base:
            return
        dropped = self._entries[: end - self.base]
        self._entries = self._entries[end - self.base :]
        for entry in dropped:
            self._by_id.pop(entry.message.id, None)
            self.payload_bytes -= len(entry.message.payload)
        for message_id in unconfirmed:
            self._tombstones[message_id] = None
            self._tombstones.move_to_end(message_id)
        while len(self._tombstones) > MAX_TOMBSTONES:
            self._tombstones.popitem(last=False)
        self.base = end
        self._rewrite()

    def forget(self, message_ids: Iterable[str]) -> None:
        """These tombstones were acknowledged at last."""
        for message_id in message_ids:
            self._tombstones.pop(message_id, None)

    # -- the file ----------------------------------------------------------------

    def _rewrite(self) -> None:
        self._file.close()
        temporary = self._path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as out:
            out.write(json.dumps({"base": self.base}) + "\n")
            for message_id in self._tombstones:
                out.write(json.dumps({"t": message_id}) + "\n")
            for entry in self._entries:
                out.write(json.dumps({"m": _encode(entry)}, separators=(",", ":")) + "\n")
            out.flush()
            if self._fsync:
                os.fsync(out.fileno())
        temporary.replace(self._path)
        if self._fsync:
            directory = os.open(self._path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        self._file = self._path.open("a", encoding="utf-8")
        self._dirty = False

    def _load(self) -> None:
        good = 0
        with self._path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.endswith("\n"):
                    break  # a torn last line: never synced, so never shown to Spark
                good += len(line.encode("utf-8"))
                try:
                    record = json.loads(line)
                    if "base" in record:
                        self.base = int(record["base"])
                    elif "t" in record:
                        self._tombstones[str(record["t"])] = None
                    else:
                        entry = _decode(record["m"])
                        if entry.seq != self.end:
                            raise WalError(f"sequence {entry.seq} where {self.end} was due")
                        self._entries.append(entry)
                        self._by_id[entry.message.id] = entry
                        self.payload_bytes += len(entry.message.payload)
                except (ValueError, KeyError, TypeError) as exc:
                    raise WalError(f"{self._path}:{number}: corrupt record") from exc
        if good != self._path.stat().st_size:
            os.truncate(self._path, good)


def _lock(path: Path, timeout: float) -> int:
    """Take an exclusive lock on ``path``; it ends with the descriptor (or the process)."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(descriptor)
                raise WalError(f"{path.parent} is in use by another query") from None
            # flock cannot wait with a deadline: try again shortly.
            time.sleep(_LOCK_RETRY)


def _encode(entry: Entry) -> dict[str, Any]:
    message = entry.message
    return {
        "seq": entry.seq,
        "id": message.id,
        "destination": message.destination,
        "subscription": message.subscription,
        "type": message.type,
        "ts": message.timestamp,
        "exp": message.expiration,
        "priority": message.priority,
        "deliveries": message.deliveries,
        "keys": dict(message.keys),
        "payload": base64.b64encode(message.payload).decode("ascii"),
    }


def _decode(record: dict[str, Any]) -> Entry:
    message = Message(
        destination=str(record["destination"]),
        subscription=str(record["subscription"]),
        type=str(record["type"]),
        id=str(record["id"]),
        timestamp=int(record["ts"]),
        expiration=None if record["exp"] is None else int(record["exp"]),
        priority=int(record["priority"]),
        receipt=None,
        deliveries=None if record["deliveries"] is None else int(record["deliveries"]),
        keys={str(k): str(v) for k, v in record["keys"].items()},
        payload=base64.b64decode(record["payload"]),
    )
    return Entry(int(record["seq"]), message, None)

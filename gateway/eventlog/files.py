"""The ``memory`` engine's event log: rotating NDJSON files under ``data_dir/events``.

Each file is named for the UTC time it was started, to the microsecond
(``events-20261121T091500123456Z.ndjson``), so sorting the names sorts the
files by time; a name is never reused, even for two files started within one
microsecond. Every line is one event's JSON. A batch that would take the file
past ``max_file_bytes`` is split at a line boundary and the rest goes to a new
file, so no line is ever split across files and a file only outgrows the limit
when one line alone does. Past ``max_files`` files the oldest is deleted.

The broker writes; readers (Spark) may read any file at any time, and see whole
lines up to the end of the last batch written: each batch is flushed to the
file before the next. Files left by an earlier run stay and count towards
``max_files``; a new run starts a new file.

Writes run in a worker thread (``asyncio.to_thread``), one at a time, so the
event loop never waits for the disk.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

from gateway.eventlog.schema import FILE_GLOB

__all__ = ["FileStore"]

_PREFIX = "events-"
_SUFFIX = ".ndjson"
_TIME_FORMAT = "%Y%m%dT%H%M%S%fZ"
_MICROSECOND = timedelta(microseconds=1)


class FileStore:
    """Writes NDJSON batches to rotating files in ``directory``.

    Args:
        directory: where the files go (created on the first write).
        max_file_bytes: the size past which a new file is started.
        max_files: files kept at most, the one being written included.
    """

    def __init__(self, directory: Path, *, max_file_bytes: int, max_files: int) -> None:
        if max_file_bytes < 1 or max_files < 1:
            raise ValueError("max_file_bytes and max_files must be positive")
        self.directory = directory
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self._file: IO[bytes] | None = None
        self._size = 0
        self._files: list[Path] | None = None  # oldest first; read on the first write
        self._last_stamp: datetime | None = None
        # One writer at a time, even when stop() gives up on a write still running
        # in its thread and closes the store.
        self._mutex = threading.Lock()

    async def write(self, chunks: Sequence[bytes], count: int) -> None:
        """Append ``chunks`` (each whole NDJSON lines), rotating as needed."""
        await asyncio.to_thread(self._write, chunks)

    async def close(self) -> None:
        """Close the current file."""
        await asyncio.to_thread(self._close)

    def files(self) -> list[Path]:
        """The log's files, oldest first (from the directory, not from memory)."""
        return sorted(self.directory.glob(FILE_GLOB))

    # -- in the worker thread ------------------------------------------------

    def _write(self, chunks: Sequence[bytes]) -> None:
        with self._mutex:
            for lines in chunks:
                self._append(lines)
            if self._file is not None:
                self._file.flush()

    def _append(self, lines: bytes) -> None:
        view = memoryview(lines)
        start, end = 0, len(lines)
        while start < end:
            if self._file is None:
                self._open()
                assert self._file is not None
            room = self.max_file_bytes - self._size
            if end - start <= room:
                stop = end
            else:
                # The last whole line that fits; 0 when none does.
                stop = lines.rfind(b"\n", start, start + room) + 1
                if stop == 0:
                    if self._size:
                        stop = start  # none fits: on to a new file
                    else:
                        # One line larger than a whole file: a file of its own.
                        newline = lines.find(b"\n", start)
                        stop = end if newline == -1 else newline + 1
            if stop > start:
                self._file.write(view[start:stop])
                self._size += stop - start
                start = stop
            if start < end:
                self._rotate()

    def _open(self) -> None:
        if self._files is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._files = self.files()
        path = self.directory / f"{_PREFIX}{self._stamp().strftime(_TIME_FORMAT)}{_SUFFIX}"
        self._file = path.open("ab")
        self._size = self._file.tell()
        self._files.append(path)
        while len(self._files) > self.max_files:
            self._files.pop(0).unlink(missing_ok=True)

    def _stamp(self) -> datetime:
        """Now, or a microsecond after the last file's name if that is not later."""
        now = datetime.now(UTC)
        last = self._last_stamp
        if self._files:
            latest = _stamp_of(self._files[-1])
            if latest is not None and (last is None or latest > last):
                last = latest
        if last is not None and now <= last:
            now = last + _MICROSECOND
        self._last_stamp = now
        return now

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._size = 0

    def _close(self) -> None:
        with self._mutex:
            self._rotate()


def _stamp_of(path: Path) -> datetime | None:
    name = path.name
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        return None
    try:
        return datetime.strptime(name[len(_PREFIX) : -len(_SUFFIX)], _TIME_FORMAT).replace(
            tzinfo=UTC
        )
    except ValueError:
        return None

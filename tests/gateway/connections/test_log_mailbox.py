"""LogMailbox: an HTTP Channel's outbox on a bus, appending to the plane's Channel log."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from gateway.connections.log_mailbox import LogMailbox
from gateway.plane.memory import MemoryBus, MemoryPlane
from tests.support import T

pytestmark = pytest.mark.anyio

CHANNEL = "0123456789abcdef0123456789abcdef"


async def started() -> MemoryPlane:
    plane = MemoryPlane("broker-a", bus=MemoryBus())
    await plane.start(lambda envelope: None, lambda broker: None)
    return plane


async def test_offers_are_appended_in_order_and_it_never_fills() -> None:
    plane = await started()
    try:
        log = plane.channel_log
        await log.open(CHANNEL, digest=b"d", idle=60.0)
        mailbox = LogMailbox(log, CHANNEL)
        assert all(mailbox.offer(b"c=n;%d" % n) for n in range(1, 4))
        read = await log.read(CHANNEL, 0, 10, 0)
        assert read is not None and [f for _, f in read.frames] == [b"c=n;1", b"c=n;2", b"c=n;3"]
        # Nothing waits here, so nothing holds a publisher back.
        assert mailbox.queued_bytes == 0
        assert mailbox.room() == (sys.maxsize, sys.maxsize)
        relieved: list[str] = []
        mailbox.on_relief(lambda: relieved.append("relief"))
        mailbox.when_drained(lambda: relieved.append("drained"))
        mailbox.when_drained(None)
        mailbox.stalled()
        assert relieved == ["relief", "drained"]
        mailbox.close()
        assert mailbox.closed and not mailbox.offer(b"c=late;")
        assert mailbox.room() == (0, 0)
        other = LogMailbox(log, CHANNEL)
        other.abort()
        assert other.closed
    finally:
        await plane.close()


class Records(logging.Handler):
    """The records of a logger, and an event set by the first."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.first = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.first.set()


async def test_an_append_to_a_log_that_is_gone_is_logged() -> None:
    plane = await started()
    records = Records()
    logger = logging.getLogger("asbp.plane")
    logger.addHandler(records)
    try:
        mailbox = LogMailbox(plane.channel_log, "f" * 32)  # never opened
        assert mailbox.offer(b"c=lost;")
        await asyncio.wait_for(records.first.wait(), 5 * T)
        (record,) = records.records
        assert record.getMessage() == "plane.log_append_failed"
        assert record.channel == "f" * 32  # type: ignore[attr-defined]
    finally:
        logger.removeHandler(records)
        await plane.close()

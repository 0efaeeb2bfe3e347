"""The ``asbp`` sink: ``df.write`` and ``writeStream`` publish each row as an ``asbp.publish``.

Each task (one per partition, on an executor) opens its own Channel, publishes
its rows with a bounded window of publications awaiting ``asbp.accepted``
(:func:`agents.messaging.publish_all`), and returns only when the broker has
stored every one. So a write that returns has been stored; a write that fails
has stored a prefix of some partitions. Spark retries failed tasks, and the bus
has no idempotent publication, so the sink is at least once: a retried task
publishes its partition again. Consumers that need exactly once de-duplicate on
a key in the payload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from agents.messaging import MessagingClient, Publication, publish_all
from agents.spark.source_options import SinkOptions

__all__ = ["AsbpStreamWriter", "AsbpWriter", "Published", "publish_rows"]

_log = logging.getLogger("asbp.spark.sink")


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    """What one task published: how many rows, all stored."""

    count: int


def publish_rows(options: SinkOptions, rows: Iterator[Row]) -> Published:
    """Publish ``rows`` over a fresh Channel; return once all are stored."""

    def publications() -> Iterator[Publication]:
        for row in rows:
            fields = row.asDict()
            payload = fields["payload"]
            if payload is None:
                raise ValueError("an asbp write got a row with a null payload")
            destination = fields.get("destination") or options.destination
            if destination is None:
                raise ValueError("an asbp write got a row without a destination")
            yield Publication(
                destination,
                payload if isinstance(payload, str) else bytes(payload),
                type=options.type,
                priority=fields.get("priority"),
                ttl=fields.get("ttl"),
                media_type=options.media_type,
            )

    async def run() -> int:
        async with MessagingClient.websocket(options.url, timeout=options.timeout) as client:
            ids = await publish_all(
                client, publications(), window=options.window, timeout=options.timeout
            )
        return len(ids)

    return Published(asyncio.run(run()))


class AsbpWriter(DataSourceWriter):
    """``df.write.format("asbp")``: every row published, each task on its own Channel."""

    def __init__(self, options: SinkOptions) -> None:
        self._options = options

    def write(self, iterator: Iterator[Row]) -> Published:
        return publish_rows(self._options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        # Every row was stored when its task returned: nothing is left to make visible.
        _log.debug("asbp write: %d rows published", _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # A publication cannot be taken back; what the finished tasks sent stays.
        _log.warning("asbp write aborted after %d rows were published", _total(messages))


class AsbpStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("asbp")``: each micro-batch published like a batch write."""

    def __init__(self, options: SinkOptions) -> None:
        self._options = options

    def write(self, iterator: Iterator[Row]) -> Published:
        return publish_rows(self._options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log.debug("asbp batch %d: %d rows published", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log.warning("asbp batch %d aborted after %d rows", batchId, _total(messages))


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(m.count for m in messages if isinstance(m, Published))

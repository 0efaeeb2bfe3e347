"""The ``redis`` engine's event log: one capped Redis Stream, ``asbp:events``.

Every broker on the Redis adds its events to the same stream, one entry per
event with the single field ``e`` holding the event's JSON (the same bytes as an
NDJSON line of the ``memory`` engine, without the newline). Each entry is added
with ``XADD asbp:events MAXLEN ~ <max_events> * e <json>``, so Redis trims the
oldest entries in whole macro-nodes and the stream holds about ``max_events``.

A batch goes to Redis in one pipeline of ``EVAL`` calls, one per NDJSON chunk
the recorder made (up to :data:`~gateway.eventlog.recorder.CHUNK` lines), each
passing the chunk as one argument for the script to split at its newlines and
add with that ``XADD`` in a loop. Queuing one ``XADD`` per event in a redis-py
pipeline costs the broker 10-15 microseconds of CPU per event, packing the
commands and parsing the replies, which at 30,000 Commands a second is a third
of a core; one argument per event to a script call, about half a microsecond
(splitting the chunk, then packing each line); one argument per chunk, next to
nothing: the split moves to Redis, where it costs less than the ``XADD`` itself.
A chunk keeps Redis busy for about a millisecond.

On a Redis Cluster (``redis+cluster://``) the stream is one key, so it lives in
one slot on one primary: every script call declares it, and the cluster client
sends the pipeline there. The event log is one ordered stream for the Spark
jobs; spreading it over slots would give up that order.

This store has its own connection, built from the broker's ``redis_url``. When
Redis cannot be reached, ``write`` raises and the recorder counts the batch as
lost; the next batch tries again. The timeouts below bound how long one batch
can keep the flusher waiting, never the router.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from gateway.engines.redis.connection import Client, connect
from gateway.eventlog.schema import STREAM_FIELD, STREAM_KEY

__all__ = ["STREAM_KEY", "StreamStore"]

#: Seconds to connect, and to wait for a reply, before a batch counts as lost.
CONNECT_TIMEOUT: Final = 2.0
COMMAND_TIMEOUT: Final = 5.0

# KEYS[1]: the stream; ARGV[1]: MAXLEN; ARGV[2]: the field; ARGV[3]: NDJSON, each
# line ending with a newline (which JSON text never holds unescaped).
_ADD: Final = """
local key, maxlen, field, lines = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local start, added = 1, 0
while true do
    local newline = string.find(lines, '\\n', start, true)
    if newline == nil then break end
    redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*', field,
        string.sub(lines, start, newline - 1))
    start, added = newline + 1, added + 1
end
return added
"""


class StreamStore:
    """Adds NDJSON batches to a capped Redis Stream.

    Args:
        url: the Redis to use (the broker's ``redis_url``).
        max_events: the stream's approximate length limit.
        key: the stream's key; brokers and readers use :data:`STREAM_KEY`.
    """

    def __init__(self, url: str, *, max_events: int, key: str = STREAM_KEY) -> None:
        if max_events < 1:
            raise ValueError("max_events must be positive")
        self.key = key
        self.max_events = max_events
        # Connects on first use, so a broker starts while Redis is down.
        # One Redis or a cluster, as the engine connects (one retry on a connection
        # that Redis closed while idle; a cluster follows its slot map).
        self._client: Client = connect(
            url, connect_timeout=CONNECT_TIMEOUT, command_timeout=COMMAND_TIMEOUT
        )

    async def write(self, chunks: Sequence[bytes], count: int) -> None:
        """Add one entry per line of ``chunks``, one script call per chunk.

        Raises:
            redis.RedisError: Redis could not be reached or refused the script.
        """
        if not count:
            return
        async with self._client.pipeline(transaction=False) as pipeline:
            for lines in chunks:
                pipeline.eval(_ADD, 1, self.key, self.max_events, STREAM_FIELD, lines)
            await pipeline.execute()

    async def close(self) -> None:
        """Disconnect."""
        await self._client.aclose()

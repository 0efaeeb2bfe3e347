"""The broker's own publications under ``/system/`` (Sapo-Broker 3, "System Topics").

::

    /system/stats/topic-consumer-count/<subscription>   <broker>#<subscription>#<count>
    /system/stats/queue-consumer-count/<queue>          <broker>#<queue>#<count>
    /system/faults/<broker>                             a JSON record of a fault it sent

Consumer counts are this broker's subscribers of one subscription (or
queue). They are published when they change and, every
``system_topic_interval`` seconds, all of them again (a count that dropped to
0 is published once, then no more), so a monitor that starts late learns the
state within one interval. Publications go through the engine like any topic
message, so every broker's subscribers see them, and they bypass access
control: the default policy refuses everybody else's writes under
``/system/``.

Nothing here blocks the caller. Changes are coalesced per topic (the latest
count wins) and published by one task, in order; fault records are
rate-limited (a token bucket of :data:`FAULT_BURST`, refilled at
:data:`FAULTS_PER_SECOND`) and bounded (:data:`FAULT_BACKLOG` waiting at
most); records that did not fit are counted in the next one's ``suppressed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

import orjson

from asbp import AsbpError, FaultCode
from gateway.engines.base import Engine, Message
from gateway.messaging.notifications import milliseconds
from gateway.tasks import cancel_and_wait

__all__ = [
    "FAULTS_PER_SECOND",
    "FAULTS_PREFIX",
    "FAULT_BACKLOG",
    "FAULT_BURST",
    "QUEUE_COUNT_PREFIX",
    "TOPIC_COUNT_PREFIX",
    "SystemTopics",
]

TOPIC_COUNT_PREFIX: Final = "/system/stats/topic-consumer-count/"
QUEUE_COUNT_PREFIX: Final = "/system/stats/queue-consumer-count/"
FAULTS_PREFIX: Final = "/system/faults/"
#: Fault records published at once after a quiet spell, at most.
FAULT_BURST: Final = 50
#: Fault records per second, in the long run.
FAULTS_PER_SECOND: Final = 10.0
#: Fault records waiting to be published, at most.
FAULT_BACKLOG: Final = 100


class SystemTopics:
    """Publishes consumer counts and fault records for one broker.

    Args:
        engine: where they are published.
        broker_id: the broker's name, in topic names and bodies.
        interval: seconds between periodic publications of every count.
        clock: wall-clock seconds (timestamps, and the token bucket).
        log: where failures go.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        broker_id: str,
        interval: float,
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._broker_id = broker_id
        self._interval = interval
        self._clock = clock
        self._log = log
        #: Counts to publish, by topic: the latest wins.
        self._counts: dict[str, str] = {}
        self._faults: deque[Message] = deque()
        self._suppressed = 0
        self._tokens = float(FAULT_BURST)
        self._refilled = clock()
        self._next_periodic = clock() + interval
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the publishing task; call inside the serving loop."""
        self._task = asyncio.create_task(self._run(), name="asbp-system-topics")

    async def stop(self) -> None:
        """Stop publishing; what still waits is dropped (the broker is going away)."""
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)

    # -- counts ----------------------------------------------------------------

    def topic_count(self, subscription: str, count: int) -> None:
        """This broker's subscribers of a topic subscription changed to ``count``."""
        self._count(TOPIC_COUNT_PREFIX, subscription, count)

    def queue_count(self, queue: str, count: int) -> None:
        """This broker's consumers of a queue changed to ``count``."""
        self._count(QUEUE_COUNT_PREFIX, queue, count)

    def _count(self, prefix: str, name: str, count: int) -> None:
        topic = prefix + name
        body = f"{self._broker_id}#{name}#{count}"
        self._counts.pop(topic, None)  # re-insert: publications keep the order of changes
        self._counts[topic] = body
        self._wake.set()

    def tick(self, topics: Iterable[tuple[str, int]], queues: Iterable[tuple[str, int]]) -> bool:
        """Publish every count again if the interval has passed; True if it had."""
        now = self._clock()
        if now < self._next_periodic:
            return False
        self._next_periodic = now + self._interval
        for name, count in topics:
            self.topic_count(name, count)
        for name, count in queues:
            self.queue_count(name, count)
        return True

    # -- faults ----------------------------------------------------------------

    def fault(
        self,
        code: FaultCode,
        message: str,
        *,
        cause: str | None,
        to: str,
        agent: str | None = None,
    ) -> None:
        """Record a fault the broker sent (``to``: "user-agent" or "application-agent")."""
        now = self._clock()
        self._tokens = min(
            float(FAULT_BURST), self._tokens + (now - self._refilled) * FAULTS_PER_SECOND
        )
        self._refilled = now
        if self._tokens < 1 or len(self._faults) >= FAULT_BACKLOG:
            self._suppressed += 1
            return
        self._tokens -= 1
        record: dict[str, object] = {
            "broker": self._broker_id,
            "code": int(code),
            "description": code.description,
            "message": message,
            "cause": cause,
            "to": to,
            "ts": milliseconds(now),
        }
        if agent is not None:
            record["agent"] = agent
        if self._suppressed:
            record["suppressed"] = self._suppressed
            self._suppressed = 0
        self._faults.append(
            self._message(
                FAULTS_PREFIX + self._broker_id,
                orjson.dumps(record),
                {"m": "application/json", "e": "UTF-8"},
            )
        )
        self._wake.set()

    # -- publishing --------------------------------------------------------------

    def _message(self, topic: str, payload: bytes, headers: dict[str, str]) -> Message:
        return Message(
            id=uuid.uuid4().hex,
            destination=topic,
            payload=payload,
            timestamp=self._clock(),
            headers=headers,
        )

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._counts or self._faults:
                if self._faults:
                    message = self._faults.popleft()
                else:
                    topic = next(iter(self._counts))
                    body = self._counts.pop(topic)
                    message = self._message(topic, body.encode(), {"e": "UTF-8"})
                try:
                    await self._engine.publish(message)
                except AsbpError as exc:
                    self._log.warning(
                        "system.publish_failed",
                        extra={
                            "topic": message.destination,
                            "code": int(exc.code),
                            "reason": exc.message,
                        },
                    )

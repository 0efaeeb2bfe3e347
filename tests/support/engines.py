"""Engine test helpers: a fake clock, a message factory, a listener recorder, and
:class:`Engines`, which builds started engines of one kind and closes them afterwards.

The engine conformance suite (tests/conformance/) and each engine's own tests
(tests/gateway/engines/) share these.

Two rules keep those tests fast and honest:

* Time that only decides *what* happens (expirations, delays, lease deadlines
  checked on the next call) is a :class:`FakeClock` advanced by the test.
* Time that decides *when* something happens (a waiting fetch woken by a lease
  running out) uses the real clock, limits of a fraction of ``T``, and the
  engine's own blocking ``fetch`` with a deadline: never a sleep.

Listener calls arrive later than the call that caused them (``call_soon`` for
``memory``, Redis pub/sub for ``redis``), so tests wait for them with
:meth:`Recorder.wait_for`. To show that something did *not* arrive, a test
sends a later *fence* through the same path and checks once the fence is in.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final, Generic, TypeVar

import anyio

from gateway.engines.base import Delivery, Engine, EngineLimits, Message, NoticeEvent
from tests.support import T

__all__ = [
    "ENGINES",
    "Build",
    "Engines",
    "FakeClock",
    "Recorder",
    "ids",
    "make_message",
    "notify_address",
]

X = TypeVar("X")


class FakeClock:
    """Epoch seconds that move only when told; starts at the real time."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Recorder(Generic[X]):
    """A listener that keeps what it is called with, and lets a test wait for it."""

    def __init__(self) -> None:
        self.items: list[X] = []
        self._changed = anyio.Event()

    def __call__(self, item: X) -> None:
        self.items.append(item)
        self._changed.set()

    async def wait_for(self, predicate: Callable[[list[X]], bool], timeout: float = 5 * T) -> None:
        """Return once ``predicate(items)`` holds; fail after ``timeout`` seconds."""
        with anyio.fail_after(timeout):
            while not predicate(self.items):
                self._changed = anyio.Event()
                await self._changed.wait()

    async def wait_count(self, count: int, timeout: float = 5 * T) -> list[X]:
        """Return the items once there are at least ``count``."""
        await self.wait_for(lambda items: len(items) >= count, timeout)
        return self.items


def notify_address(broker_id: str, channel: str = "channel-1") -> str:
    """A notice address in the shape the broker uses: ``<broker id>/<channel id>/<u>``."""
    return f"{broker_id}/{channel}/1"


def make_message(
    destination: str,
    clock: Callable[[], float] = time.time,
    *,
    payload: bytes = b"payload",
    notices: Iterable[NoticeEvent] = (),
    **fields: Any,
) -> Message:
    """A message with a fresh id, stamped with ``clock()``."""
    return Message(
        id=uuid.uuid4().hex,
        destination=destination,
        payload=payload,
        timestamp=fields.pop("timestamp", clock()),
        notices=frozenset(notices),
        **fields,
    )


def ids(items: Iterable[Delivery | Message]) -> list[str]:
    """Message ids of deliveries or messages, in order."""
    return [item.message.id if isinstance(item, Delivery) else item.id for item in items]


#: Every engine the suite runs on; each test id ends in one of these.
ENGINES: Final = ("memory", "redis", "redis-cluster")

_DEFAULT_LIMITS: Final = EngineLimits()


#: Builds an engine: (limits, clock, broker_id) -> a new, unstarted engine.
Build = Callable[[EngineLimits, Callable[[], float], str], Engine]


class Engines:
    """Builds started engines of one kind, and closes them when the test ends."""

    def __init__(self, kind: str, build: Build) -> None:
        self.kind = kind
        self._build = build
        self._started: list[Engine] = []

    async def one(
        self,
        *,
        limits: EngineLimits = _DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
        broker_id: str = "broker-a",
    ) -> Engine:
        """A started engine for the broker ``broker_id``."""
        engine = self._build(limits, clock, broker_id)
        await engine.start()
        self._started.append(engine)
        return engine

    async def two(
        self, *, limits: EngineLimits = _DEFAULT_LIMITS, clock: Callable[[], float] = time.time
    ) -> tuple[Engine, Engine]:
        """The engines of two brokers sharing the backing store (see the module docstring)."""
        first = await self.one(limits=limits, clock=clock, broker_id="broker-a")
        if self.kind == "memory":
            return first, first
        second = await self.one(limits=limits, clock=clock, broker_id="broker-b")
        return first, second

    async def close(self) -> None:
        while self._started:
            await self._started.pop().close()

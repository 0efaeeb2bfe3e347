"""The engine conformance suite: one set of tests, run on every engine.

Each test takes the ``engines`` fixture (``conftest.py``), parametrised over
``memory`` and ``redis``, and holds the engine to the contract in
``gateway/engines/base.py``. This module holds the helpers the tests share:
a fake clock, a message factory and a recorder for listener calls.

Two rules keep the suite fast and honest:

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
from typing import Any, Generic, TypeVar

import anyio

from gateway.engines.base import Delivery, Message, NoticeEvent
from tests.support import T

__all__ = ["FakeClock", "Recorder", "ids", "make_message", "notify_address"]

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

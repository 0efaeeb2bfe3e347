"""A Course's queue on its own: the crossings of one loop turn stored together."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agents.credentials import generate_agent_key
from asbp import FaultCode
from courses.credential import SigningKey
from courses.link import OutboundCourse
from courses.settings import CourseSettings, PeerSettings
from gateway.auth.keys import keys_from_agent_table
from gateway.engines.base import EngineLimits
from gateway.engines.memory.engine import MemoryEngine

pytestmark = pytest.mark.anyio


def _link(tmp_path: Path, engine: MemoryEngine, **limits: int) -> OutboundCourse:
    private, public = generate_agent_key()
    (tmp_path / "b.pem").write_text(public)
    peer = PeerSettings(
        domain="b.test",
        urls=(),  # never dialled: only the queue is looked at
        keys=keys_from_agent_table("b.test", {"public_key": "b.pem"}, tmp_path),
        names=(),
        exchanges=frozenset(),
        addresses=(),
        routes=(),
    )
    settings = CourseSettings(
        domain="a.test",
        signing_key=private.encode(),
        kid=None,
        ca=None,
        peers={"b.test": peer},
        **limits,
    )
    return OutboundCourse(
        settings,
        peer,
        signing=SigningKey(private.encode(), domain="a.test"),
        engine=engine,
        allow_plain=True,
        on_done=lambda crossing: None,
        log=logging.getLogger("test"),
    )


async def test_the_crossings_of_one_turn_are_stored_together_and_in_order(
    tmp_path: Path,
) -> None:
    engine = MemoryEngine()
    link = _link(tmp_path, engine, queue_max_commands=3)
    refused: list[tuple[FaultCode, str]] = []

    def refuse(code: FaultCode, message: str) -> None:
        refused.append((code, message))

    stored = [
        link.submit_frame(f"{n:032x}", b"c=chat;%d" % n, notify={}, refuse=refuse) for n in range(4)
    ]

    # The fourth is past queue_max_commands: refused at once, nothing to wait for.
    assert stored[3] is None
    assert refused == [(FaultCode.COURSE_QUEUE_FULL, "the queue for b.test is full")]
    # The others share the turn's store, made at its end.
    assert stored[0] is stored[1] is stored[2]
    assert stored[0] is not None and not stored[0].done()
    assert await engine.depth(link.queue) == 0
    await stored[0]
    deliveries = await engine.fetch(link.queue, "c", count=10)
    assert [d.message.payload for d in deliveries] == [b"c=chat;0", b"c=chat;1", b"c=chat;2"]
    assert (link.depth, link.bytes) == (3, 24)
    await engine.close()


async def test_a_closed_engine_refuses_the_whole_turn_with_2005(tmp_path: Path) -> None:
    engine = MemoryEngine(limits=EngineLimits(max_queue_depth=1))
    link = _link(tmp_path, engine)
    refused: list[FaultCode] = []

    def refuse(code: FaultCode, message: str) -> None:
        refused.append(code)

    first = link.submit_frame("0" * 32, b"c=chat;", notify={}, refuse=refuse)
    link.submit_frame("1" * 32, b"c=chat;", notify={}, refuse=refuse)  # past the engine's depth
    assert first is not None
    await first
    assert refused == [FaultCode.COURSE_QUEUE_FULL]
    await engine.close()

    stored = link.submit_frame("2" * 32, b"c=chat;", notify={"notice": "delivered"}, refuse=refuse)
    assert stored is not None
    async with asyncio.timeout(5):
        await stored
    assert refused == [FaultCode.COURSE_QUEUE_FULL, FaultCode.ENGINE_UNAVAILABLE]
    assert (link.depth, link.bytes) == (1, 7)  # only the first is held

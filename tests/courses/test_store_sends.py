"""The store's own sending path (courses/link.py, memory engine), with real brokers.

A loop turn's crossings are sent by the store itself when the link is up, the pump
idle and the window open; otherwise the pump task sends them. Each test checks that
the path it is about was taken (``sent_by_store``, and ``sent`` for both), and the
Course's guarantees across it: in order, once, acknowledged only once accepted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asbp import Command, FaultCode
from asbp.fault_commands import read_fault
from courses.link import OutboundCourse
from courses.service import Courses
from gateway.app import create_app
from gateway.config.model import ChannelLimits
from tests.courses.buses import Relay, User, bus_config, make_bus, serve_bus, user
from tests.support import RunningServer

pytestmark = pytest.mark.anyio


@dataclass
class Pair:
    a: RunningServer
    b: RunningServer
    to_b: Relay
    #: a.test's Course to b.test, and b.test's Courses.
    link: OutboundCourse
    courses_b: Courses


@asynccontextmanager
async def pair(
    tmp_path: Path, channels: ChannelLimits | None = None, **courses_a: Any
) -> AsyncIterator[Pair]:
    """a.test dialling b.test through a relay (plain text on loopback, the dev flag);
    b.test only answers. ``courses_a``: a.test's ``[courses]`` settings;
    ``channels``: b.test's Channel limits."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_b:
        config_a = bus_config(a, {b: to_b.url("ws")}, tls=None, courses=courses_a)
        config_b = bus_config(b, {a: []}, tls=None, channels=channels or ChannelLimits())
        app_a, app_b = create_app(config_a), create_app(config_b)
        async with (
            serve_bus(a, config_a, None, app=app_a) as server_a,
            serve_bus(b, config_b, None, app=app_b) as server_b,
        ):
            to_b.target = server_b.port
            try:
                yield Pair(
                    server_a,
                    server_b,
                    to_b,
                    app_a.state.courses.links["b.test"],
                    app_b.state.courses,
                )
            finally:
                await to_b.drain()


async def _bodies(bob: User, count: int) -> list[bytes]:
    return [(await bob.recv()).body for _ in range(count)]


async def _acknowledged(alice: User, body: bytes, u: int) -> None:
    """Send ``body`` asking for a notice, and wait for it: once it comes, that crossing
    and every one sent before it on the link are acknowledged (in order)."""
    await alice.send(Command({"c": "chat", "r": "bob*b.test", "notice": "delivered", "u": u}, body))
    notice = await alice.recv()
    assert (notice.name, notice.get("event"), notice.command_id) == ("asbp.notice", "delivered", u)


async def test_the_store_and_the_pump_both_send_and_the_order_holds(tmp_path: Path) -> None:
    """A window of 4: a burst fills it from the store, and the pump sends the rest as
    acknowledgements make room; bob gets every Command once, in order."""
    async with (
        pair(tmp_path, window=4) as buses,
        user(buses.a.ws_url, "alice", None) as alice,
        user(buses.b.ws_url, "bob", None) as bob,
    ):
        # Once one has crossed and been acknowledged, the link is up and its pump idle.
        await _acknowledged(alice, b"first", 1)
        assert await _bodies(bob, 1) == [b"first"]
        by_store = buses.link.sent_by_store
        # Sent without waiting: the broker reads many in one turn, more than the window.
        frames = [Command({"c": "chat", "r": "bob*b.test"}, b"%d" % n) for n in range(200)]
        await asyncio.gather(*(alice.send(frame) for frame in frames))
        await _acknowledged(alice, b"last", 2)
        assert await _bodies(bob, 201) == [b"%d" % n for n in range(200)] + [b"last"]
        link = buses.link
        assert link.sent == link.acknowledged == 202
        assert link.sent_by_store > by_store, "the store sent none"
        assert link.sent - link.sent_by_store > 0, "the pump sent none"
        assert buses.courses_b.duplicates == 0


async def test_crossings_the_store_sent_go_again_once_when_the_course_drops(
    tmp_path: Path,
) -> None:
    """b.test accepts them but its acknowledgements never arrive; the link drops. The
    next link sends them again, first: b.test drops the copies, bob sees each once."""
    async with (
        pair(tmp_path) as buses,
        user(buses.a.ws_url, "alice", None) as alice,
        user(buses.b.ws_url, "bob", None) as bob,
    ):
        await _acknowledged(alice, b"warm", 1)
        assert await _bodies(bob, 1) == [b"warm"]
        by_store = buses.link.sent_by_store
        buses.to_b.hold_back = True  # b.test's acknowledgements stop here
        for n in range(10):
            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"%d" % n))
        assert await _bodies(bob, 10) == [b"%d" % n for n in range(10)]
        assert buses.link.sent_by_store == by_store + 10
        assert buses.link.acknowledged == 1
        connections = buses.to_b.connections
        buses.to_b.cut()
        buses.to_b.target = buses.b.port
        await buses.to_b.wait_connections(connections + 1)
        await _acknowledged(alice, b"after", 2)
        # Had a copy been delivered again, it would come before this one.
        assert await _bodies(bob, 1) == [b"after"]
        assert buses.courses_b.duplicates == 10
        assert buses.link.acknowledged == 12


async def test_a_crossing_expired_when_the_store_leases_it_is_faulted_with_2210(
    tmp_path: Path,
) -> None:
    """``max_age`` below a float's step at today's time: a crossing has expired by the
    time it is leased, on whichever path; its sender gets 2210 and nothing crosses."""
    async with (
        pair(tmp_path, max_age=1e-9) as buses,
        user(buses.a.ws_url, "alice", None) as alice,
        user(buses.b.ws_url, "bob", None) as bob,
    ):
        # The link is dialled (its handshake follows): the first may still find the
        # pump's path, the next ones the store's.
        await buses.to_b.wait_connections(1)
        for u in (1, 2, 3):
            await alice.send(Command({"c": "chat", "r": "bob*b.test", "u": u}, b"late"))
            fault = await alice.recv()
            assert (read_fault(fault).code, fault.command_id) == (FaultCode.COURSE_EXPIRED, u)
        assert buses.link.sent == 0
        await alice.send(Command({"c": "chat", "r": "nobody*a.test", "u": 4}))
        assert (await alice.recv()).command_id == 4
        assert bob.received == []


async def test_a_send_of_the_store_that_waits_for_the_socket_goes_before_the_pumps(
    tmp_path: Path,
) -> None:
    """The relay stops reading what a.test sends: its socket fills, a send of the store
    waits to drain, and the crossings stored meanwhile are the pump's, which waits for
    that send first. Let through, bob gets every Command once, in order."""
    # bob reads one at a time: room for all of them in his Channel's outbox.
    channels = ChannelLimits(outbox_bytes=64 * 1024 * 1024)
    async with (
        pair(tmp_path, channels) as buses,
        user(buses.a.ws_url, "alice", None) as alice,
        user(buses.b.ws_url, "bob", None) as bob,
    ):
        await _acknowledged(alice, b"warm", 1)
        assert await _bodies(bob, 1) == [b"warm"]
        buses.to_b.stall()
        # 24 MB: more than the loopback sockets' buffers hold between a.test and the relay.
        body = b"x" * 200_000
        for n in range(120):
            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"%03d" % n + body))
        # a.test answers alice's Channel in order: once this fault is back, every
        # Command before it is stored and the store has tried to send it.
        await alice.send(Command({"c": "chat", "r": "nobody*a.test", "u": 2}))
        assert (await alice.recv()).command_id == 2
        assert buses.link.store_sends_waited >= 1
        buses.to_b.resume()
        got = [(await bob.recv()).body[:3] for _ in range(120)]
        assert got == [b"%03d" % n for n in range(120)]
        await _acknowledged(alice, b"after", 3)
        assert await _bodies(bob, 1) == [b"after"]
        assert buses.courses_b.duplicates == 0
        assert buses.link.sent - buses.link.sent_by_store > 0, "the pump sent none"

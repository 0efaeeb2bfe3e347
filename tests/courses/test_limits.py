"""The bounds of a Course's queue and of a Command's journey, with real brokers.

Hop limit (2207), expiry (2210), a full queue (2209), and the ``redis`` engine
keeping a peer's queue across a restart of the sending broker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asbp import Command, FaultCode
from asbp.fault_commands import read_fault
from gateway.config.model import MessagingLimits
from tests.courses.buses import Relay, bus_config, make_bus, serve_bus, user
from tests.support import RedisServer, TlsFiles

pytestmark = pytest.mark.anyio


async def test_a_command_past_the_hop_limit_is_refused_with_2207(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """a.test → b.test → c.test with max_hops = 1 at c.test: the second crossing is one too many."""
    a, b, c = (make_bus(tmp_path, d) for d in ("a.test", "b.test", "c.test"))
    async with Relay() as to_a, Relay() as to_b, Relay() as to_c:
        config_a = bus_config(a, {b: to_b.url(), c: []}, tls=tls_files, routes={b: ["c.test"]})
        config_b = bus_config(b, {c: to_c.url(), a: to_a.url()}, tls=tls_files)
        config_c = bus_config(c, {a: to_a.url(), b: []}, tls=tls_files, courses={"max_hops": 1})
        async with (
            serve_bus(a, config_a, tls_files) as server_a,
            serve_bus(b, config_b, tls_files) as server_b,
            serve_bus(c, config_c, tls_files) as server_c,
            user(server_a.ws_url, "alice", tls_files) as alice,
        ):
            to_a.target, to_b.target, to_c.target = server_a.port, server_b.port, server_c.port
            await alice.send(Command({"c": "chat", "r": "carol*c.test", "u": 1}, b"far"))
            fault = await alice.recv()
            assert (read_fault(fault).code, fault.command_id) == (FaultCode.HOP_LIMIT, 1)
            for relay in (to_a, to_b, to_c):
                await relay.drain()


async def test_a_command_older_than_max_age_expires_with_2210(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_b:
        # max_age shorter than any link takes to come up: every Command expires queued.
        config_a = bus_config(a, {b: to_b.url()}, tls=tls_files, courses={"max_age": 0.001})
        async with (
            serve_bus(a, config_a, tls_files) as server_a,
            user(server_a.ws_url, "alice", tls_files) as alice,
        ):
            await alice.send(Command({"c": "chat", "r": "bob*b.test", "u": 2}, b"late"))
            config_b = bus_config(b, {a: []}, tls=tls_files)
            async with serve_bus(b, config_b, tls_files) as server_b:
                to_b.target = server_b.port
                fault = await alice.recv()
                assert (read_fault(fault).code, fault.command_id) == (FaultCode.COURSE_EXPIRED, 2)
                await to_b.drain()


async def test_a_full_queue_refuses_with_2209(tmp_path: Path, tls_files: TlsFiles) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_b:  # never pointed anywhere: b.test stays down
        config_a = bus_config(a, {b: to_b.url()}, tls=tls_files, courses={"queue_max_commands": 2})
        async with (
            serve_bus(a, config_a, tls_files) as server_a,
            user(server_a.ws_url, "alice", tls_files) as alice,
        ):
            for u in (1, 2, 3):
                await alice.send(Command({"c": "chat", "r": "bob*b.test", "u": u}, b"x"))
            fault = await alice.recv()
            assert (read_fault(fault).code, fault.command_id) == (FaultCode.COURSE_QUEUE_FULL, 3)


async def test_the_engine_refusing_a_crossing_while_the_course_is_up_gives_2209(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """With the Course up and its acknowledgements held back, the engine's own bound
    (``max_queue_depth``, below ``queue_max_commands``) refusing a crossing is fault
    2209 to its sender too, and nothing stored before it is lost."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_a, Relay() as to_b:
        config_a = bus_config(
            a, {b: to_b.url()}, tls=tls_files, messaging=MessagingLimits(max_queue_depth=2)
        )
        config_b = bus_config(b, {a: to_a.url()}, tls=tls_files)
        async with (
            serve_bus(a, config_a, tls_files) as server_a,
            serve_bus(b, config_b, tls_files) as server_b,
            user(server_a.ws_url, "alice", tls_files) as alice,
            user(server_b.ws_url, "bob", tls_files) as bob,
        ):
            to_a.target, to_b.target = server_a.port, server_b.port
            await alice.send(Command({"c": "chat", "r": "bob*b.test", "u": 1}, b"up"))
            assert (await bob.recv()).command_id == 1  # the Course is up
            # b.test's acknowledgements held back: what a.test sends stays leased in
            # its queue, which holds two, so by the fourth Command one is refused.
            to_b.hold_back = True
            for u in (2, 3, 4):
                await alice.send(Command({"c": "chat", "r": "bob*b.test", "u": u}, b"x"))
            fault = await alice.recv()
            refused = fault.command_id
            assert read_fault(fault).code == FaultCode.COURSE_QUEUE_FULL and refused in (3, 4)
            # Those stored before it crossed, in order.
            got = [(await bob.recv()).command_id for _ in range(2, refused)]
            assert got == list(range(2, refused))
            for relay in (to_a, to_b):
                await relay.drain()


async def test_the_redis_queue_outlives_a_restart_of_the_sending_broker(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with RedisServer(tmp_path / "redis-a") as redis_a:
        async with Relay() as to_b:
            config_a = bus_config(
                a, {b: to_b.url()}, tls=tls_files, engine="redis", redis_url=redis_a.url
            )
            async with (
                serve_bus(a, config_a, tls_files) as server_a,
                user(server_a.ws_url, "alice", tls_files) as alice,
            ):
                for n in range(5):
                    await alice.send(Command({"c": "chat", "r": "bob*b.test"}, str(n).encode()))
                # Queued once alice can hear back from the broker (one Channel, in order).
                await alice.send(Command({"c": "chat", "r": "nobody*a.test", "u": 1}, b""))
                assert read_fault(await alice.recv()).code == FaultCode.UNKNOWN_ADDRESS
            # A is gone; its queue for b.test is in Redis. A again, then B.
            async with serve_bus(a, config_a, tls_files):
                config_b = bus_config(b, {a: []}, tls=tls_files)
                async with (
                    serve_bus(b, config_b, tls_files) as server_b,
                    user(server_b.ws_url, "bob", tls_files) as bob,
                ):
                    to_b.target = server_b.port
                    bodies = [(await bob.recv()).body for _ in range(5)]
                    await to_b.drain()
    assert bodies == [b"0", b"1", b"2", b"3", b"4"]


async def test_a_command_with_no_room_for_the_course_keys_gets_a_fault(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """A header the Channel took, but too long once ``p`` and ``course.*`` are added:
    the sender gets 1104 and the Course never carries what its peer would refuse."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_b:
        config_a = bus_config(a, {b: to_b.url()}, tls=tls_files)
        async with (
            serve_bus(a, config_a, tls_files) as server_a,
            user(server_a.ws_url, "alice", tls_files) as alice,
        ):
            head = f"c=chat,r=bob*b.test,s={alice.subject},u=4,pad="
            pad = "x" * (8 * 1024 - len(head) - 10)
            await alice.ws.send(f"{head}{pad};".encode())
            fault = await alice.recv()
            assert (read_fault(fault).code, fault.command_id) == (FaultCode.HEADER_TOO_LARGE, 4)

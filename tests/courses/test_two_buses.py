"""Two buses, a.test and b.test, each one broker with its own engine, linked by a Course.

Real brokers on Hypercorn with TLS, real WebSocket User-Agents and the SDK's agent
signing them in; the Course runs through a :class:`~tests.courses.buses.Relay` so
the test can cut it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from asbp import Command, FaultCode, encode
from asbp.fault_commands import read_fault
from gateway.acl import load_acl
from tests.courses.buses import Relay, bus_config, make_bus, serve_bus, user
from tests.support import RunningServer, TlsFiles
from tests.support.tls import client_ssl_context

pytestmark = pytest.mark.anyio


@dataclass
class TwoBuses:
    a: RunningServer
    b: RunningServer
    to_a: Relay
    to_b: Relay


@contextlib.asynccontextmanager
async def two_buses(tmp_path: Path, tls: TlsFiles) -> AsyncIterator[TwoBuses]:
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_a, Relay() as to_b:
        config_a = bus_config(bus_a, {bus_b: to_b.url()}, tls=tls)
        config_b = bus_config(bus_b, {bus_a: to_a.url()}, tls=tls)
        async with serve_bus(bus_a, config_a, tls) as a, serve_bus(bus_b, config_b, tls) as b:
            to_a.target, to_b.target = a.port, b.port
            try:
                yield TwoBuses(a, b, to_a, to_b)
            finally:
                # No Course may be up while a server drains its connections.
                await to_a.drain()
                await to_b.drain()


async def test_alice_reaches_bob_across_and_bob_replies_by_p(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files) as buses,
        user(buses.a.ws_url, "alice", tls_files) as alice,
        user(buses.b.ws_url, "bob", tls_files) as bob,
    ):
        assert (alice.address, bob.address) == ("alice*a.test", "bob*b.test")
        # p is the broker's stamp: what alice writes there is replaced.
        await alice.send(Command({"c": "chat", "r": "bob*b.test", "p": "mallory*a.test"}, b"hi"))
        got = await bob.recv()
        assert (got.name, got.publisher, got.recipients, got.body) == (
            "chat",
            "alice*a.test",
            ("bob*b.test",),
            b"hi",
        )
        assert got.subject_id == bob.subject
        assert "course.id" not in got and "course.via" not in got
        # The reply goes back by p.
        await bob.send(Command({"c": "chat.reply", "r": got.publisher, "u": 7}, b"hello"))
        back = await alice.recv()
        assert (back.name, back.publisher, back.command_id, back.body) == (
            "chat.reply",
            "bob*b.test",
            7,
            b"hello",
        )


async def test_each_recipient_that_cannot_be_reached_gets_its_own_fault(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files) as buses,
        user(buses.a.ws_url, "alice", tls_files) as alice,
        user(buses.b.ws_url, "bob", tls_files) as bob,
    ):
        recipients = ["nobody*a.test", "bob*b.test", "carol*b.test", "dave*z.test"]
        await alice.send(Command({"c": "chat", "r": recipients, "u": 3}, b"hi all"))
        got = await bob.recv()
        assert (got.body, got.recipients) == (b"hi all", ("bob*b.test", "carol*b.test"))
        faults = [await alice.recv() for _ in range(3)]
        found = sorted((read_fault(f).code, f.command_id) for f in faults)
        assert found == [(2201, 3), (2201, 3), (2202, 3)]
        texts = " ".join(f.body.decode() for f in faults)
        assert "nobody*a.test" in texts and "carol*b.test" in texts and "z.test" in texts
        # The fault for carol came back across the Course, addressed to alice's p.
        across = next(f for f in faults if "carol" in f.body.decode())
        assert across.publisher is None and across.recipients == ("alice*a.test",)


async def test_r_needs_a_subject_with_an_address(tmp_path: Path, tls_files: TlsFiles) -> None:
    async with (
        two_buses(tmp_path, tls_files) as buses,
        user(buses.a.ws_url, "alice", tls_files) as alice,
    ):
        await alice.ws.send(encode(Command({"c": "chat", "r": "bob*b.test", "u": 4}, b"x")))
        fault = await alice.recv()
        assert (read_fault(fault).code, fault.command_id) == (FaultCode.NO_ADDRESS, 4)


async def test_a_command_a_peer_may_not_receive_is_refused_with_2211(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files) as buses,
        user(buses.a.ws_url, "alice", tls_files) as alice,
    ):
        await alice.send(Command({"c": "transfer", "r": "bob*b.test", "u": 5}, b"$"))
        fault = await alice.recv()
        assert (read_fault(fault).code, fault.command_id) == (FaultCode.COURSE_NOT_PERMITTED, 5)


async def test_commands_wait_while_the_peer_is_down_and_arrive_once_in_order(
    tmp_path: Path,
) -> None:
    """Bus B stopped (its broker gone, bob with it) while alice sends; then restarted.

    Over ``ws://`` behind the dev flag: with TLS, Hypercorn's shutdown of the
    restarted B fails with APPLICATION_DATA_AFTER_CLOSE_NOTIFY on the relayed
    Course connection (reported; the other tests here run on TLS).
    """
    tls = None
    count = 200
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_a, Relay() as to_b:
        config_a = bus_config(bus_a, {bus_b: to_b.url("ws")}, tls=tls)
        config_b = bus_config(bus_b, {bus_a: to_a.url("ws")}, tls=tls)
        async with (
            serve_bus(bus_a, config_a, tls) as a,
            user(a.ws_url, "alice", tls) as alice,
        ):
            to_a.target = a.port
            async with (
                serve_bus(bus_b, config_b, tls) as b,
                user(b.ws_url, "bob", tls) as bob,
            ):
                to_b.target = b.port
                header = {"c": "chat", "r": "bob*b.test", "notice": "delivered", "u": 999}
                await alice.send(Command(header, b"before"))
                assert (await bob.recv()).body == b"before"
                # Acknowledged to A before B stops: B's memory engine forgets what it
                # accepted when it stops (tests/courses/test_crash.py: redis does not).
                notice = await alice.recv()
                assert (notice.get("event"), notice.command_id) == ("delivered", 999)
                await to_b.drain()  # no Course while B's server drains
            # B is stopped: everything alice sends now waits in A's queue for b.test.
            for n in range(count):
                header = {"c": "chat", "r": "bob*b.test", "notice": "delivered", "u": n}
                await alice.send(Command(header, str(n).encode()))
            async with (
                serve_bus(bus_b, config_b, tls) as b,
                user(b.ws_url, "bob", tls) as bob,
            ):
                to_b.target = b.port  # B is back (on a new port): the Course comes back
                bodies = [(await bob.recv()).body for _ in range(count)]
                assert bodies == [str(n).encode() for n in range(count)]
                await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"after"))
                assert (await bob.recv()).body == b"after"
                notices = [await alice.recv() for _ in range(count)]
                await to_b.drain()
    print(f"{count} Commands sent while b.test was down, {len(bodies)} delivered")
    assert bodies == [str(n).encode() for n in range(count)]
    assert sorted(n.command_id or 0 for n in notices) == list(range(count))
    assert {(n.name, n.get("event")) for n in notices} == {("asbp.notice", "delivered")}


async def test_a_three_bus_loop_is_refused_not_amplified(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """a.test → b.test → c.test → a.test, each routing z.test onwards: refused with 2208."""
    a, b, c = (make_bus(tmp_path, d) for d in ("a.test", "b.test", "c.test"))
    async with Relay() as to_a, Relay() as to_b, Relay() as to_c:
        config_a = bus_config(a, {b: to_b.url(), c: []}, tls=tls_files, routes={b: ["z.test"]})
        config_b = bus_config(b, {c: to_c.url(), a: []}, tls=tls_files, routes={c: ["z.test"]})
        config_c = bus_config(c, {a: to_a.url(), b: []}, tls=tls_files, routes={a: ["z.test"]})
        async with (
            serve_bus(a, config_a, tls_files) as server_a,
            serve_bus(b, config_b, tls_files) as server_b,
            serve_bus(c, config_c, tls_files) as server_c,
            user(server_a.ws_url, "alice", tls_files) as alice,
        ):
            to_a.target, to_b.target, to_c.target = server_a.port, server_b.port, server_c.port
            await alice.send(Command({"c": "chat", "r": "zed*z.test", "u": 9}, b"round"))
            fault = await alice.recv()
            assert (read_fault(fault).code, fault.command_id) == (FaultCode.COURSE_LOOP, 9)
            assert "a.test, b.test, c.test" in fault.body.decode()
            # Nothing else circles: the next Command is the next thing alice gets.
            await alice.send(Command({"c": "chat", "r": "nobody*a.test", "u": 10}, b"."))
            assert (await alice.recv()).command_id == 10
            for relay in (to_a, to_b, to_c):
                await relay.drain()


COURSE_POLICY = """
[security.policies.default]
default_action = "PERMIT"

[[security.policies.default.entries]]
action = "DENY"
types = ["COURSE"]
destination = 'b\\.test'
privileges = ["WRITE"]
condition = { role = "user" }
"""


async def test_the_acl_course_rows_decide_who_may_send_to_a_domain(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with Relay() as to_b:
        config_a = bus_config(
            bus_a, {bus_b: to_b.url()}, tls=tls_files, acl=load_acl(COURSE_POLICY)
        )
        async with (
            serve_bus(bus_a, config_a, tls_files) as a,
            user(a.ws_url, "alice", tls_files) as alice,
        ):
            # alice has the role "user": nothing goes to b.test, not even to bob*a.test.
            await alice.send(Command({"c": "chat", "r": ["bob*b.test", "alice*a.test"], "u": 6}))
            fault = await alice.recv()
            assert (read_fault(fault).code, fault.command_id) == (FaultCode.ACCESS_DENIED, 6)
            await alice.send(Command({"c": "chat", "r": "alice*a.test", "u": 7}, b"me"))
            assert (await alice.recv()).body == b"me"


async def test_the_metrics_count_each_course(tmp_path: Path, tls_files: TlsFiles) -> None:
    async with (
        two_buses(tmp_path, tls_files) as buses,
        user(buses.a.ws_url, "alice", tls_files) as alice,
        user(buses.b.ws_url, "bob", tls_files) as bob,
    ):
        header = {"c": "chat", "r": "bob*b.test", "notice": "delivered", "u": 1}
        await alice.send(Command(header, b"counted"))
        assert (await bob.recv()).body == b"counted"
        assert (await alice.recv()).get("event") == "delivered"  # acknowledged by now
        async with httpx.AsyncClient(verify=client_ssl_context(tls_files)) as http:
            a = (await http.get(f"{buses.a.http_url}/metrics")).text
            b = (await http.get(f"{buses.b.http_url}/metrics")).text
        assert 'asbp_course_up{peer="b.test"} 1.0' in a
        assert 'asbp_course_queued{peer="b.test"} 0.0' in a
        assert 'asbp_course_crossings_total{event="sent",peer="b.test"} 1.0' in a
        assert 'asbp_course_crossings_total{event="acknowledged",peer="b.test"} 1.0' in a
        assert 'asbp_course_received_total{outcome="accepted"} 1.0' in b
        assert 'asbp_course_received_total{outcome="duplicate"} 0.0' in b

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

import pytest

from asbp import Command
from tests.courses.buses import Relay, bus_config, make_bus, serve_bus, user
from tests.support import RunningServer, TlsFiles

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
                to_a.cut()
                to_b.cut()


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

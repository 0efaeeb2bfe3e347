"""Conversation-Addresses on a bus of several brokers (docs/courses.md, "On a bus").

Bus a.test is two brokers (a1, a2) on one private redis-server; bus b.test is one
broker on its own engine, its Course dialling a1 only. A Subject is reachable by its
address on whichever broker of its bus its Channel is: from a Subject on the other
broker, and from bus b.test through the Course that lands on the other broker.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents import ApplicationAgent, FaultError, Request
from asbp import Command, FaultCode
from asbp.fault_commands import read_fault
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from tests.courses.buses import LOGIN, Bus, Relay, bus_config, make_bus, serve_bus, user
from tests.support import RedisServer, RunningServer, T, TlsFiles, serve_app_async
from tests.support.agents import FAST
from tests.support.tls import client_ssl_context

pytestmark = pytest.mark.anyio


@dataclass
class Buses:
    a1: RunningServer
    a2: RunningServer
    b: RunningServer
    bus_a: Bus


@contextlib.asynccontextmanager
async def buses(
    tmp_path: Path,
    tls: TlsFiles,
    *,
    signin_on_a: bool = True,
    courses_a: dict[str, Any] | None = None,
) -> AsyncIterator[Buses]:
    """The two buses; ``signin_on_a=False``: bus A's brokers without a sign-in agent
    (the test brings its own); ``courses_a``: more of bus A's ``[courses]`` table."""
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with RedisServer(tmp_path / "redis-a") as redis_a:
        async with Relay() as to_a, Relay() as to_b:
            base_a = bus_config(bus_a, {bus_b: to_b.url()}, tls=tls, courses=courses_a)

            def broker_of_a(broker_id: str) -> GatewayConfig:
                return dataclasses.replace(
                    base_a,
                    broker_id=broker_id,
                    engine="redis",
                    redis_url=redis_a.url,
                    bus_lease=2.0,
                    data_dir=tmp_path / broker_id,
                )

            (tmp_path / "a1").mkdir()
            (tmp_path / "a2").mkdir()
            config_b = bus_config(bus_b, {bus_a: to_a.url()}, tls=tls)

            def serve_a(broker_id: str) -> contextlib.AbstractAsyncContextManager[RunningServer]:
                config = broker_of_a(broker_id)
                if signin_on_a:
                    return serve_bus(bus_a, config, tls)
                return serve_app_async(create_app(config), tls=tls)

            async with (
                serve_a("a1") as a1,
                serve_a("a2") as a2,
                serve_bus(bus_b, config_b, tls) as b,
            ):
                to_a.target, to_b.target = a1.port, b.port
                try:
                    yield Buses(a1, a2, b, bus_a)
                finally:
                    await to_a.drain()
                    await to_b.drain()


async def test_an_address_is_reached_on_whichever_broker_of_the_bus_holds_it(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        buses(tmp_path, tls_files) as bus,
        user(bus.a1.ws_url, "alice", tls_files) as alice,
        user(bus.a2.ws_url, "bob", tls_files) as bob,
        user(bus.b.ws_url, "carol", tls_files) as carol,
    ):
        # No wait for the directory: bob's sign-in was answered once it was written.
        count = 50
        for n in range(count):
            await alice.send(Command({"c": "chat", "r": "bob*a.test", "p": "x*a.test"}, b"%d" % n))
        got = [await bob.recv() for _ in range(count)]
        assert [c.body for c in got] == [b"%d" % n for n in range(count)]  # in order
        assert {(c.publisher, c.subject_id) for c in got} == {("alice*a.test", bob.subject)}
        print(f"{count} Commands from a1 to bob on a2, in order")
        # The reply by p, from a2 back to a1.
        await bob.send(Command({"c": "chat.reply", "r": "alice*a.test", "u": 2}, b"yes"))
        back = await alice.recv()
        assert (back.publisher, back.command_id, back.body) == ("bob*a.test", 2, b"yes")
        # From bus b.test: the Course lands on a1, bob is on a2.
        await carol.send(Command({"c": "chat", "r": ["bob*a.test", "alice*a.test"]}, b"both"))
        for someone in (bob, alice):
            across = await someone.recv()
            assert (across.publisher, across.body) == ("carol*b.test", b"both")
            assert across.subject_id == someone.subject
        await bob.send(Command({"c": "chat.reply", "r": "carol*b.test"}, b"back"))
        assert (await carol.recv()).publisher == "bob*a.test"
        # Nobody anywhere on the bus: 2201, after the bus was asked.
        await alice.send(Command({"c": "chat", "r": ["nobody*a.test", "bob*a.test"], "u": 5}))
        fault = await alice.recv()
        assert (read_fault(fault).code, fault.command_id) == (2201, 5)
        assert "nobody*a.test" in fault.body.decode()
        assert (await bob.recv()).publisher == "alice*a.test"


async def test_commands_waiting_for_the_address_index_are_bounded(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """Each Command for an address of the bus waits at its broker for the routing
    plane's answer (a Redis round trip): past ``lookup_max_commands`` of them, fault
    2106 for the next, and the broker goes on serving; nothing is lost silently."""
    async with (
        buses(tmp_path, tls_files, courses_a={"lookup_max_commands": 1}) as bus,
        user(bus.a1.ws_url, "alice", tls_files) as alice,
        user(bus.a2.ws_url, "bob", tls_files) as bob,
    ):
        count = 200
        for n in range(count):
            await alice.send(Command({"c": "chat", "r": "bob*a.test", "u": n}, b"%d" % n))
        # Several arrive in one read, before the first lookup can be answered: every
        # Command is either delivered, in order, or refused with 2106. The last one's
        # fault (2201 once looked up, or 2106) comes after every fault before it.
        await alice.send(Command({"c": "chat", "r": "nobody*a.test", "u": count}))
        refused: list[int] = []
        while True:
            fault = await alice.recv()
            code = read_fault(fault).code
            if fault.command_id == count:
                assert code in (2201, 2106), fault
                break
            assert code == 2106, fault
            assert "wait here for the bus" in fault.body.decode()
            refused.append(fault.command_id or 0)
        delivered = [int((await bob.recv()).body) for _ in range(count - len(refused))]
        assert sorted(delivered + refused) == list(range(count))
        assert delivered == sorted(delivered)
        assert refused, "no Command was ever refused: the bound was not reached"
        print(f"{count} sent: {len(delivered)} delivered in order, {len(refused)} refused")
        # Once the lookups are answered, the next one goes through.
        await alice.send(Command({"c": "chat", "r": "bob*a.test"}, b"after"))
        assert (await bob.recv()).body == b"after"


async def test_an_address_held_on_two_brokers_reaches_each_subject_once(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        buses(tmp_path, tls_files) as bus,
        user(bus.a1.ws_url, "alice", tls_files) as alice,
        user(bus.a1.ws_url, "dave", tls_files) as dave_here,
        user(bus.a2.ws_url, "dave", tls_files) as dave_there,
        user(bus.b.ws_url, "carol", tls_files) as carol,
    ):
        await alice.send(Command({"c": "chat", "r": ["dave*a.test", "dave*a.test"]}, b"one"))
        await carol.send(Command({"c": "chat", "r": "dave*a.test"}, b"two"))
        for dave in (dave_here, dave_there):
            bodies = sorted([(await dave.recv()).body, (await dave.recv()).body])
            assert bodies == [b"one", b"two"]
        # dave leaves a2: the bus forgets him there, and a1's dave still gets it.
        await dave_there.ws.close()
        await alice.send(Command({"c": "chat", "r": "dave*a.test", "u": 8}, b"three"))
        assert (await dave_here.recv()).body == b"three"
        await alice.send(Command({"c": "chat", "r": "nobody*a.test", "u": 9}))
        fault = await alice.recv()
        assert fault.command_id == 9  # not a fault for dave (8)


async def test_an_agent_speaks_for_a_subject_it_signed_in_on_another_broker(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """The agent's one Tube is to a1; alice signs in on a2 (the bus asks the agent at
    a1); the agent's Command for her, sent on a1 with ``b=a2``, is checked at a2."""
    async with buses(tmp_path, tls_files, signin_on_a=False) as bus:
        subjects: dict[str, tuple[str, str]] = {}
        agent = ApplicationAgent(
            "signin",
            bus.bus_a.signin,
            [bus.a1.ws_url + "/tube"],
            backoff=FAST,
            timeout=5 * T,
            ssl=client_ssl_context(tls_files),
        )

        @agent.respondent(LOGIN)
        async def login(request: Request) -> None:
            name = request.body.decode()
            broker = request.command.get("b")
            assert request.subject_id is not None and isinstance(broker, str)
            subjects[name] = (request.subject_id, broker)
            await request.authenticate("user", address=f"{name}*a.test")

        async with agent:
            await agent.wait_registered(10 * T)
            async with (
                user(bus.a2.ws_url, "alice", tls_files) as alice,
                user(bus.b.ws_url, "carol", tls_files) as carol,
            ):
                subject_id, broker = subjects["alice"]
                assert (subject_id, broker) == (alice.subject, "a2")
                hello = Command({"c": "chat", "r": "carol*b.test", "u": 1}, b"for alice")
                await agent.send_for(subject_id, hello, broker=broker)
                got = await carol.recv()
                assert (got.publisher, got.body) == ("alice*a.test", b"for alice")
                # carol's reply reaches alice on a2 by p.
                await carol.send(Command({"c": "chat.reply", "r": "alice*a.test"}, b"hi"))
                assert (await alice.recv()).publisher == "carol*b.test"
                # A Subject a2 does not have: 3201 from a2, back to the Tube at a1.
                with pytest.raises(FaultError) as refused:
                    await agent.send_for(
                        "f" * 32,
                        Command({"c": "chat", "r": "carol*b.test", "u": 2}),
                        broker="a2",
                        confirm=5 * T,
                    )
                assert refused.value.code == FaultCode.ACCESS_DENIED
                # A broker that is not on the bus: 3201 at once.
                with pytest.raises(FaultError) as gone:
                    await agent.send_for(
                        subject_id,
                        Command({"c": "chat", "r": "carol*b.test", "u": 3}),
                        broker="a9",
                        confirm=5 * T,
                    )
                assert gone.value.code == FaultCode.ACCESS_DENIED

"""The receiving broker SIGKILLed after it accepted a Command but before its
acknowledgement reached the sender: the Command is neither lost nor delivered twice.

Bus A is a broker in this process (memory engine); bus B a ``python -m gateway``
process on its own private redis-server, so it can be killed like a crash and its
record of accepted ``course.id`` values outlives it. The Course from A to B runs
through a :class:`~tests.courses.buses.Relay` that holds B's acknowledgements back
on cue, which is "killed between receiving and acknowledging" without any timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from asbp import Command
from tests.courses.buses import Bus, Relay, bus_config, make_bus, serve_bus, signin_agent, user
from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer

pytestmark = pytest.mark.anyio


def course_toml(bus: Bus, peer: Bus, url: str) -> str:
    """Bus B's configuration lines: Subjects, its signin agent and a Course to ``peer``."""
    key = bus.directory / f"{peer.domain}.pub.pem"
    key.write_bytes(peer.public_key.read_bytes())
    return (
        'insecure_dev_tubes = true\nauthenticate_command = "login"\n'
        f'[agents.signin]\npublic_key = "{bus.directory / "signin.pem"}"\nserves = ["login"]\n'
        f'[courses]\ndomain = "{bus.domain}"\nsigning_key = "{bus.directory / "bus.pem"}"\n'
        "backoff_min = 0.02\nbackoff_max = 0.2\n"
        f'[courses."{peer.domain}"]\nurls = ["{url}"]\npublic_key = "{key}"\n'
        'names = ["chat.*"]\n'
    )


@contextlib.asynccontextmanager
async def bus_b_process(
    bus: Bus, peer: Bus, url: str, redis_url: str, run: int
) -> AsyncIterator[BrokerProcess]:
    async with broker_process(
        redis_url,
        bus.directory / f"run-{run}",
        ack_timeout=30,
        prefetch=16,
        settings=course_toml(bus, peer, url),
    ) as process:
        yield process


def port_of(process: BrokerProcess) -> int:
    return int(process.url.rsplit(":", 1)[1].split("/", 1)[0])


async def test_a_receiver_killed_before_acknowledging_loses_nothing_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with RedisServer(tmp_path / "redis-b") as redis_b:
        async with Relay() as to_a, Relay() as to_b:
            config_a = bus_config(a, {b: to_b.url("ws")}, tls=None)
            async with (
                serve_bus(a, config_a, None) as server_a,
                user(server_a.ws_url, "alice", None) as alice,
            ):
                to_a.target = server_a.port
                first = bus_b_process(b, a, to_a.url("ws"), redis_b.url, 1)
                process = await first.__aenter__()
                try:
                    http_b = process.url.replace("ws://", "http://").removesuffix("/asbp")
                    ws_b = http_b.replace("http://", "ws://")
                    async with (
                        signin_agent(b, ws_b + "/tube", None) as agent,
                    ):
                        await agent.wait_registered(10)
                        async with user(ws_b, "bob", None) as bob:
                            to_b.target = port_of(process)
                            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"one"))
                            assert (await bob.recv()).body == b"one"
                            # From now on B's acknowledgements never reach A.
                            to_b.hold_back = True
                            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"two"))
                            assert (await bob.recv()).body == b"two"
                            await process.kill()
                            bob.ws.transport.abort()
                finally:
                    await first.__aexit__(None, None, None)
                to_b.cut()
                # B again, on the same Redis; bob signs in before A can reach it.
                async with bus_b_process(b, a, to_a.url("ws"), redis_b.url, 2) as process:
                    ws_b = process.url.removesuffix("/asbp")
                    async with signin_agent(b, ws_b + "/tube", None) as agent:
                        await agent.wait_registered(10)
                        async with user(ws_b, "bob", None) as bob:
                            to_b.target = port_of(process)
                            # A sends "two" again (never acknowledged): B drops it.
                            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"three"))
                            assert (await bob.recv()).body == b"three"
                            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"four"))
                            assert (await bob.recv()).body == b"four"
                            print("bob got one, two (then B was killed), three, four: no repeat")
                            await to_a.drain()
                            await to_b.drain()

"""Agents follow the brokers: an ApplicationAgent given a name keeps one Tube per
address the name resolves to, as real broker processes join and leave.

The brokers are ``python -m gateway`` processes on one port at 127.0.0.2 and
127.0.0.3 (all of 127/8 is loopback), like the pods behind the headless
``asbp-broker-peers`` Service; the name resolves through a hosts file
(:class:`agents.HostsFileResolver`) that the test rewrites as brokers come and go,
as DNS answers change when pods do.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import anyio
import pytest

from agents import ApplicationAgent, BrokerDiscovery, HostsFileResolver, Request, TubeStatus
from agents.discovery import resolve_dns
from asbp import decode
from tests.gateway.engines._broker_process import broker_process, open_channel, receive
from tests.support import RedisServer, T, free_port
from tests.support.agents import FAST, make_credentials

pytestmark = pytest.mark.anyio

NAME = "asbp-broker-peers"


class OnMessage(logging.Handler):
    """Sets ``event`` when a record's message contains ``text`` (in the agent's loop)."""

    def __init__(self, text: str, event: asyncio.Event) -> None:
        super().__init__()
        self.text = text
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def connected(tubes: tuple[TubeStatus, ...]) -> set[str]:
    return {tube.url for tube in tubes if tube.connected and "echo" in tube.registered}


async def test_an_agent_opens_tubes_to_brokers_that_join_and_lets_go_of_those_that_leave(
    tmp_path: Path,
) -> None:
    credentials = make_credentials(tmp_path, "follower")
    settings = (
        "bus_lease = 3\ninsecure_dev_tubes = true\n"
        f"[agents.follower]\npublic_key = {str(tmp_path / 'follower.pem')!r}\n"
    )
    port = free_port("127.0.0.2")
    first, second = f"ws://127.0.0.2:{port}/tube", f"ws://127.0.0.3:{port}/tube"
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.2 {NAME}\n")
    discovery = BrokerDiscovery(
        f"ws://{NAME}:{port}/tube", interval=0.05, resolver=HostsFileResolver(hosts)
    )
    unresolved = asyncio.Event()
    logger = logging.getLogger("test.discovery")
    logger.addHandler(OnMessage("cannot resolve", unresolved))
    agent = ApplicationAgent(
        "follower", credentials, discovery=discovery, backoff=FAST, timeout=5 * T, logger=logger
    )

    @agent.respondent("echo")
    async def echo(request: Request) -> bytes:
        return request.body

    with RedisServer(tmp_path / "redis") as redis:
        async with broker_process(
            redis.url, tmp_path / "one", ack_timeout=30, prefetch=8, settings=settings,
            host="127.0.0.2", port=port,
        ) as one, agent:  # fmt: skip
            await agent.wait_tubes(lambda tubes: connected(tubes) == {first}, 20 * T)
            async with broker_process(
                redis.url, tmp_path / "two", ack_timeout=30, prefetch=8, settings=settings,
                host="127.0.0.3", port=port,
            ) as two:  # fmt: skip
                # Scale-out: the name now answers both; the agent follows, no restart.
                hosts.write_text(f"127.0.0.2 {NAME}\n127.0.0.3 {NAME}\n")
                await agent.wait_tubes(lambda tubes: connected(tubes) == {first, second}, 20 * T)
                user = await open_channel(two.url)
                await user.send(b"c=echo,u=1;hi")
                with anyio.fail_after(10 * T):
                    reply = decode(await receive(user))
                assert reply.body == b"hi", reply
                await user.close()
                # Scale-in: the first broker leaves the name, then stops.
                hosts.write_text(f"127.0.0.3 {NAME}\n")
                await agent.wait_tubes(
                    lambda tubes: {tube.url for tube in tubes} == {second}, 20 * T
                )
                assert connected(agent.tubes) == {second}
                assert one.process.returncode is None  # let go of before it stopped
                # A name that stops resolving for a moment keeps the Tubes there are.
                hosts.write_text("")
                with anyio.fail_after(10 * T):
                    await unresolved.wait()
                assert connected(agent.tubes) == {second}


async def test_discovery_turns_each_address_into_a_url(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"# peers\n10.0.0.2 {NAME} other\n::1 {NAME}\n10.0.0.2 {NAME}\n10.0.0.9 x\n")
    discovery = BrokerDiscovery(
        f"wss://{NAME}:8443/tube?x=1", interval=1, resolver=HostsFileResolver(hosts)
    )
    assert discovery.host == NAME
    assert await discovery.resolve() == [
        "wss://10.0.0.2:8443/tube?x=1",
        "wss://[::1]:8443/tube?x=1",
    ]
    no_port = BrokerDiscovery("ws://other/tube", resolver=HostsFileResolver(hosts))
    assert await no_port.resolve() == ["ws://10.0.0.2/tube"]
    with pytest.raises(OSError, match="not in"):
        await BrokerDiscovery("ws://missing/tube", resolver=HostsFileResolver(hosts)).resolve()
    assert "127.0.0.1" in await resolve_dns("localhost")


@pytest.mark.parametrize(
    ("url", "interval", "message"),
    [
        ("ws:///tube", 1.0, "no host"),
        ("ws://127.0.0.1:80/tube", 1.0, "an address"),
        ("ws://peers/tube", 0.0, "positive"),
    ],
)
def test_discovery_refuses_what_it_cannot_follow(url: str, interval: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerDiscovery(url, interval=interval)


def test_an_agent_needs_urls_or_discovery(tmp_path: Path) -> None:
    credentials = make_credentials(tmp_path, "follower")
    with pytest.raises(ValueError, match="urls"):
        ApplicationAgent("follower", credentials)

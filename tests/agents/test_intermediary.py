"""Intermediary-Agents: ``u`` kept end to end and faults carried back, through real servers.

Most chains here are User-Agent → Broker-Agent (its Respondent forwards) →
Broker-Agent (the Respondents): two real WebSocket servers in this process,
cheap enough for one chain per case. ``test_four_tiers_through_two_brokers``
runs the full §3.4 chain through two real brokers instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agents import (
    BrokerAgent,
    Downstream,
    FaultError,
    IntermediaryAgent,
    Request,
    UserAgent,
    forward_to,
)
from asbp import Command
from tests.support import T
from tests.support.agents import FAST, install_echo, make_agent, make_credentials, running_broker

pytestmark = pytest.mark.anyio

NAMES = ["echo", "clock", "boom", "hold", "missing", "keys"]


class Inner:
    """The far end: a Broker-Agent with the Respondents, and what they saw."""

    def __init__(self, **options: object) -> None:
        self.broker = BrokerAgent("inner", **options)  # type: ignore[arg-type]  # test options
        self.seen: list[Command] = []
        self.entered = asyncio.Event()
        self.released = asyncio.Event()
        self.keyed = asyncio.Event()
        self.held: asyncio.Queue[Command] = asyncio.Queue()
        broker = self.broker

        @broker.respondent("echo")
        async def echo(request: Request) -> bytes:
            self.seen.append(request.command)
            # Answer out of order: a later request may finish first.
            for _ in range(random.randrange(4)):
                await asyncio.sleep(0)  # reorders the answers; not synchronisation
            return request.body

        @broker.respondent("clock")
        async def clock(request: Request) -> None:
            await request.stream(["1", "2", "3"])

        @broker.respondent("boom")
        async def boom(request: Request) -> bytes:
            raise RuntimeError("inner secret")

        @broker.respondent("hold")
        async def hold(request: Request) -> bytes:
            self.entered.set()
            self.held.put_nowait(request.command)
            await self.released.wait()
            return b"released"

        @broker.respondent("keys")
        async def keys(request: Request) -> bytes:
            self.seen.append(request.command)
            self.keyed.set()
            return b"ok"


@contextlib.asynccontextmanager
async def chain(
    inner: Inner, **downstream_options: object
) -> AsyncIterator[tuple[UserAgent, Downstream, BrokerAgent, IntermediaryAgent]]:
    """User-Agent → outer Broker-Agent forwarding NAMES → ``inner``."""
    async with inner.broker.serving():
        downstream = Downstream(
            inner.broker.url(),
            backoff=FAST,
            **downstream_options,  # type: ignore[arg-type]  # test options
        )
        outer = BrokerAgent("outer")
        intermediary = IntermediaryAgent(upstream=outer, downstream=downstream, names=NAMES)
        await intermediary.start(timeout=5 * T)
        try:
            async with UserAgent.websocket(outer.url()) as ua:
                yield ua, downstream, outer, intermediary
        finally:
            await intermediary.close()


async def test_u_is_kept_end_to_end_with_many_in_flight() -> None:
    inner = Inner()
    async with chain(inner) as (ua, downstream, _, _):
        bodies = [f"request {n}".encode() for n in range(50)]
        replies = await asyncio.gather(*(ua.request("echo", b, timeout=5 * T) for b in bodies))
        # ua.request matched each answer by the u it sent: a mix-up shows as a wrong body.
        assert [r.body for r in replies] == bodies
        assert {r.name for r in replies} == {"echo.reply"}
        # The far Respondent saw the Intermediary's Channel and its own numbering.
        assert {c.channel_id for c in inner.seen} == {downstream.user_agent.channel_id}  # type: ignore[union-attr]
        assert downstream.in_flight == 0


async def test_streams_cross_with_t_and_o() -> None:
    async with chain(Inner()) as (ua, _, _, _):
        parts = [p async for p in ua.stream("clock", timeout=5 * T)]
        assert [p.body for p in parts] == [b"1", b"2", b"3"]
        assert parts[0].total == 3 and [p.of_total for p in parts] == [1, 2, 3]


@pytest.mark.parametrize(
    ("name", "code", "text"),
    [("missing", 2101, "no Command-Respondent serves 'missing'"), ("boom", 2107, "failed")],
)
async def test_downstream_faults_come_back_with_the_senders_u(
    name: str, code: int, text: str
) -> None:
    async with chain(Inner()) as (ua, _, _, _):
        with pytest.raises(FaultError) as fault:
            await ua.request(name, timeout=5 * T)
        assert fault.value.code == code and text in fault.value.message
        assert fault.value.cause == name
        assert "secret" not in fault.value.message


async def test_a_timeout_downstream_is_2103() -> None:
    inner = Inner()
    async with chain(inner, timeout=0.3 * T) as (ua, downstream, _, _):
        with pytest.raises(FaultError) as fault:
            await ua.request("hold", timeout=5 * T)
        assert fault.value.code == 2103 and "from the next bus" in fault.value.message
        inner.released.set()
        assert (await ua.request("echo", b"after", timeout=5 * T)).body == b"after"
        assert downstream.in_flight == 0


async def test_the_intermediarys_in_flight_limit_is_2106() -> None:
    inner = Inner()
    async with chain(inner, max_in_flight=1) as (ua, _, _, _):
        held = asyncio.create_task(ua.request("hold", timeout=5 * T))
        async with asyncio.timeout(5 * T):
            await inner.entered.wait()
        with pytest.raises(FaultError) as fault:
            await ua.request("echo", timeout=5 * T)
        assert fault.value.code == 2106
        inner.released.set()
        assert (await held).body == b"released"


async def test_the_channel_closing_in_flight_is_2102_then_it_reconnects() -> None:
    inner = Inner()
    async with chain(inner) as (ua, downstream, _, intermediary):
        port = inner.broker.port
        held = asyncio.create_task(ua.request("hold", timeout=5 * T))
        async with asyncio.timeout(5 * T):
            await inner.entered.wait()
        await inner.broker.close(timeout=0)  # the far broker goes away mid-request
        with pytest.raises(FaultError) as fault:
            await held
        # The inner Broker-Agent faults its own Channel first (2102, shutting down);
        # either way the sender hears 2102 with its u.
        assert fault.value.code == 2102
        # While the next bus is unreachable, the names are withdrawn upstream.
        await intermediary.wait_serving(False, 5 * T)
        assert "echo" not in intermediary.upstream.respondent_names  # type: ignore[attr-defined]
        with pytest.raises(FaultError) as down:
            await ua.request("echo", timeout=5 * T)
        assert (down.value.code, down.value.message) == (
            2101,
            "no Command-Respondent serves 'echo'",
        )
        # Back on the same port: the Intermediary dials again and serves again.
        again = Inner()
        async with again.broker.serving(port=port):
            await intermediary.wait_serving(True, 10 * T)
            assert downstream.channels_opened == 2
            assert (await ua.request("echo", b"back", timeout=5 * T)).body == b"back"


async def test_which_keys_cross() -> None:
    inner = Inner()
    async with chain(inner) as (ua, _, _, _):
        await ua.request("keys", b"x", timeout=5 * T, m="text/plain", custom="kept", r="bob*b.test")
        (seen,) = inner.seen
        assert seen.get("m") == "text/plain" and seen.get("custom") == "kept"
        assert "r" not in seen and "p" not in seen
        assert seen.broker_id == "inner"  # b is the inner broker's, not the outer's


async def test_commands_without_u_go_down_and_pushes_come_to_on_push() -> None:
    inner = Inner()
    pushed: asyncio.Queue[Command] = asyncio.Queue()
    async with chain(inner, on_push=pushed.put_nowait) as (ua, downstream, _, _):
        await ua.send(Command(c="keys"))
        channel = downstream.user_agent.channel_id  # type: ignore[union-attr]
        inner.broker.send(Command(c="news", d=channel))
        async with asyncio.timeout(5 * T):
            assert (await pushed.get()).name == "news"
            await inner.keyed.wait()
        assert [(c.name, c.command_id) for c in inner.seen] == [("keys", None)]


async def test_four_tiers_through_two_brokers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """User-Agent → broker A → Intermediary (an ApplicationAgent) → broker B → echo agent."""
    outer_dir, inner_dir = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    gate = make_credentials(outer_dir, "gate")
    echo = make_credentials(inner_dir, "echo")
    async with (
        running_broker(outer_dir, "broker-a", identities=("gate",)) as broker_a,
        running_broker(inner_dir, "broker-b", identities=("echo",)) as broker_b,
    ):
        responder = make_agent(echo, [broker_b.ws_url + "/tube"])
        install_echo(responder)
        async with responder:
            await responder.wait_registered(10 * T)
            upstream = make_agent(gate, [broker_a.ws_url + "/tube"])
            downstream = Downstream(broker_b.ws_url + "/asbp", backoff=FAST)
            intermediary = IntermediaryAgent(
                upstream=upstream, downstream=downstream, names=["echo", "absent"]
            )
            async with intermediary:
                await upstream.wait_registered(10 * T)
                async with UserAgent.websocket(broker_a.ws_url + "/asbp") as ua:
                    bodies = [f"{n}".encode() for n in range(20)]
                    replies = await asyncio.gather(
                        *(ua.request("echo", b, timeout=10 * T) for b in bodies)
                    )
                    assert [r.body for r in replies] == bodies
                    assert {r.agent_id for r in replies} == {"gate"}  # broker A's verified a
                    with pytest.raises(FaultError) as fault:
                        await ua.request("absent", timeout=10 * T)
                    assert fault.value.code == 2101 and fault.value.cause == "absent"


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        Downstream("ws://127.0.0.1:1/asbp", timeout=0)
    downstream = Downstream(lambda: UserAgent.websocket("ws://127.0.0.1:1/asbp", reconnect=None))
    assert "0/1 connected" in repr(downstream)
    with pytest.raises(ValueError, match="channels"):
        Downstream("ws://127.0.0.1:1/asbp", channels=0)
    with pytest.raises(ValueError, match="names"):
        IntermediaryAgent(upstream=BrokerAgent(), downstream=downstream, names=[])


async def test_forward_to_in_a_broker_agent_and_a_downstream_that_cannot_dial() -> None:
    # Nothing listens on the port: the Downstream keeps dialling, and the sender hears 2101.
    outer = BrokerAgent("outer")
    downstream = Downstream("ws://127.0.0.1:9/asbp", backoff=FAST)
    outer.add_respondent("echo", forward_to(downstream))
    async with downstream, outer.serving(), UserAgent.websocket(outer.url()) as ua:
        with pytest.raises(FaultError) as fault:
            await ua.request("echo", timeout=5 * T)
        assert fault.value.code == 2101
        await ua.send(Command(c="echo"))  # no u: dropped, nobody waits
        assert (await ua.request("asbp.ping", timeout=5 * T)).name == "asbp.pong"


async def test_a_downstream_over_http_long_polling(tmp_path: Path) -> None:
    # Downstream takes any UserAgent factory: here the stateless HTTP Channel.
    echo = make_credentials(tmp_path, "echo")
    async with running_broker(tmp_path, "broker-b") as broker_b:
        responder = make_agent(echo, [broker_b.ws_url + "/tube"])
        install_echo(responder)
        async with responder:
            await responder.wait_registered(10 * T)
            downstream = Downstream(
                lambda: UserAgent.http(
                    broker_b.http_url + "/asbp", poll_wait=1 * T, reconnect=None
                ),
                backoff=FAST,
            )
            outer = BrokerAgent("outer")
            async with (
                IntermediaryAgent(upstream=outer, downstream=downstream, names=["echo"]),
                UserAgent.websocket(outer.url()) as ua,
            ):
                reply = await ua.request("echo", b"over http", timeout=10 * T)
                assert reply.body == b"over http"


async def test_a_loop_of_intermediaries_ends_in_2106_not_for_ever() -> None:
    # A name passed on to the very Broker-Agent that serves it: each hop holds one
    # more request in flight, until the Downstream's limit refuses the next.
    broker = BrokerAgent("loop")
    async with broker.serving():
        downstream = Downstream(broker.url(), max_in_flight=5, backoff=FAST)
        broker.add_respondent("loop", forward_to(downstream))
        async with downstream, UserAgent.websocket(broker.url()) as ua:
            await downstream.wait_connected(5 * T)
            with pytest.raises(FaultError) as fault:
                await ua.request("loop", timeout=10 * T)
            assert fault.value.code == 2106


async def test_with_two_intermediaries_a_broken_one_withdraws_and_the_other_serves(
    tmp_path: Path,
) -> None:
    # §3.1: Subjects should see errors only when no agent knows the Command. One
    # Intermediary loses its next bus; the broker then sends everything to the other.
    gate = make_credentials(tmp_path, "gate")
    first, second = Inner(), Inner()
    async with (
        running_broker(tmp_path, "broker-a", identities=("gate",)) as broker_a,
        first.broker.serving(),
        second.broker.serving(),
    ):
        intermediaries = [
            IntermediaryAgent(
                upstream=make_agent(gate, [broker_a.ws_url + "/tube"]),
                downstream=Downstream(inner.broker.url(), backoff=FAST),
                names=["echo"],
            )
            for inner in (first, second)
        ]
        async with intermediaries[0], intermediaries[1]:
            for intermediary in intermediaries:
                await intermediary.upstream.wait_registered(10 * T)  # type: ignore[attr-defined]
            async with UserAgent.websocket(broker_a.ws_url + "/asbp") as ua:
                await first.broker.close(timeout=0)
                await intermediaries[0].wait_serving(False, 10 * T)
                bodies = [f"{n}".encode() for n in range(20)]
                replies = await asyncio.gather(
                    *(ua.request("echo", b, timeout=10 * T) for b in bodies)
                )
                assert [r.body for r in replies] == bodies  # no fault: all went to the second
                assert len(second.seen) == 20


async def test_several_channels_share_the_requests() -> None:
    inner = Inner()
    async with chain(inner, channels=2, max_in_flight=1) as (ua, downstream, _, _):
        await downstream.wait_connected(5 * T, channels=2)
        # One held request per Channel (each takes one); a third is 2106.
        first = asyncio.create_task(ua.request("hold", timeout=5 * T))
        second = asyncio.create_task(ua.request("hold", timeout=5 * T))
        async with asyncio.timeout(5 * T):
            held = [await inner.held.get(), await inner.held.get()]
        assert len({c.channel_id for c in held}) == 2  # one down each Channel
        with pytest.raises(FaultError) as fault:
            await ua.request("echo", timeout=5 * T)
        assert fault.value.code == 2106
        inner.released.set()
        assert [(await first).body, (await second).body] == [b"released", b"released"]
        assert "2/2 connected" in repr(downstream)

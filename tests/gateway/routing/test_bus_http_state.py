"""An HTTP Channel's Subjects and groups are bus-wide, and its requests fault when
the broker serving them dies (docs/protocol.md, "One bus across brokers").

Three ``python -m gateway`` processes on one private redis-server, and again on
the session's private six-node Redis Cluster; the
Application-Agent is a bare WebSocket Tube to broker C only (so the test sees
exactly what reaches it); the User-Agent is httpx, whose POSTs and long-polls
alternate between brokers A and B.

When the home dies, its visitors claim the Channel: of B and C noticing at
once, one takes it over (before ``Plane.claim_channel`` both did, both joined
its groups, and a ``g`` reached it twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from asbp import Command, FaultCode, decode, encode
from asbp.fault_commands import read_fault
from tests.gateway.engines._broker_process import BrokerProcess, abandon, broker_process
from tests.support import RedisServer, T
from tests.support.agents import make_credentials
from tests.support.bus import DIRECTORY, client_for, flush, frame, until_in_directory
from tests.support.gateway import HttpChannel
from tests.support.redis_cluster import RedisCluster

pytestmark = pytest.mark.anyio

LEASE = 1.5


@pytest.fixture(scope="module", params=["redis", "redis-cluster"])
def redis_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A private redis-server for the module, or the session's Redis Cluster (where a
    hand-over to the home is a lookup in the directory's slot, then a send)."""
    if request.param == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url
        return
    with RedisServer(tmp_path_factory.mktemp("bus-http-state-redis")) as server:
        yield server.url


@dataclass
class Bus:
    """Three broker processes on one Redis, and the agent ``echo``'s bare Tube to C."""

    a: BrokerProcess
    b: BrokerProcess
    c: BrokerProcess
    tube: ClientConnection
    redis_url: str

    @staticmethod
    def http(process: BrokerProcess) -> str:
        return process.url.replace("ws://", "http://")


@pytest.fixture
async def bus(tmp_path: Path, redis_url: str) -> AsyncIterator[Bus]:
    async with three_brokers(tmp_path, redis_url) as running:
        yield running


@contextlib.asynccontextmanager
async def three_brokers(
    tmp_path: Path, redis_url: str, top: str = "", tables: str = ""
) -> AsyncIterator[Bus]:
    """Brokers A, B and C, and the agent's Tube to C; ``top`` and ``tables``: more
    settings, before the first table and as tables of their own."""
    await flush(redis_url)
    credentials = make_credentials(tmp_path)
    settings = (
        f"{top}bus_lease = {LEASE}\ninsecure_dev_tubes = true\n"
        'authenticate_command = "auth.login"\n'
        f"[agents.echo]\npublic_key = {str(tmp_path / 'echo.pem')!r}\n"
        f"serves = ['.*', 'auth.login']\n{tables}"
    )

    def start(name: str) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
        return broker_process(
            redis_url,
            tmp_path / name,
            ack_timeout=30,
            prefetch=8,
            settings=f'broker_id = "broker-{name}"\n' + settings,
        )

    async with start("a") as a, start("b") as b, start("c") as c:
        tube = await connect(
            c.url.replace("/asbp", "/tube"),
            additional_headers={"Authorization": f"Bearer {credentials.token()}"},
        )
        try:
            assert (await frame(tube)).name == "asbp.tube"
            names = ["auth.login", "whoami", "slow"]
            await tube.send(encode(Command({"c": "asbp.register", "names": names, "u": 1})))
            accepted = await frame(tube)
            assert (accepted.name, accepted.command_id) == ("asbp.accepted", 1), accepted
            yield Bus(a, b, c, tube, redis_url)
        finally:
            await tube.close()


async def next_command(channel: HttpChannel) -> Command:
    """The next Command in the Channel's mailbox, long-polled where ``channel`` points."""
    [(_, command)] = await channel.poll(wait=5 * T)
    return command


async def test_a_subject_signed_in_through_one_broker_acts_through_another(bus: Bus) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        await on_a.post(Command({"c": "auth.login", "i": on_a.id, "u": 1}, b"alice"))
        login = await frame(bus.tube)
        subject = login.get("s")
        assert isinstance(subject, str)
        await bus.tube.send(encode(Command({"c": "asbp.authenticated", "s": subject})))
        signed_in = await next_command(on_b)
        on_a.seen = on_b.seen
        assert (signed_in.name, signed_in.get("s"), signed_in.command_id) == (
            "asbp.authenticated",
            subject,
            1,
        )
        # Its Authenticated-Commands, posted at either broker, reach the agent.
        for u, at in ((2, on_b), (3, on_a), (4, on_b)):
            status, _ = await at.post(Command({"c": "whoami", "i": on_a.id, "s": subject, "u": u}))
            assert status == 200
            request = await frame(bus.tube)
            assert (request.name, request.get("s"), request.command_id) == ("whoami", subject, u)
            await bus.tube.send(
                encode(Command({"c": "whoami.reply", "d": on_a.id, "u": u}, b"alice"))
            )
            reply = await next_command(at)
            on_a.seen = on_b.seen = at.seen
            assert (reply.name, reply.command_id, reply.body) == ("whoami.reply", u, b"alice")
        # Knowing i and s is not enough: another Channel (with its own secret) is refused.
        other = await HttpChannel(client, bus.http(bus.b)).open()
        await other.post(Command({"c": "whoami", "i": other.id, "s": subject, "u": 5}))
        denied = await next_command(other)
        assert (read_fault(denied).code, denied.command_id) == (FaultCode.ACCESS_DENIED, 5)
        # Signing out through B ends it where it lives; the agent hears of it.
        await on_b.post(Command({"c": "asbp.logout", "i": on_a.id, "s": subject, "u": 6}))
        logout = await next_command(on_b)
        on_a.seen = on_b.seen
        assert (logout.name, logout.command_id) == ("asbp.accepted", 6), logout
        ended = await frame(bus.tube)
        assert (ended.name, ended.get("s"), ended.get("cause")) == (
            "asbp.subject.ended",
            subject,
            "logout",
        )
        await on_a.post(Command({"c": "whoami", "i": on_a.id, "s": subject, "u": 7}))
        after = await next_command(on_a)
        assert (read_fault(after).code, after.command_id) == (FaultCode.ACCESS_DENIED, 7)


async def test_a_group_joined_through_one_broker_reaches_long_polls_on_another(
    bus: Bus,
) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        # The client's requests go to B as well as A before the join: B serves
        # the Channel too, yet the group is the Channel's, not one broker's.
        await on_b.post(Command({"c": "asbp.ping", "i": on_a.id, "u": 1}))
        assert (await next_command(on_b)).name == "asbp.pong"
        on_a.seen = on_b.seen
        join = {"c": "asbp.join", "groups": "room", "channels": on_a.id, "u": 2}
        await bus.tube.send(encode(Command(join)))
        accepted = await frame(bus.tube)
        assert (accepted.name, accepted.command_id) == ("asbp.accepted", 2), accepted
        # One member on the bus: a group Command is in the mailbox once, read at B.
        await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"first")))
        news = await next_command(on_b)
        assert (news.name, news.body) == ("news", b"first")
        assert await on_b.poll(wait=0) == []
        # The group is the Channel's home's (A, which opened it), not B's copy.
        await until_in_directory(bus.redis_url, "grp:room", "broker-a")
        await until_in_directory(bus.redis_url, "grp:room", "broker-b", present=False)
        # A dies: the next long-poll at B finds no home, and B takes the Channel
        # over with the groups its record keeps. Nobody joins it again.
        await bus.a.kill()
        await until_in_directory(bus.redis_url, "grp:room", "broker-a", present=False)
        await on_b.post(Command({"c": "asbp.ping", "i": on_a.id, "u": 3}))
        assert (await next_command(on_b)).name == "asbp.pong"
        await until_in_directory(bus.redis_url, "grp:room", "broker-b")
        await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"second")))
        news = await next_command(on_b)
        assert (news.name, news.body) == ("news", b"second")
        # Leaving through the agent's broker reaches wherever the membership is.
        leave = {"c": "asbp.leave", "groups": "room", "channels": on_a.id, "u": 5}
        await bus.tube.send(encode(Command(leave)))
        assert (await frame(bus.tube)).command_id == 5
        await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"gone")))
        await bus.tube.send(encode(Command({"c": "news", "d": on_a.id}, b"marker")))
        assert (await next_command(on_b)).body == b"marker"


async def test_a_request_whose_respondents_broker_dies_gets_2102_in_the_mailbox(
    bus: Bus,
) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        await on_a.post(Command({"c": "slow", "i": on_a.id, "u": 8}))
        request = await frame(bus.tube)
        assert (request.name, request.command_id) == ("slow", 8)
        await bus.c.kill()
        abandon(bus.tube)
        killed = time.monotonic()
        [(_, fault)] = await on_b.poll(wait=LEASE + 5 * T)
        assert (fault.name, fault.command_id) == ("asbp.fault", 8), fault
        assert read_fault(fault).code == FaultCode.RESPONDENT_LEFT
        assert time.monotonic() - killed <= LEASE + 2 * T


async def keep_polling(channel: HttpChannel, into: asyncio.Queue[Command]) -> None:
    """Long-poll ``channel`` for short waits (within the idle timeout, so that its
    log stays alive) until cancelled, putting what arrives into ``into``."""
    while True:
        for _, command in await channel.poll(wait=0.5):
            into.put_nowait(command)


async def test_the_homes_copy_outlives_its_idle_timeout_while_the_client_uses_another_broker(
    tmp_path: Path, redis_url: str
) -> None:
    async with (
        three_brokers(
            tmp_path,
            redis_url,
            top='log_level = "debug"\n',
            tables="[channels]\nhttp_idle_timeout = 2.0\n",
        ) as bus,
        httpx.AsyncClient(timeout=10 * T) as client,
    ):
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        await on_b.post(Command({"c": "asbp.ping", "i": on_a.id, "u": 1}))
        assert (await next_command(on_b)).name == "asbp.pong"
        join = {"c": "asbp.join", "groups": "room", "channels": on_a.id, "u": 2}
        await bus.tube.send(encode(Command(join)))
        assert (await frame(bus.tube)).command_id == 2
        # Subscribed through B: the subscription is the home's too.
        subscribe = {"c": "asbp.subscribe", "i": on_a.id, "destination": "/news", "u": 3}
        await on_b.post(Command(subscribe))
        subscribed = await next_command(on_b)
        assert (subscribed.name, subscribed.command_id) == ("asbp.accepted", 3), subscribed
        arrived: asyncio.Queue[Command] = asyncio.Queue()
        # The client uses B only; A, its home, finds its copy idle and asks the
        # log, which B's requests keep alive: the copy, and the group, stay.
        polling = asyncio.ensure_future(keep_polling(on_b, arrived))
        try:
            await bus.a.log.wait_for(b"channel.idle_here", on_a.id.encode(), timeout=10 * T)
            await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"kept")))
            with anyio.fail_after(5 * T):
                assert (await arrived.get()).body == b"kept"
        finally:
            polling.cancel()
        # Then A only: B's copy, a visitor holding nothing, idles out for good.
        on_a.seen = on_b.seen
        polling = asyncio.ensure_future(keep_polling(on_a, arrived))
        try:
            await bus.b.log.wait_for(b'"channel.close"', on_a.id.encode(), timeout=10 * T)
            await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"still")))
            publish = {"c": "asbp.publish", "destination": "/news", "u": 9}
            await bus.tube.send(encode(Command(publish, b"published")))
            with anyio.fail_after(5 * T):
                both = {(c.name, c.body) for c in [await arrived.get(), await arrived.get()]}
            # Two paths (the bus's groups, the engine's topics): in either order.
            assert both == {("news", b"still"), ("asbp.notification", b"published")}
        finally:
            polling.cancel()


async def test_when_the_home_dies_its_subjects_are_lost_and_the_client_signs_in_again(
    bus: Bus,
) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        await on_b.post(Command({"c": "auth.login", "i": on_a.id, "u": 1}, b"alice"))
        login = await frame(bus.tube)
        assert login.get("b") == "broker-a"  # handed to the home, which signs it in
        await bus.tube.send(encode(Command({"c": "asbp.authenticated", "s": login.get("s")})))
        assert (await next_command(on_b)).name == "asbp.authenticated"
        await bus.a.kill()
        await until_in_directory(bus.redis_url, "ch", on_a.id, present=False)
        # B finds no home to hand the Subject's Command to: it is the home now, and
        # the Subject died with A (never silence: 3201, as for any unknown s).
        await on_b.post(Command({"c": "whoami", "i": on_a.id, "s": login.get("s"), "u": 2}))
        denied = await next_command(on_b)
        assert (read_fault(denied).code, denied.command_id) == (FaultCode.ACCESS_DENIED, 2)
        await until_in_directory(bus.redis_url, "ch", on_a.id)
        # Signing in again works through B, its new home.
        await on_b.post(Command({"c": "auth.login", "i": on_a.id, "u": 3}, b"alice"))
        again = await frame(bus.tube)
        assert again.get("b") == "broker-b"
        subject = again.get("s")
        await bus.tube.send(encode(Command({"c": "asbp.authenticated", "s": subject})))
        assert (await next_command(on_b)).get("s") == subject
        await on_b.post(Command({"c": "whoami", "i": on_a.id, "s": subject, "u": 4}))
        request = await frame(bus.tube)
        assert (request.name, request.get("s"), request.command_id) == ("whoami", subject, 4)


async def test_when_the_home_stops_its_subjects_move_to_the_broker_that_takes_it_over(
    bus: Bus,
) -> None:
    # A rolling restart must not sign every HTTP client out: a home stopped with
    # SIGTERM keeps its Channels' Subjects beside their logs, the broker that
    # takes a Channel over restores them, and their agents hear of no end.
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        await on_a.post(Command({"c": "auth.login", "i": on_a.id, "u": 1}, b"alice"))
        login = await frame(bus.tube)
        subject = login.get("s")
        assert isinstance(subject, str) and login.get("b") == "broker-a"
        await bus.tube.send(encode(Command({"c": "asbp.authenticated", "s": subject})))
        assert (await next_command(on_a)).name == "asbp.authenticated"
        on_b.seen = on_a.seen
        bus.a.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30 * T):
            assert await bus.a.process.wait() == 0
        await bus.a.log.wait_for(b"broker.subjects_handed_over")
        # The first Command at B makes it the home, and it knows the Subject.
        await on_b.post(Command({"c": "whoami", "i": on_a.id, "s": subject, "u": 2}))
        request = await frame(bus.tube)  # no asbp.subject.ended came before it
        assert (request.name, request.get("s"), request.command_id) == ("whoami", subject, 2)
        assert request.get("b") == "broker-b"
        await bus.tube.send(encode(Command({"c": "whoami.reply", "d": on_a.id, "u": 2}, b"alice")))
        reply = await next_command(on_b)
        assert (reply.name, reply.command_id, reply.body) == ("whoami.reply", 2, b"alice")
        await until_in_directory(bus.redis_url, "ch", on_a.id)
        # Signed out at its new home, it ends there, and the agent hears of it once.
        await on_b.post(Command({"c": "asbp.logout", "i": on_a.id, "s": subject, "u": 3}))
        assert (await next_command(on_b)).command_id == 3
        ended = await frame(bus.tube)
        assert (ended.name, ended.get("s"), ended.get("cause")) == (
            "asbp.subject.ended",
            subject,
            "logout",
        )


async def test_a_request_nobody_on_the_bus_serves_gets_2101_in_the_mailbox(bus: Bus) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        # Never silence (it was: the failed forward of a logged request was dropped).
        await on_b.post(Command({"c": "nobody.serves", "i": on_a.id, "u": 9}))
        fault = await next_command(on_b)
        assert (fault.name, fault.command_id) == ("asbp.fault", 9), fault
        assert read_fault(fault).code == FaultCode.NO_RESPONDENT


#: Channels taken over at once: each is one chance for both visitors to win.
CHANNELS = 6


async def test_two_visitors_noticing_a_dead_home_at_once_take_it_over_once(bus: Bus) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        homes = [await HttpChannel(client, bus.http(bus.a)).open() for _ in range(CHANNELS)]
        on_b = [HttpChannel(client, bus.http(bus.b), h.id, secret=h.secret) for h in homes]
        on_c = [HttpChannel(client, bus.http(bus.c), h.id, secret=h.secret) for h in homes]
        # B and C serve each Channel too: each holds a visitor copy.
        for n, home in enumerate(homes):
            for u, at in enumerate((on_b[n], on_c[n]), start=1):
                await at.post(Command({"c": "asbp.ping", "i": at.id, "u": u}))
                assert (await next_command(at)).name == "asbp.pong"
                home.seen = on_b[n].seen = on_c[n].seen = at.seen
        ids = [h.id for h in homes]
        await bus.tube.send(
            encode(Command({"c": "asbp.join", "groups": "room", "channels": ids, "u": 1}))
        )
        assert (await frame(bus.tube)).command_id == 1
        # At A, the home, in order: the join (and the record kept of it), then this.
        await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"joined")))
        for n, home in enumerate(homes):
            assert (await next_command(home)).body == b"joined"
            on_b[n].seen = on_c[n].seen = home.seen
        await bus.a.kill()
        for home in homes:
            await until_in_directory(bus.redis_url, "ch", home.id, present=False)
        # Both visitors of every Channel find no home for a Subject's Command at once.
        await asyncio.gather(
            *(
                at.post(Command({"c": "whoami", "i": at.id, "s": "5" * 32, "u": 100}))
                for pair in zip(on_b, on_c, strict=True)
                for at in pair
            )
        )
        winners: set[str] = set()
        for n in range(CHANNELS):
            faults = [c for _, c in await on_b[n].poll(wait=5 * T)]
            with anyio.fail_after(10 * T):
                while len(faults) < 2:
                    faults.extend(c for _, c in await on_b[n].poll(wait=T))
            # Each visitor's Command was routed once, at the one home (3201: the Subject
            # is unknown there).
            assert [(f.name, f.command_id) for f in faults] == [("asbp.fault", 100)] * 2
            assert {read_fault(f).code for f in faults} == {FaultCode.ACCESS_DENIED}
            winners.add(await rejoined(bus, homes[n].id))
        # Each winner's membership is in the directory, where C's `g` looks for it.
        for winner in winners:
            await until_in_directory(bus.redis_url, "grp:room", winner)
        await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"once")))
        await bus.tube.send(encode(Command({"c": "news", "g": "room"}, b"end")))
        for n in range(CHANNELS):
            got: list[Command] = []
            with anyio.fail_after(10 * T):
                while not any(c.body == b"end" for c in got):
                    got.extend(command for _, command in await on_b[n].poll(wait=T))
            # A second home would have delivered both again, by another path.
            got.extend(command for _, command in await on_b[n].poll(wait=T))
            # The group reached each Channel once: one home joined it again.
            assert [(c.name, c.body) for c in got] == [("news", b"once"), ("news", b"end")]


async def rejoined(bus: Bus, channel_id: str) -> str:
    """Wait until B or C (whichever is its home now) joined the Channel to its groups:
    that broker's identifier."""
    brokers = {"broker-b": bus.b, "broker-c": bus.c}
    waits = {
        asyncio.ensure_future(
            at.log.wait_for(b"channel.groups_rejoined", channel_id.encode(), timeout=10 * T)
        ): name
        for name, at in brokers.items()
    }
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        first = done.pop()
        first.result()
        return waits[first]
    finally:
        for wait in waits:
            wait.cancel()


async def test_an_operator_closing_an_http_channel_closes_it_bus_wide(bus: Bus) -> None:
    async with httpx.AsyncClient(timeout=10 * T) as client:
        on_a = await HttpChannel(client, bus.http(bus.a)).open()
        on_b = HttpChannel(client, bus.http(bus.b), on_a.id, secret=on_a.secret)
        on_c = HttpChannel(client, bus.http(bus.c), on_a.id, secret=on_a.secret)
        await on_b.post(Command({"c": "asbp.ping", "i": on_a.id, "u": 1}))
        assert (await next_command(on_b)).name == "asbp.pong"  # B holds a visitor copy
        # Asked at B, the visitor: the close goes to the home, A (before: B closed its
        # own copy only, and took the Channel over at its next Command).
        api = bus.http(bus.b).replace("/asbp", "/api/v1")
        closed = await client.post(f"{api}/channels/{on_a.id}/close", json={"reason": "abuse"})
        assert closed.status_code == 202, closed.text
        assert closed.json()["broker"] == "broker-a"
        await bus.a.log.wait_for(b'"management.write"', on_a.id.encode(), b"broker-b")
        await until_in_directory(bus.redis_url, "ch", on_a.id, present=False)
        # Gone everywhere: a long-poll at the visitor, a Subject's Command there
        # (which would have claimed the Channel), and a broker that never served it.
        polled = await on_b.poll_response(wait=T)
        assert read_fault(decode(polled.content)).code == FaultCode.UNKNOWN_CHANNEL
        for at in (on_b, on_c, on_a):
            _, answer = await at.post(Command({"c": "whoami", "i": on_a.id, "s": "5" * 32, "u": 2}))
            assert (read_fault(answer).code, answer.command_id) == (FaultCode.UNKNOWN_CHANNEL, 2)
        # Nobody took it over.
        directory = client_for(bus.redis_url)
        try:
            assert await directory.hget(DIRECTORY + "ch", on_a.id) is None
        finally:
            await directory.aclose()

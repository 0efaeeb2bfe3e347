"""The management API sees the whole bus: two brokers on one private redis-server,
each listing both, with their Channels (from the plane's directory) and Tubes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio

from asbp import Command
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from gateway.plane.redis.keys import directory_prefix, stream_key
from gateway.plane.redis.plane import PREFIX as PLANE_PREFIX
from tests.support import RedisServer, T, serve_app_async
from tests.support.admin import asbp_cli
from tests.support.bus import until
from tests.support.gateway import Gateway, GatewayFactory
from tests.support.messaging import user

#: Where the plane's directory (and the census's cards) are, hash tag included.
PREFIX = directory_prefix(PLANE_PREFIX)

pytestmark = pytest.mark.anyio

LEASE = 1.5


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def bus(
    redis_server: RedisServer, make_gateway: GatewayFactory, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    def options(broker_id: str) -> dict[str, Any]:
        return {
            "broker_id": broker_id,
            "data_dir": tmp_path / broker_id,
            "engine": "redis",
            "redis_url": redis_server.url,
            "bus_lease": LEASE,
        }

    yield await make_gateway(**options("broker-a")), await make_gateway(**options("broker-b"))


async def until_card(redis_url: str, broker_id: str, **wanted: int) -> None:
    """Wait until ``broker_id``'s card on the bus (rewritten every lease / 6) shows ``wanted``."""

    async def holds(client: redis.asyncio.Redis) -> bool:
        card = await client.get(f"{PREFIX}card:{broker_id}")
        return card is not None and all(json.loads(card)[k] == v for k, v in wanted.items())

    await until(redis_url, f"card:{broker_id}", holds)


async def until_channels(redis_url: str, broker_id: str, count: int) -> None:
    """Wait until the plane's directory lists ``count`` Channels at ``broker_id``."""

    async def holds(client: redis.asyncio.Redis) -> bool:
        return int(await client.scard(f"{PREFIX}chs:{broker_id}")) == count

    await until(redis_url, f"chs:{broker_id}", holds)


async def brokers(gateway: Gateway) -> dict[str, Any]:
    client = await gateway.http_client()
    response = await client.get(f"{gateway.server.http_url}/api/v1/broker")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_each_broker_lists_the_whole_bus(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    await a.channel()
    await a.channel()
    await b.channel()
    await b.tube("billing", serves=("quote",))
    await until_card(redis_server.url, "broker-b", tubes=1)
    await until_channels(redis_server.url, "broker-b", 1)
    await until_channels(redis_server.url, "broker-a", 2)

    for gateway, first in ((a, "broker-a"), (b, "broker-b")):
        body = await brokers(gateway)
        assert body["scope"] == "bus"
        listed = {item["broker"]: item for item in body["brokers"]}
        assert body["brokers"][0]["broker"] == first  # the one answering comes first
        assert set(listed) == {"broker-a", "broker-b"}
        assert (listed["broker-a"]["channels"], listed["broker-a"]["tubes"]) == (2, 0)
        assert (listed["broker-b"]["channels"], listed["broker-b"]["tubes"]) == (1, 1)
        assert all(item["engine"] == "redis" and item["uptime_seconds"] >= 0
                   for item in body["brokers"])  # fmt: skip


async def test_a_stopped_broker_leaves_the_list(
    redis_server: RedisServer, make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    options: dict[str, Any] = {"engine": "redis", "redis_url": redis_server.url, "bus_lease": LEASE}
    a = await make_gateway(broker_id="broker-a", data_dir=tmp_path / "a", **options)
    # broker-b is served here, so that the test stops it.
    config = GatewayConfig(broker_id="broker-b", data_dir=tmp_path / "b", **options)
    async with serve_app_async(create_app(config)):
        await until_card(redis_server.url, "broker-b", tubes=0)
        assert {item["broker"] for item in (await brokers(a))["brokers"]} == {
            "broker-a",
            "broker-b",
        }
    # A broker that stops leaves the bus (LEAVE drops its lease) and its card.
    assert [item["broker"] for item in (await brokers(a))["brokers"]] == ["broker-a"]


async def test_a_broker_without_a_readable_card_is_left_out(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, _ = bus
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        # Two live brokers as the directory knows them: one whose card is garbage,
        # one that joined a moment ago and has none yet; and a dead one.
        for broker_id in ("garbled", "new", "dead"):
            await client.sadd(f"{PREFIX}brokers", broker_id)
        for broker_id in ("garbled", "new"):
            await client.set(f"{PREFIX}alive:{broker_id}", "1")
        await client.set(f"{PREFIX}card:garbled", b"{not json")
        await client.set(f"{PREFIX}card:dead", b"{}")
        listed = {item["broker"] for item in (await brokers(a))["brokers"]}
        assert listed == {"broker-a", "broker-b"}
        await a.events.wait("census.bad_card", peer="garbled")
    finally:
        await client.aclose()


async def test_a_bus_out_of_reach_is_a_503_and_the_broker_keeps_serving(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, _ = bus
    redis_server.stop()
    try:
        refused = await a.http_client()
        response = await refused.get(f"{a.server.http_url}/api/v1/broker")
        assert response.status_code == 503
        assert "unreachable" in response.json()["detail"]
        # The card keeper says so in the log rather than dying.
        await a.events.wait("census.write_failed")
        assert (await refused.get(f"{a.server.http_url}/healthz")).status_code == 200
    finally:
        redis_server.start()


async def api(gateway: Gateway, method: str, path: str, **options: Any) -> Any:
    client = await gateway.http_client()
    return await client.request(method, f"{gateway.server.http_url}/api/v1{path}", **options)


async def test_channels_are_listed_and_paged_across_the_bus_from_either_broker(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    on_a = {(await a.channel()).id for _ in range(3)}
    on_b = {(await b.channel()).id for _ in range(2)}
    await until_channels(redis_server.url, "broker-a", 3)
    await until_channels(redis_server.url, "broker-b", 2)
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        # A dead broker's entry the sweep has not forgotten yet is not listed.
        await client.hset(f"{PREFIX}ch", "ghost", "dead")
        await client.zadd(f"{PREFIX}chz", {"ghost": 0})
    finally:
        await client.aclose()
    expected = {**dict.fromkeys(on_a, "broker-a"), **dict.fromkeys(on_b, "broker-b")}

    for gateway, here in ((a, on_a), (b, on_b)):
        # Two Channels a page: three pages, by the cursor, cover the bus once.
        seen: dict[str, dict[str, Any]] = {}
        after: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2} | ({"after": after} if after else {})
            response = await api(gateway, "GET", "/channels", params=params)
            assert response.status_code == 200, response.text
            body = response.json()
            assert (body["scope"], body["total"]) == ("bus", 5)
            seen.update((item["id"], item) for item in body["items"])
            pages += 1
            after = body["next_after"]
            if after is None:
                break
        assert pages == 3
        assert {i: item["broker"] for i, item in seen.items()} == expected
        # This broker's Channels in full; the other's by id and broker.
        assert all((item["transport"] is not None) == (i in here) for i, item in seen.items())
        # The offset pages the same list.
        response = await api(gateway, "GET", "/channels", params={"offset": 4, "limit": 2})
        assert [item["id"] for item in response.json()["items"]] == [sorted(expected)[4]]
        # Up to 10,000 (a walk of the directory's sorted set inside one script);
        # past it 400, pointing to the cursor, and Redis is never asked.
        response = await api(gateway, "GET", "/channels", params={"offset": 10_000})
        assert (response.status_code, response.json()["items"]) == (200, [])
        response = await api(gateway, "GET", "/channels", params={"offset": 10**12})
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert "at most 10000" in response.json()["detail"]
        assert "after=" in response.json()["detail"]


async def test_a_channel_at_the_other_broker_is_found_and_closed_there(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    peer, local = await b.channel(), await b.channel()
    await until_channels(redis_server.url, "broker-b", 2)

    found = await api(a, "GET", f"/channels/{peer.id}")
    assert found.status_code == 200, found.text
    assert (found.json()["id"], found.json()["broker"]) == (peer.id, "broker-b")
    assert found.json()["transport"] is None

    # broker-a hands the close to broker-b over the plane: 202, not yet closed.
    handed = await api(a, "POST", f"/channels/{peer.id}/close", json={"reason": "abuse"})
    assert handed.status_code == 202, handed.text
    assert handed.json() == {"id": peer.id, "closed": False, "broker": "broker-b"}
    await a.events.wait("management.write", action="channel.close", broker="broker-b")
    # broker-b closes it as its own API does, and logs who asked, through which broker.
    record = await b.events.wait("management.write", action="channel.close", via="broker-a")
    fields = record.__dict__
    assert (fields["channel"], fields["reason"], fields["principal"]) == (
        peer.id,
        "abuse",
        "loopback",
    )
    await asyncio.wait_for(peer.ws.wait_closed(), 5 * T)
    closed = await api(b, "POST", f"/channels/{local.id}/close", json={"reason": "abuse"})
    assert closed.status_code == 200, closed.text
    assert closed.json() == {"id": local.id, "closed": True, "broker": "broker-b"}
    await asyncio.wait_for(local.ws.wait_closed(), 5 * T)
    # The client cannot tell a close handed over from one made where it is.
    assert (peer.ws.close_code, peer.ws.close_reason) == (
        local.ws.close_code,
        local.ws.close_reason,
    )
    await until_channels(redis_server.url, "broker-b", 0)

    # Gone from the bus: a 404 from either broker, and from the bus's list.
    for gateway in (a, b):
        assert (await api(gateway, "GET", f"/channels/{peer.id}")).status_code == 404
        response = await api(gateway, "POST", f"/channels/{peer.id}/close", json={"reason": "x"})
        assert response.status_code == 404
        listed = (await api(gateway, "GET", "/channels")).json()
        assert (listed["total"], listed["items"]) == (0, [])


async def test_a_close_for_a_channel_already_gone_is_logged_and_dropped(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    survivor = await b.channel()
    # What broker-a's API writes when the Channel closes on its own between its
    # lookup and broker-b reading the request.
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        await client.xadd(
            stream_key(PLANE_PREFIX, "broker-b"),
            {"k": "x", "o": "broker-a", "i": "long-gone", "g": "loopback", "f": "abuse"},
        )
    finally:
        await client.aclose()
    record = await b.events.wait("plane.channel_gone", channel="long-gone")
    assert record.__dict__["reason"] == "abuse"
    # broker-b keeps serving.
    listed = (await api(a, "GET", f"/channels/{survivor.id}")).json()
    assert listed["broker"] == "broker-b"


async def test_agents_and_subjects_across_the_bus(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    await a.tube("billing", serves=("quote",))
    await b.tube("billing")
    await b.tube("billing")

    async def card_agents(client: redis.asyncio.Redis) -> bool:
        card = await client.get(f"{PREFIX}card:broker-b")
        return card is not None and json.loads(card)["agents"] == {"billing": 2}

    await until(redis_server.url, "card:broker-b", card_agents)

    body = (await api(a, "GET", "/agents")).json()
    assert body["scope"] == "bus"
    listed = {(item["agent"], item["broker"]): item for item in body["items"]}
    assert set(listed) == {("billing", "broker-a"), ("billing", "broker-b")}
    here, there = listed["billing", "broker-a"], listed["billing", "broker-b"]
    assert (here["tube_count"], here["tubes"][0]["serves"]) == (1, ["quote"])
    assert (there["tube_count"], there["tubes"]) == (2, [])

    subjects = (await api(b, "GET", "/subjects")).json()
    assert subjects == {"count": 0, "scope": "bus"}


@pytest.fixture
async def subject_bus(
    redis_server: RedisServer, make_gateway: GatewayFactory, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Two brokers with Subjects on: billing may serve the Authenticate-Command."""

    def options(broker_id: str) -> dict[str, Any]:
        return {
            "broker_id": broker_id,
            "data_dir": tmp_path / broker_id,
            "engine": "redis",
            "redis_url": redis_server.url,
            "bus_lease": LEASE,
            "agents": {"billing": {"public_key": "billing.pem", "serves": [".*", "auth.login"]}},
            "authenticate_command": "auth.login",
        }

    yield await make_gateway(**options("broker-a")), await make_gateway(**options("broker-b"))


async def test_a_subject_living_at_the_other_broker_is_ended_there(
    subject_bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = subject_bus
    agent = await b.tube("billing", serves=("auth.login",))
    user = await b.channel()
    await user.send("c=auth.login,u=1;alice")
    login = await agent.recv()
    subject = login.get("s")
    assert (login.name, isinstance(subject, str)) == ("auth.login", True)
    await agent.send(Command({"c": "asbp.authenticated", "s": subject, "u": 5}))
    assert (await agent.recv()).name == "asbp.accepted"
    assert (await user.recv()).name == "asbp.authenticated"
    await until_card(redis_server.url, "broker-b", subjects=1)

    # A Subject nobody holds is handed over too (broker-b ignores it): a 202 says
    # where the request went, not that the Subject exists.
    unknown = await api(a, "DELETE", "/subjects/nobody")
    assert (unknown.status_code, unknown.json()["brokers"]) == (202, ["broker-b"])
    # broker-a does not hold it: every other live broker is asked, 202.
    handed = await api(a, "DELETE", f"/subjects/{subject}")
    assert handed.status_code == 202, handed.text
    assert handed.json() == {"id": subject, "ended": False, "brokers": ["broker-b"]}
    # broker-b ends it as its own API does: its agent is told, the write logged.
    ended = await agent.recv()
    assert (ended.name, ended.get("s"), ended.get("cause")) == (
        "asbp.subject.ended",
        subject,
        "ended by an operator",
    )
    record = await b.events.wait("management.write", action="subject.end", via="broker-a")
    assert (record.__dict__["subject"], record.__dict__["principal"]) == (subject, "loopback")
    assert (await api(b, "GET", "/subjects")).json() == {"count": 0, "scope": "bus"}
    # Its Commands are refused now, as after a local end.
    await user.send(f"c=whoami,s={subject},u=2;")
    refused = await user.recv()
    assert (refused.name, refused.command_id) == ("asbp.fault", 2)


async def test_a_subject_ended_where_it_lives_is_a_200(
    subject_bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, _ = subject_bus
    agent = await a.tube("billing", serves=("auth.login",))
    user = await a.channel()
    await user.send("c=auth.login,u=1;alice")
    subject = (await agent.recv()).get("s")
    await agent.send(Command({"c": "asbp.authenticated", "s": subject, "u": 5}))
    assert (await agent.recv()).name == "asbp.accepted"
    ended = await api(a, "DELETE", f"/subjects/{subject}")
    assert ended.status_code == 200, ended.text
    assert ended.json() == {"id": subject, "ended": True, "brokers": ["broker-a"]}
    assert (await agent.recv()).name == "asbp.subject.ended"


async def test_the_bus_lists_out_of_reach_are_503(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, _ = bus
    redis_server.stop()
    try:
        for path in ("/channels", "/channels/nobody", "/agents", "/subjects"):
            response = await api(a, "GET", path)
            assert response.status_code == 503, (path, response.text)
            assert "unreachable" in response.json()["detail"]
    finally:
        redis_server.start()


async def test_topics_are_listed_across_the_bus_with_their_brokers(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer
) -> None:
    a, b = bus
    for gateway, topics in ((a, ("news", "news")), (b, ("news", "sports/.*"))):
        for topic in topics:
            await (await user(gateway)).subscribe(topic)

    async def card_topics(client: redis.asyncio.Redis) -> bool:
        card = await client.get(f"{PREFIX}card:broker-b")
        return card is not None and json.loads(card)["topic_count"] == 2

    await until(redis_server.url, "card:broker-b", card_topics)
    response = await api(a, "GET", "/topics")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["scope"], body["total"]) == ("bus", 3)
    assert [(t["name"], t["pattern"], t["subscribers"], t["broker"]) for t in body["items"]] == [
        ("news", False, 2, "broker-a"),
        ("news", False, 1, "broker-b"),
        ("sports/.*", True, 1, "broker-b"),
    ]


async def test_the_cli_shows_each_channel_and_agent_with_its_broker(
    bus: tuple[Gateway, Gateway], redis_server: RedisServer, tmp_path: Path
) -> None:
    a, b = bus
    ids = sorted([(await a.channel()).id, (await a.channel()).id, (await b.channel()).id])
    await b.tube("billing")
    await until_channels(redis_server.url, "broker-b", 1)

    async def card_agents(client: redis.asyncio.Redis) -> bool:
        card = await client.get(f"{PREFIX}card:broker-b")
        return card is not None and json.loads(card)["agents"] == {"billing": 1}

    await until(redis_server.url, "card:broker-b", card_agents)

    async def cli(*args: str) -> list[list[str]]:
        # In a thread: the brokers serve on this event loop.
        done = await anyio.to_thread.run_sync(
            lambda: asbp_cli(*args, "--url", a.server.http_url, cwd=tmp_path)
        )
        assert done.returncode == 0, done.stderr
        return [line.split() for line in done.stdout.splitlines()]

    first = await cli("channels", "--limit", "2")
    assert first[0][:2] == ["channel", "broker"]
    assert first[-1][-2:] == ["--after", f"{ids[1]})"]
    rest = await cli("channels", "--limit", "2", "--after", ids[1])
    assert [row[0] for row in rest[2:-1]] == [ids[2]]
    listed = {row[0]: row[1] for row in first[2:-1] + rest[2:-1]}
    assert sorted(listed) == ids
    assert sorted(listed.values()) == ["broker-a", "broker-a", "broker-b"]

    agents = await cli("agents")
    assert agents[0][:3] == ["agent", "broker", "tube"]
    assert agents[2][:4] == ["billing", "broker-b", "(1", "Tubes)"]

"""Topics: publish, subscribe (names and patterns), notifications, faults and ACLs.

End to end: a real broker on a real server, real WebSocket and HTTP clients, once per
engine (``memory``, and ``redis`` on a private ``redis-server``). Nothing sleeps: a test
waits for the Command it expects, with a deadline, and proves that something did *not*
arrive with a barrier (a later message on the same path that must arrive after it).

The helpers (:class:`~tests.support.messaging.Messenger`, ``start_broker``) are in
:mod:`tests.support.messaging`, the fixtures in conftest.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import asbp
from asbp import Command
from gateway.config.model import ChannelLimits, MessagingLimits
from tests.support.gateway import (
    BROKER_ID,
    Gateway,
    GatewayFactory,
    assert_fault,
)
from tests.support.messaging import Messenger, RedisServers, security, start_broker, user

pytestmark = pytest.mark.anyio

# --------------------------------------------------------------------------
# Publish and subscribe


async def test_a_topic_message_reaches_an_exact_subscriber(broker: Gateway) -> None:
    subscriber, publisher = await user(broker), await user(broker)
    await subscriber.subscribe("/news/sport")

    message_id = await publisher.publish(
        "/news/sport", b"goal!", m="text/plain", e="UTF-8", custom="not carried"
    )

    note = await subscriber.notification()
    assert note.body == b"goal!"
    assert note.get("destination") == "/news/sport"
    assert note.get("subscription") == "/news/sport"
    assert note.get("type") == "TOPIC"
    assert note.get("id") == message_id
    assert note.get("priority") == "4"
    assert (note.get("m"), note.get("e")) == ("text/plain", "UTF-8")
    assert "custom" not in note and "exp" not in note and "receipt" not in note
    assert "u" not in note and "a" not in note


async def test_the_timestamp_and_expiration_are_epoch_milliseconds(broker: Gateway) -> None:
    import time

    subscriber, publisher = await user(broker), await user(broker)
    await subscriber.subscribe("/clock")
    before = time.time()
    await publisher.publish("/clock", b"t", ttl="60")
    after = time.time()

    note = await subscriber.notification()
    ts, exp = int(str(note.get("ts"))), int(str(note.get("exp")))
    assert int(before * 1000) - 1 <= ts <= int(after * 1000) + 1
    assert exp - ts in range(59_999, 60_002)


async def test_a_pattern_subscription_matches_whole_names(broker: Gateway) -> None:
    subscriber, publisher = await user(broker), await user(broker)
    await subscriber.subscribe("/news/.*")
    await subscriber.subscribe("/marker")

    await publisher.publish("/news/sport", b"1")
    await publisher.publish("/old/news/sport", b"not a full match")
    await publisher.publish("/news/weather", b"2")
    await publisher.publish("/marker", b"end")

    first = await subscriber.notification("/news/.*")
    second = await subscriber.notification("/news/.*")
    assert (first.body, first.get("destination")) == (b"1", "/news/sport")
    assert (second.body, second.get("destination")) == (b"2", "/news/weather")
    assert first.get("subscription") == "/news/.*"
    await subscriber.notification("/marker")
    assert subscriber.pending() == []


async def test_each_matching_subscription_gets_its_own_notification(broker: Gateway) -> None:
    subscriber, publisher = await user(broker), await user(broker)
    await subscriber.subscribe("/a/b")
    await subscriber.subscribe("/a/.*")

    message_id = await publisher.publish("/a/b", b"twice")

    one = await subscriber.notification()
    two = await subscriber.notification()
    assert {one.get("subscription"), two.get("subscription")} == {"/a/b", "/a/.*"}
    assert one.get("id") == two.get("id") == message_id


async def test_every_subscriber_gets_the_message(broker: Gateway) -> None:
    subscribers = [await user(broker) for _ in range(3)]
    publisher = await user(broker)
    for subscriber in subscribers:
        await subscriber.subscribe("/fanout")

    await publisher.publish("/fanout", b"all of you")

    for subscriber in subscribers:
        assert (await subscriber.notification()).body == b"all of you"


async def test_a_topic_message_without_subscribers_is_dropped(broker: Gateway) -> None:
    subscriber, publisher = await user(broker), await user(broker)
    await publisher.publish("/later", b"nobody listens")
    await subscriber.subscribe("/later")

    await publisher.publish("/later", b"now")

    assert (await subscriber.notification()).body == b"now"
    assert subscriber.pending() == []


async def test_unsubscribe_stops_notifications(broker: Gateway) -> None:
    subscriber, publisher = await user(broker), await user(broker)
    await subscriber.subscribe("/t")
    await subscriber.subscribe("/marker")
    await subscriber.ok("asbp.unsubscribe", destination="/t")
    # Unsubscribing from what one does not hold is no fault.
    await subscriber.ok("asbp.unsubscribe", destination="/never")

    await publisher.publish("/t", b"gone")
    await publisher.publish("/marker", b"end")

    await subscriber.notification("/marker")
    assert subscriber.pending() == []


async def test_an_application_agent_publishes_and_subscribes(broker: Gateway) -> None:
    agent = Messenger.of(await broker.tube("search"))
    subscriber = await user(broker)
    await subscriber.subscribe("/agents/.*")
    await agent.subscribe("/users")

    await agent.publish("/agents/search", b"from an agent", m="text/plain")
    await subscriber.publish("/users", b"from a user")

    note = await subscriber.notification()
    # An agent's publications carry its verified identity.
    assert (note.body, note.get("a"), note.get("m")) == (b"from an agent", "search", "text/plain")
    agent_note = await agent.notification()
    assert (agent_note.body, agent_note.get("a")) == (b"from a user", None)


@pytest.mark.parametrize(("resume", "left"), [("off", 0), ("on", 1)])
async def test_a_closed_channel_loses_its_subscriptions_unless_it_can_resume(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str, resume: str, left: int
) -> None:
    # A Channel that can resume keeps its topic subscriptions parked, feeding its
    # log, until it resumes or its log would expire (gateway.messaging.service,
    # "Resumed Channels"); one that cannot loses them with its connection.
    broker = await start_broker(make_gateway, engine, redis, channels=ChannelLimits(resume=resume))
    peer = await broker.channel()
    leaving = Messenger.of(peer)
    await leaving.subscribe("/bye")
    await leaving.subscribe("/bye/.*")
    assert await broker.call(lambda b: b.messaging.topic_subscribers("/bye")) == 1

    await peer.close()
    await broker.events.wait("channel.close", channel=peer.id)

    assert await broker.call(lambda b: b.messaging.topic_subscribers("/bye")) == left
    assert await broker.call(lambda b: b.messaging.topic_subscribers("/bye/.*")) == left


async def test_publish_without_u_gets_no_acceptance(broker: Gateway) -> None:
    subscriber = await user(broker)
    publisher = await broker.channel()
    await subscriber.subscribe("/quiet")

    await publisher.send(Command({"c": "asbp.publish", "destination": "/quiet"}, b"shh"))

    assert (await subscriber.notification()).body == b"shh"
    # The next thing the publisher hears is the answer to its ping.
    assert (await publisher.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


async def test_replies_keep_the_order_of_a_senders_commands(broker: Gateway) -> None:
    peer = await broker.channel()
    for u in range(1, 21):
        await peer.send(Command({"c": "asbp.publish", "destination": f"/seq/{u}", "u": u}, b""))
    replies = [await peer.recv() for _ in range(20)]
    assert [r.get("u") for r in replies] == [str(u) for u in range(1, 21)]
    assert {r.name for r in replies} == {"asbp.accepted"}


async def test_a_publishers_messages_arrive_in_order(broker: Gateway) -> None:
    subscriber = await user(broker)
    publisher = await broker.channel()
    await subscriber.subscribe("/ordered")
    for n in range(50):
        await publisher.send(
            Command({"c": "asbp.publish", "destination": "/ordered"}, str(n).encode())
        )
    bodies = [(await subscriber.notification()).body for _ in range(50)]
    assert bodies == [str(n).encode() for n in range(50)]


async def test_http_user_agents_subscribe_and_long_poll(broker: Gateway) -> None:
    http = Messenger.http(await broker.http_channel())
    publisher = await user(broker)
    await http.subscribe("/web/.*")

    message_id = await publisher.publish("/web/page", b"via long-poll")

    note = await http.notification()
    assert (note.body, note.get("id"), note.get("subscription")) == (
        b"via long-poll",
        message_id,
        "/web/.*",
    )
    # And an HTTP User-Agent publishes too.
    await publisher.subscribe("/from-http")
    await http.publish("/from-http", b"posted")
    assert (await publisher.notification()).body == b"posted"


async def test_two_brokers_sharing_redis_deliver_to_both(
    redis: RedisServers, make_gateway: GatewayFactory
) -> None:
    url = await redis.url()
    first = await make_gateway(engine="redis", redis_url=url, broker_id="broker-one")
    second = await make_gateway(engine="redis", redis_url=url, broker_id="broker-two")
    here, there = await user(first), await user(second)
    await here.subscribe("/shared/.*")
    await there.subscribe("/shared/news")

    message_id = await here.publish("/shared/news", b"everywhere")

    for subscriber in (here, there):
        note = await subscriber.notification()
        assert (note.body, note.get("id")) == (b"everywhere", message_id)


# --------------------------------------------------------------------------
# Faults


@pytest.mark.parametrize(
    ("keys", "code"),
    [
        ({}, 2001),  # no destination
        ({"destination": ""}, 2001),
        ({"destination": ["/a", "/b"]}, 2001),
        ({"destination": "x" * 1025}, 2001),
        ({"destination": "/with space"}, 2001),
        ({"destination": "/with\u200bformat"}, 2001),
        ({"destination": "/a", "type": "MAILBOX"}, 2002),
        ({"destination": "/a", "type": "topic"}, 2002),
        ({"destination": "vq@/a", "type": "VIRTUAL_QUEUE"}, 2002),
        ({"destination": "q@x", "type": "QUEUE"}, 2001),
        ({"destination": "/a", "priority": "10"}, 1203),
        ({"destination": "/a", "priority": "-1"}, 1203),
        ({"destination": "/a", "ttl": "0"}, 1203),
        ({"destination": "/a", "ttl": "1e3"}, 1203),
        ({"destination": "/a", "delay": "soon"}, 1203),
        ({"destination": "/a", "delay": "1", "not_before": "1"}, 1203),
        ({"destination": "/a", "notice": "delivered"}, 1203),
    ],
)
async def test_publish_faults(broker: Gateway, keys: dict[str, Any], code: int) -> None:
    publisher = await user(broker)
    fault = await publisher.call("asbp.publish", b"x", **keys)
    assert_fault(fault, code, u=int(str(fault.get("u"))))
    assert fault.get("cause") == "asbp.publish"


@pytest.mark.parametrize(
    ("keys", "code"),
    [
        ({"destination": "/a/(b+)+"}, 2001),  # could backtrack without bound
        ({"destination": "/a/[b"}, 2001),  # not a regular expression
        ({"destination": "/a", "type": "QUEUES"}, 2002),
        ({"destination": "novq", "type": "VIRTUAL_QUEUE"}, 2001),  # no "@"
        ({"destination": "@/a", "type": "VIRTUAL_QUEUE"}, 2001),
        ({"destination": "vq@(a|ab)*", "type": "VIRTUAL_QUEUE"}, 2001),
        ({"destination": "q@1", "type": "QUEUE"}, 2001),
    ],
)
async def test_subscribe_faults(broker: Gateway, keys: dict[str, Any], code: int) -> None:
    subscriber = await user(broker)
    fault = await subscriber.call("asbp.subscribe", **keys)
    assert fault.name == "asbp.fault" and fault.get("code") == str(code), fault
    assert fault.get("cause") == "asbp.subscribe"


@pytest.mark.parametrize("name", ["asbp.notification", "asbp.notice"])
async def test_what_only_the_broker_sends_is_1202(broker: Gateway, name: str) -> None:
    client = Messenger.of(await broker.channel())
    agent = Messenger.of(await broker.tube())
    for sender in (client, agent):
        fault = await sender.call(name, destination="/t")
        assert (fault.get("code"), fault.get("cause")) == ("1202", name), fault


async def test_an_unsafe_pattern_is_refused_with_a_reason(broker: Gateway) -> None:
    subscriber = await user(broker)
    fault = await subscriber.call("asbp.subscribe", destination="(x+x+)+y")
    assert fault.get("code") == "2001"
    assert b"(x+x+)+y" in fault.body


async def test_a_message_too_large_for_its_notifications_is_1101(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    limits = asbp.Limits(max_frame_bytes=8 * 1024)
    gateway = await start_broker(make_gateway, engine, redis, limits=limits)
    publisher = await user(gateway)
    # The frame fits the codec's limit, but a notification adds the destination, the
    # subscription (as long as any name may be) and the broker's keys.
    fault = await publisher.call("asbp.publish", b"x" * (7 * 1024), destination="/big")
    assert fault.get("code") == "1101", fault
    await publisher.publish("/big", b"x" * 4096)


async def test_max_distinct_subscriptions_is_2004(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    gateway = await start_broker(
        make_gateway, engine, redis, messaging=MessagingLimits(max_subscriptions=2)
    )
    first, second = await user(gateway), await user(gateway)
    await first.subscribe("/one")
    await first.subscribe("/two/.*")
    # Subscribing again to a subscription that exists is no new distinct one.
    await second.subscribe("/one")
    await second.subscribe("/two/.*")

    fault = await second.call("asbp.subscribe", destination="/three")
    assert fault.get("code") == "2004", fault
    fault = await second.call("asbp.subscribe", destination="q", type="QUEUE")
    assert fault.get("code") == "2004", fault

    await first.ok("asbp.unsubscribe", destination="/one")
    await second.ok("asbp.unsubscribe", destination="/one")
    await second.subscribe("/three")


async def test_too_many_pending_commands_is_2106(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    gateway = await start_broker(
        make_gateway, engine, redis, messaging=MessagingLimits(max_pending=2)
    )
    peer = await gateway.channel()
    # Two polls that wait hold two places; the third Command is refused at once.
    await peer.send(Command(c="asbp.poll", destination="q1", wait="5", u=1))
    await peer.send(Command(c="asbp.poll", destination="q2", wait="5", u=2))
    await peer.send(Command(c="asbp.publish", destination="/t", u=3))
    assert_fault(await peer.recv(), 2106, u=3)


async def test_messaging_faults_are_published_on_the_system_fault_topic(broker: Gateway) -> None:
    monitor, client = await user(broker), await user(broker)
    await monitor.subscribe(f"/system/faults/{BROKER_ID}")

    await client.call("asbp.publish", destination="vq@/x", type="VIRTUAL_QUEUE")

    record = json.loads((await monitor.notification()).body)
    assert record["code"] == 2002
    assert record["cause"] == "asbp.publish"
    assert record["broker"] == BROKER_ID
    assert record["to"] == "user-agent"
    assert "channel" not in record  # Channel-Identifiers never leak


# --------------------------------------------------------------------------
# Access control

POLICY = """
[security]
[[security.policies.default.entries]]
action = "PERMIT"
types = ["TOPIC"]
destination = '/secret/.*'
privileges = ["READ"]
condition = { address = "10.0.0.0/8" }

[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/secret/.*'
privileges = ["READ", "WRITE"]
condition = { always = true }

[[security.policies.default.entries]]
action = "DENY"
types = ["QUEUE", "VIRTUAL_QUEUE"]
destination = 'private.*'
privileges = ["READ", "WRITE"]
condition = { always = true }

# No entries of its own: everything but writing under /system/ is permitted.
[security.policies.trusted]

[security.agents]
billing = "trusted"
"""


@pytest.fixture
async def guarded(redis: RedisServers, make_gateway: GatewayFactory, engine: str) -> Gateway:
    return await start_broker(make_gateway, engine, redis, acl=security(POLICY))


async def test_acl_denies_publishing(guarded: Gateway) -> None:
    client = await user(guarded)
    fault = await client.call("asbp.publish", destination="/secret/plans")
    assert fault.get("code") == "3201", fault
    fault = await client.call("asbp.publish", destination="private-q", type="QUEUE")
    assert fault.get("code") == "3201", fault
    await client.publish("/public", b"fine")


async def test_acl_denies_subscribing_to_an_exact_name(guarded: Gateway) -> None:
    client = await user(guarded)
    fault = await client.call("asbp.subscribe", destination="/secret/plans")
    assert fault.get("code") == "3201", fault
    for keys in (
        {"destination": "private-q", "type": "QUEUE"},
        {"destination": "private@/a", "type": "VIRTUAL_QUEUE"},
    ):
        fault = await client.call("asbp.subscribe", **keys)
        assert fault.get("code") == "3201", fault
    fault = await client.call("asbp.poll", destination="private-q")
    assert fault.get("code") == "3201", fault


async def test_a_pattern_subscription_is_checked_per_topic_delivered(guarded: Gateway) -> None:
    subscriber = await user(guarded)
    trusted = Messenger.of(await guarded.tube("billing"))
    # The pattern is accepted: its text is no destination the policy could judge.
    await subscriber.subscribe("/(?:secret|open)/.*")
    await trusted.subscribe("/(?:secret|open)/.*")

    await trusted.publish("/secret/plans", b"hidden")
    await trusted.publish("/open/news", b"visible")

    # The trusted agent reads both; the User-Agent only what it may read.
    assert (await trusted.notification()).get("destination") == "/secret/plans"
    assert (await trusted.notification()).get("destination") == "/open/news"
    assert (await subscriber.notification()).get("destination") == "/open/news"
    assert subscriber.pending() == []


async def test_writing_under_system_is_denied_by_default(guarded: Gateway) -> None:
    client = await user(guarded)
    fault = await client.call("asbp.publish", destination=f"/system/faults/{BROKER_ID}")
    assert fault.get("code") == "3201", fault
    fault = await client.call("asbp.publish", destination="/system/x", type="QUEUE")
    assert fault.get("code") == "3201", fault
    # Reading /system/ is allowed, for monitoring.
    await client.subscribe("/system/.*")


ROLE_POLICY = """
[security]
[security.roles]
vip = "vip"

[security.policies.vip]

[[security.policies.default.entries]]
action = "DENY"
types = ["TOPIC"]
destination = '/vip/.*'
privileges = ["READ", "WRITE"]
condition = { always = true }
"""


async def test_a_subjects_roles_decide_with_s(
    redis: RedisServers, make_gateway: GatewayFactory, engine: str
) -> None:
    from tests.support.gateway import AGENTS

    agents = {i: {"public_key": f"{i}.pem", "serves": [r"auth\.login"]} for i in AGENTS}
    gateway = await start_broker(
        make_gateway,
        engine,
        redis,
        acl=security(ROLE_POLICY),
        agents=agents,
        authenticate_command="auth.login",
    )
    authenticator = await gateway.tube("billing", serves=("auth.login",))
    peer = await gateway.channel()
    client = Messenger.of(peer)
    await peer.send(Command({"c": "auth.login", "u": 1}, b"alice"))
    login = await authenticator.recv()
    assert login.subject_id is not None
    await authenticator.send(Command(c="asbp.authenticated", s=login.subject_id, roles=["vip"]))
    subject = (await client.take("asbp.authenticated")).subject_id
    assert subject is not None

    # Without s the Channel's own access applies (the default policy); with s, the
    # Subject's role picks the vip policy.
    assert (await client.call("asbp.subscribe", destination="/vip/lounge")).get("code") == "3201"
    await client.subscribe("/vip/lounge", s=subject)
    await client.publish("/vip/lounge", b"welcome", s=subject)
    assert (await client.notification()).body == b"welcome"
    # Another Channel's (or an unknown) s is refused.
    other = await user(gateway)
    fault = await other.call("asbp.publish", destination="/vip/lounge", s=subject)
    assert fault.get("code") == "3201", fault

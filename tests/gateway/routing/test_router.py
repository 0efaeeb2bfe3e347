"""Where Commands go (draft §2.4, and the routing spec in gateway/routing/router.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from asbp import Command
from gateway.broker import Broker
from gateway.config.model import ChannelLimits, TubeLimits
from tests.support import T
from tests.support.gateway import BROKER_ID, Gateway, GatewayFactory, Peer, assert_fault, decode

pytestmark = pytest.mark.anyio


async def answer(agent: Peer, request: Command, body: bytes | None = None) -> None:
    """Answer ``request`` the way a Respondent does: ``d`` = its Channel, same ``u``."""
    header = {"c": request.name or "", "d": request.channel_id or ""}
    if request.command_id is not None:
        header["u"] = str(request.command_id)
    await agent.send(Command(header, request.body if body is None else body))


# --------------------------------------------------------------------------
# User-Agent → Application-Agent → User-Agent


async def test_user_agent_command_reaches_the_respondent(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("echo",))
    user = await gateway.channel()
    await user.send(Command({"c": "echo", "u": 3, "a": "billing", "x": "custom"}, b"body"))
    forwarded = await agent.recv()
    # i and b added, a (a User-Agent never speaks for an agent) removed, the rest kept.
    assert forwarded == Command(
        {"c": "echo", "u": 3, "x": "custom", "i": user.id, "b": BROKER_ID}, b"body"
    )


async def test_user_agents_d_and_g_are_not_routing_keys(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("echo",))
    user, other = await gateway.channel(), await gateway.channel()
    await agent.request(Command(c="asbp.join", groups="room", channels=other.id, u=1))
    await user.send(Command(c="echo", d=other.id, g="room", u=4))
    forwarded = await agent.recv()
    assert (forwarded.get("d"), forwarded.get("g")) == (other.id, "room")
    # Nothing reached the other Channel: its next Command is the answer to its own ping.
    assert (await other.request(Command(c="asbp.ping", u=5))).name == "asbp.pong"


async def test_agent_reply_reaches_the_channel_with_its_verified_a(gateway: Gateway) -> None:
    agent = await gateway.tube("search", serves=("echo",))
    user = await gateway.channel()
    await user.send(Command({"c": "echo", "u": 3}, b"ping"))
    request = await agent.recv()
    await agent.send(Command({"c": "echo.reply", "d": user.id, "u": 3, "a": "billing"}, b"pong"))
    # d removed (Channel-Identifiers never leak), a set to the verified identity.
    assert await user.recv() == Command({"c": "echo.reply", "u": 3, "a": "search"}, b"pong")
    assert request.channel_id == user.id


async def test_d_delivers_to_each_channel_once(gateway: Gateway) -> None:
    agent = await gateway.tube()
    first, second = await gateway.channel(), await gateway.channel()
    await agent.send(Command({"c": "news", "d": [first.id, second.id, first.id]}, b"n"))
    expected = Command({"c": "news", "a": "billing"}, b"n")
    assert await first.recv() == expected
    assert await second.recv() == expected
    assert (await first.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


async def test_d_to_an_unknown_channel_faults_2104_and_the_rest_still_get_it(
    gateway: Gateway,
) -> None:
    agent = await gateway.tube()
    user = await gateway.channel()
    await agent.send(Command({"c": "news", "d": ["0" * 32, user.id], "u": 6}, b"n"))
    fault = await agent.recv()
    assert_fault(fault, 2104, u=6)
    assert b"0" * 32 in fault.body
    assert (await user.recv()).name == "news"


# --------------------------------------------------------------------------
# Groups


async def test_g_delivers_to_every_channel_in_the_group(gateway: Gateway) -> None:
    agent = await gateway.tube()
    users = [await gateway.channel() for _ in range(3)]
    http_user = await gateway.http_channel()
    members = [users[0].id, users[1].id, http_user.id]
    accepted = await agent.request(
        Command(c="asbp.join", groups=["room", "lobby"], channels=members, u=11)
    )
    assert accepted == Command(c="asbp.accepted", cause="asbp.join", u=11)

    # g and d overlap: still once each.
    await agent.send(Command({"c": "say", "g": ["room", "lobby"], "d": users[0].id}, b"hi"))
    expected = Command({"c": "say", "a": "billing", "g": ["room", "lobby"]}, b"hi")
    assert await users[0].recv() == expected
    assert await users[1].recv() == expected
    assert await http_user.poll() == [(1, expected)]
    # Not a member: gets nothing (its next Command is its own pong).
    assert (await users[2].request(Command(c="asbp.ping", u=1))).name == "asbp.pong"
    assert (await users[0].request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


async def test_leave_removes_from_the_group(gateway: Gateway) -> None:
    agent = await gateway.tube()
    stays, leaves = await gateway.channel(), await gateway.channel()
    await agent.request(Command(c="asbp.join", groups="room", channels=[stays.id, leaves.id]))
    accepted = await agent.request(
        Command(c="asbp.leave", groups="room", channels=[leaves.id, "0" * 32], u=12)
    )  # unknown Channels are ignored on leave
    assert accepted == Command(c="asbp.accepted", cause="asbp.leave", u=12)
    await agent.send(Command(c="say", g="room"))
    assert (await stays.recv()).name == "say"
    assert (await leaves.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


async def test_join_is_all_or_nothing(gateway: Gateway) -> None:
    agent = await gateway.tube()
    user = await gateway.channel()
    fault = await agent.request(
        Command(c="asbp.join", groups="room", channels=[user.id, "0" * 32], u=13)
    )
    assert_fault(fault, 2104, u=13)
    await agent.send(Command(c="say", g="room", u=14))
    assert (await user.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"


@pytest.mark.parametrize(
    "command",
    [
        Command(c="asbp.join", groups="room", u=15),
        Command(c="asbp.join", channels="0" * 32, u=15),
        Command(c="asbp.leave", u=15),
    ],
)
async def test_join_and_leave_need_groups_and_channels(gateway: Gateway, command: Command) -> None:
    agent = await gateway.tube()
    assert_fault(await agent.request(command), 1203, u=15)


async def test_a_closed_channel_leaves_every_group(gateway: Gateway) -> None:
    agent = await gateway.tube()
    stays, goes = await gateway.channel(), await gateway.channel()
    await agent.request(Command(c="asbp.join", groups=["a", "b"], channels=[stays.id, goes.id]))
    await agent.request(Command(c="asbp.join", groups="only-goes", channels=goes.id))
    await goes.close()
    await gateway.events.wait("channel.close", channel=goes.id)

    def membership(broker: Broker) -> dict[str, list[str]]:
        channels = broker.channels
        return {g: [c.id for c in channels.members([g])] for g in channels.group_names()}

    # An empty group disappears.
    assert await gateway.call(membership) == {"a": [stays.id], "b": [stays.id]}
    await agent.send(Command(c="say", g=["a", "b", "only-goes"]))
    assert (await stays.recv()).name == "say"


# --------------------------------------------------------------------------
# Application-Agent → Application-Agent


async def test_agent_command_reaches_the_agent_that_serves_it(gateway: Gateway) -> None:
    search = await gateway.tube("search", serves=("quote",))
    billing = await gateway.tube("billing")
    await billing.send(Command({"c": "quote", "u": 21, "x": "y"}, b"q"))
    assert await search.recv() == Command(
        {"c": "quote", "u": 21, "x": "y", "a": "billing", "b": BROKER_ID}, b"q"
    )


async def test_an_agent_is_never_routed_its_own_command(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("quote",))
    assert_fault(await agent.request(Command(c="quote", u=22)), 2101, u=22)


async def test_agent_command_without_c_d_or_g_faults_1201(gateway: Gateway) -> None:
    agent = await gateway.tube()
    assert_fault(await agent.request(Command(u=23, x="y")), 1201, u=23)


# --------------------------------------------------------------------------
# No answer: never silence


async def test_no_respondent_faults_2101(gateway: Gateway) -> None:
    user = await gateway.channel()
    fault = await user.request(Command(c="quote", u=31))
    assert_fault(fault, 2101, u=31)
    assert fault.get("cause") == "quote"
    agent = await gateway.tube()
    assert_fault(await agent.request(Command(c="quote", u=32)), 2101, u=32)


async def test_subject_identifier_from_a_user_agent_faults_3201(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("quote",))
    user = await gateway.channel()
    fault = await user.request(Command(c="quote", s="f" * 32, u=33))
    assert_fault(fault, 3201, u=33)
    assert fault.get("cause") == "quote"
    # The Respondent never saw it: the next Command it gets is the next one sent.
    await user.send(Command(c="quote", u=34))
    assert (await agent.recv()).get("u") == "34"


async def test_agent_that_leaves_faults_2102_to_every_waiting_user_agent(
    gateway: Gateway,
) -> None:
    agent = await gateway.tube(serves=("slow",))
    bystander = await gateway.tube("search", serves=("other",))
    first, second = await gateway.channel(), await gateway.channel()
    http_user = await gateway.http_channel()
    await first.send(Command(c="slow", u=1))
    await first.send(Command(c="slow", u=2))
    await first.send(Command(c="slow"))  # no u: not in flight, nothing to fault
    await second.send(Command(c="slow", u=1))
    await http_user.post(Command(c="slow", i=http_user.id, u=7))
    await first.send(Command(c="other", u=3))  # another agent's: unaffected
    answered = Command(c="slow", u=4)
    await second.send(answered)
    received = [await agent.recv() for _ in range(6)]
    await answer(agent, received[-1])
    assert (await second.recv()).get("u") == "4"
    assert (await bystander.recv()).get("u") == "3"

    await agent.close()
    first_faults = [await first.recv(), await first.recv()]
    for fault, u in zip(first_faults, (1, 2), strict=True):
        assert_fault(fault, 2102, u=u)
        assert fault.get("cause") == "slow"
    assert_fault(await second.recv(), 2102, u=1)
    [(_, fault)] = await http_user.poll()
    assert_fault(fault, 2102, u=7)
    # Nothing else: the next Commands are the pongs.
    for user in (first, second):
        assert (await user.request(Command(c="asbp.ping", u=9))).name == "asbp.pong"


async def test_only_the_same_application_agent_can_answer(gateway: Gateway) -> None:
    # Answers are matched to the Application-Agent, not to the Tube: a sibling Tube of
    # the same identity may answer, another identity's Command to the Channel does not.
    first = await gateway.tube("billing", serves=("work",))
    sibling = await gateway.tube("billing")
    stranger = await gateway.tube("search")
    user = await gateway.channel()
    await user.send(Command(c="work", u=1))
    await user.send(Command(c="work", u=2))
    one, two = await first.recv(), await first.recv()
    await answer(sibling, one)
    await answer(stranger, two)
    assert (await user.recv()).get("a") == "billing"
    assert (await user.recv()).get("a") == "search"  # delivered, but no answer to u=2
    await first.close()
    assert_fault(await user.recv(), 2102, u=2)
    assert (await user.request(Command(c="asbp.ping", u=9))).name == "asbp.pong"


async def test_reusing_a_u_in_flight_replaces_the_older_command(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("work",))
    user = await gateway.channel()
    await user.send(Command({"c": "work", "u": 1}, b"old"))
    await user.send(Command({"c": "work", "u": 1}, b"new"))
    assert [(await agent.recv()).body for _ in range(2)] == [b"old", b"new"]
    await agent.close()
    assert_fault(await user.recv(), 2102, u=1)  # once, not twice
    assert (await user.request(Command(c="asbp.ping", u=9))).name == "asbp.pong"


async def test_respondent_timeout_faults_2103(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(tubes=TubeLimits(respondent_timeout=0.2 * T))
    agent = await gateway.tube(serves=("slow",))
    user = await gateway.channel()
    await user.send(Command(c="slow", u=41))
    assert (await agent.recv()).get("u") == "41"
    fault = await user.recv()  # within the 5 T of recv(): housekeeping ticks every 0.05 T
    assert_fault(fault, 2103, u=41)
    assert fault.get("cause") == "slow"


async def test_a_stream_answer_ends_at_its_last_part(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("stream",))
    user = await gateway.channel()
    await user.send(Command(c="stream", u=1))
    await user.send(Command(c="stream", u=2))
    first, second = await agent.recv(), await agent.recv()
    for part in (1, 2):  # u=1: complete
        await agent.send(Command(c="part", d=user.id, u=1, o=part, t=2))
    await agent.send(Command(c="part", d=user.id, u=2, o=1, t=2))  # u=2: half done
    for _ in range(3):
        assert (await user.recv()).name == "part"
    assert (first.get("u"), second.get("u")) == ("1", "2")
    await agent.close()
    # Only the unfinished one was still in flight.
    assert_fault(await user.recv(), 2102, u=2)
    assert (await user.request(Command(c="asbp.ping", u=9))).name == "asbp.pong"


async def test_too_many_in_flight_faults_2106(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(channels=ChannelLimits(max_in_flight=2))
    agent = await gateway.tube(serves=("slow",))
    user = await gateway.channel()
    await user.send(Command(c="slow", u=1))
    await user.send(Command(c="slow", u=2))
    assert_fault(await user.request(Command(c="slow", u=3)), 2106, u=3)
    first = await agent.recv()
    await answer(agent, first)
    assert (await user.recv()).get("u") == "1"
    await user.send(Command(c="slow", u=3))  # room again
    assert [(await agent.recv()).get("u") for _ in range(2)] == ["2", "3"]


# --------------------------------------------------------------------------
# Balancing among the Tubes of one Application-Agent


async def test_tubes_are_balanced_by_fewest_in_flight(gateway: Gateway) -> None:
    # Two Tubes of one identity serve "work"; "stuck" (registered first) never answers,
    # "busy" answers at once. Sent one at a time, the first request goes to stuck (a
    # tie goes to the Tube registered longest) and every later one to busy, which
    # always has fewer in flight.
    stuck = await gateway.tube("billing", serves=("work",))
    busy = await gateway.tube("billing", serves=("work",))
    user = await gateway.channel()
    loop = asyncio.get_running_loop()
    who: dict[int, asyncio.Future[str]] = {}

    async def record(agent: Peer, name: str) -> None:
        while True:
            decoded = decode(await agent.ws.recv())
            u = decoded.command_id
            assert u is not None
            if name == "busy":
                await answer(agent, decoded)
            else:
                who[u].set_result(name)

    async def replies() -> None:
        while True:
            decoded = decode(await user.ws.recv())
            assert decoded.name == "work", decoded
            u = decoded.command_id
            assert u is not None
            who[u].set_result("busy")

    tasks = [
        asyncio.create_task(record(stuck, "stuck")),
        asyncio.create_task(record(busy, "busy")),
        asyncio.create_task(replies()),
    ]
    try:
        for u in range(1, 11):
            who[u] = loop.create_future()
            await user.send(Command(c="work", u=u))
            await asyncio.wait_for(asyncio.shield(who[u]), 5 * T)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert [who[u].result() for u in range(1, 11)] == ["stuck"] + ["busy"] * 9


async def test_silent_tubes_share_the_load_and_each_strands_only_its_own(
    gateway: Gateway,
) -> None:
    first = await gateway.tube("billing", serves=("work",))
    second = await gateway.tube("billing", serves=("work",))
    user = await gateway.channel()
    for u in range(1, 7):
        await user.send(Command(c="work", u=u))
    got_first = [(await first.recv()).command_id for _ in range(3)]
    got_second = [(await second.recv()).command_id for _ in range(3)]
    # Fewest in flight, ties to the Tube registered longest: they alternate.
    assert (got_first, got_second) == ([1, 3, 5], [2, 4, 6])

    await first.close()
    faults = [await user.recv() for _ in range(3)]
    assert sorted(f.command_id or 0 for f in faults) == [1, 3, 5]
    for fault in faults:
        assert_fault(fault, 2102, u=fault.command_id)
    # The second Tube's are still in flight and it can still answer them.
    await answer(second, Command(c="work", i=user.id, u=2))
    assert (await user.recv()).command_id == 2


# --------------------------------------------------------------------------
# The broker's own Commands


async def test_ping_and_commands_for_user_agents(gateway: Gateway) -> None:
    await gateway.tube(serves=("quote", "order"))
    await gateway.tube("search", serves=("find",))
    user = await gateway.channel()
    assert await user.request(Command({"c": "asbp.ping", "u": 1}, b"echo me")) == Command(
        {"c": "asbp.pong", "u": 1}, b"echo me"
    )
    commands = await user.request(Command(c="asbp.commands", u=2))
    assert (commands.name, commands.get("m"), commands.get("u")) == (
        "asbp.commands",
        "application/json",
        "2",
    )
    assert json.loads(commands.body) == [
        "asbp.ack",
        "asbp.commands",
        "asbp.ping",
        "asbp.poll",
        "asbp.publish",
        "asbp.subscribe",
        "asbp.unsubscribe",
        "find",
        "order",
        "quote",
    ]


async def test_ping_and_commands_for_agents(gateway: Gateway) -> None:
    agent = await gateway.tube(serves=("quote",))
    assert await agent.request(Command({"c": "asbp.ping", "u": 3}, b"x")) == Command(
        {"c": "asbp.pong", "u": 3}, b"x"
    )
    commands = await agent.request(Command(c="asbp.commands", u=4))
    assert commands.get("u") == "4"
    assert json.loads(commands.body) == [
        "asbp.ack",
        "asbp.commands",
        "asbp.join",
        "asbp.leave",
        "asbp.ping",
        "asbp.poll",
        "asbp.publish",
        "asbp.register",
        "asbp.subscribe",
        "asbp.unregister",
        "asbp.unsubscribe",
        "quote",
    ]


async def test_user_agents_cannot_use_agent_built_ins(gateway: Gateway) -> None:
    user = await gateway.channel()
    for name in ("asbp.register", "asbp.join"):
        assert_fault(await user.request(Command(c=name, names="x", u=5)), 2101, u=5)

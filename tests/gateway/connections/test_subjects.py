"""Subjects (§7.3): several signed-in accounts per Channel, end to end.

Two authenticating agents: ``billing`` accepts alice and refuses everyone else,
``search`` accepts bob. Each also serves ``orders``, so an Authenticated-Command
shows which agent the broker chose.
"""

from __future__ import annotations

from typing import Any

import pytest

from asbp import Command
from tests.support.gateway import AGENTS, Gateway, GatewayFactory, Peer, assert_fault

pytestmark = pytest.mark.anyio

LOGIN = "auth.login"


async def _gateway(make_gateway: GatewayFactory, **overrides: Any) -> Gateway:
    agents = {i: {"public_key": f"{i}.pem", "serves": [r"auth\.login", "orders"]} for i in AGENTS}
    overrides.setdefault("agents", agents)
    return await make_gateway(authenticate_command=LOGIN, **overrides)


async def _authenticator(gateway: Gateway, identity: str, user: str) -> Peer:
    return await gateway.tube(identity, serves=(LOGIN, "orders"))


async def _answer_login(agent: Peer, user: str) -> Command:
    """Read the next Authenticate-Command and accept ``user``, refusing anyone else."""
    request = await agent.recv()
    assert request.name == LOGIN
    assert request.subject_id is not None and request.channel_id is not None
    if request.body == user.encode():
        await agent.send(
            Command(c="asbp.authenticated", s=request.subject_id, roles=[f"{user}-role"], u=1)
        )
    else:
        await agent.send(Command({"c": "asbp.refused", "s": request.subject_id}, b"unknown user"))
    return request


async def _sign_in(ua: Peer, billing: Peer, search: Peer, user: str, u: int) -> Command:
    await ua.send(Command({"c": LOGIN, "u": u}, user.encode()))
    for agent, name in ((billing, "alice"), (search, "bob")):
        await _answer_login(agent, name)
        if agent is (billing if user == "alice" else search):
            ack = await agent.recv()
            assert (ack.name, ack.command_id) == ("asbp.accepted", 1)
    return await ua.recv()


async def test_two_subjects_on_one_channel_each_reach_only_their_agents(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await _gateway(make_gateway)
    billing = await _authenticator(gateway, "billing", "alice")
    search = await _authenticator(gateway, "search", "bob")
    ua = await gateway.channel()

    alice = await _sign_in(ua, billing, search, "alice", 1)
    assert (alice.name, alice.command_id, alice.agent_id) == ("asbp.authenticated", 1, "billing")
    assert alice.get("roles") == ("alice-role",)
    bob = await _sign_in(ua, billing, search, "bob", 2)
    assert (bob.name, bob.command_id, bob.agent_id) == ("asbp.authenticated", 2, "search")
    assert alice.subject_id != bob.subject_id

    for _ in range(3):  # balancing never sends a Subject's Command to the other agent
        await ua.send(Command(c="orders", s=alice.subject_id, u=10))
        got = await billing.recv()
        assert (got.name, got.subject_id, got.channel_id) == ("orders", alice.subject_id, ua.id)
        await billing.send(Command(c="orders.reply", d=ua.id, u=10))
        assert (await ua.recv()).agent_id == "billing"
        await ua.send(Command(c="orders", s=bob.subject_id, u=11))
        got = await search.recv()
        assert (got.name, got.subject_id) == ("orders", bob.subject_id)
        await search.send(Command(c="orders.reply", d=ua.id, u=11))
        assert (await ua.recv()).agent_id == "search"


async def test_a_subject_of_another_channel_is_refused(make_gateway: GatewayFactory) -> None:
    gateway = await _gateway(make_gateway)
    billing = await _authenticator(gateway, "billing", "alice")
    search = await _authenticator(gateway, "search", "bob")
    owner = await gateway.channel()
    alice = await _sign_in(owner, billing, search, "alice", 1)
    thief = await gateway.channel()
    assert_fault(await thief.request(Command(c="orders", s=alice.subject_id, u=5)), 3201, u=5)
    assert_fault(await thief.request(Command(c="asbp.logout", s=alice.subject_id, u=6)), 3201, u=6)
    # An unknown Subject-Identifier is refused the same way.
    assert_fault(await thief.request(Command(c="orders", s="ab" * 16, u=7)), 3201, u=7)


async def test_every_agent_refusing_is_fault_3101_with_the_reasons(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await _gateway(make_gateway)
    billing = await _authenticator(gateway, "billing", "alice")
    search = await _authenticator(gateway, "search", "bob")
    ua = await gateway.channel()
    await ua.send(Command({"c": LOGIN, "u": 3}, b"mallory"))
    await _answer_login(billing, "alice")
    await _answer_login(search, "bob")
    fault = await ua.recv()
    assert_fault(fault, 3101, u=3)
    assert b"unknown user" in fault.body


async def test_logout_and_channel_close_end_subjects_and_tell_the_agents(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await _gateway(make_gateway)
    billing = await _authenticator(gateway, "billing", "alice")
    search = await _authenticator(gateway, "search", "bob")
    ua = await gateway.channel()
    alice = await _sign_in(ua, billing, search, "alice", 1)

    accepted = await ua.request(Command(c="asbp.logout", s=alice.subject_id, u=4))
    assert (accepted.name, accepted.command_id) == ("asbp.accepted", 4)
    ended = await billing.recv()
    assert (ended.name, ended.subject_id) == ("asbp.subject.ended", alice.subject_id)
    assert_fault(await ua.request(Command(c="orders", s=alice.subject_id, u=5)), 3201, u=5)

    bob = await _sign_in(ua, billing, search, "bob", 2)
    await ua.close()
    ended = await search.recv()
    assert (ended.name, ended.subject_id) == ("asbp.subject.ended", bob.subject_id)


async def test_an_agent_not_allowed_never_sees_credentials(make_gateway: GatewayFactory) -> None:
    agents = {
        "billing": {"public_key": "billing.pem", "serves": [r"auth\.login"]},
        "search": {"public_key": "search.pem"},  # no allow-list: anything but auth.login
    }
    gateway = await _gateway(make_gateway, agents=agents)
    spoof = await gateway.tube("search")
    refused = await spoof.request(Command(c="asbp.register", names=[LOGIN, "orders"], u=9))
    assert_fault(refused, 3201, u=9)
    await gateway.events.wait("tube.register_refused")
    # Nothing was registered: the User-Agent's credentials find no Respondent...
    ua = await gateway.channel()
    assert_fault(await ua.request(Command({"c": LOGIN, "u": 1}, b"secret")), 2101, u=1)
    # ...until the trusted agent registers, and it alone gets them.
    billing = await gateway.tube("billing", serves=(LOGIN,))
    await ua.send(Command({"c": LOGIN, "u": 2}, b"secret"))
    request = await billing.recv()
    assert (request.name, request.body) == (LOGIN, b"secret")
    assert (await spoof.request(Command(c="asbp.ping", u=3))).name == "asbp.pong"


async def test_an_answer_from_an_agent_not_asked_is_refused(make_gateway: GatewayFactory) -> None:
    agents = {
        "billing": {"public_key": "billing.pem", "serves": [r"auth\.login"]},
        "search": {"public_key": "search.pem"},
    }
    gateway = await _gateway(make_gateway, agents=agents)
    billing = await gateway.tube("billing", serves=(LOGIN,))
    search = await gateway.tube("search")
    ua = await gateway.channel()
    await ua.send(Command({"c": LOGIN, "u": 1}, b"alice"))
    request = await billing.recv()
    forged = Command(c="asbp.authenticated", s=request.subject_id, roles=["admin"], u=5)
    assert_fault(await search.request(forged), 3201, u=5)


async def test_a_stateless_http_user_agent_sends_i_and_s(make_gateway: GatewayFactory) -> None:
    gateway = await _gateway(make_gateway)
    billing = await _authenticator(gateway, "billing", "alice")
    search = await _authenticator(gateway, "search", "bob")
    http = await gateway.http_channel()
    status, _ = await http.post(Command({"c": LOGIN, "i": http.id, "u": 1}, b"alice"))
    assert status == 200
    await _answer_login(billing, "alice")
    assert (await billing.recv()).name == "asbp.accepted"
    await _answer_login(search, "bob")
    ((_, answer),) = await http.poll()
    assert (answer.name, answer.command_id) == ("asbp.authenticated", 1)
    status, _ = await http.post(Command(c="orders", i=http.id, s=answer.subject_id, u=2))
    assert status == 200
    got = await billing.recv()
    assert (got.subject_id, got.channel_id, got.command_id) == (answer.subject_id, http.id, 2)


async def test_no_answer_is_fault_2103(make_gateway: GatewayFactory) -> None:
    gateway = await _gateway(make_gateway)
    billing = await _authenticator(gateway, "billing", "alice")
    ua = await gateway.channel()
    await ua.send(Command({"c": LOGIN, "u": 8}, b"alice"))
    assert (await billing.recv()).name == LOGIN

    def expire_all(broker: Any) -> int:
        # As the housekeeping tick would, once the deadline has passed.
        return int(broker.router.auth.expire(now=float("inf")))

    assert await gateway.call(expire_all) == 1
    assert_fault(await ua.recv(), 2103, u=8)

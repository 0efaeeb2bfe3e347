"""The access-control lists, wired into routing: COMMAND entries decide what
User-Agents, Subjects (by their roles) and Application-Agents may send and serve."""

from __future__ import annotations

import pytest

from asbp import Command
from gateway.acl import load_acl
from tests.support.gateway import GatewayFactory, assert_fault

pytestmark = pytest.mark.anyio

POLICY = """
# Only a Subject with the admin role may send admin.* Commands.
[[security.policies.default.entries]]
action = "PERMIT"
types = ["COMMAND"]
destination = 'admin\\..*'
privileges = ["WRITE"]
condition = { role = "admin" }

[[security.policies.default.entries]]
action = "DENY"
types = ["COMMAND"]
destination = 'admin\\..*'
privileges = ["WRITE"]
condition = { always = true }

# An agent under this policy may not serve admin.* Commands.
[security.policies.read_only_agent]
inherits = "default"

[[security.policies.read_only_agent.entries]]
action = "DENY"
types = ["COMMAND"]
destination = 'admin\\..*'
privileges = ["READ"]
condition = { always = true }

[security.agents]
search = "read_only_agent"
"""


async def test_commands_are_allowed_by_role_and_serving_by_policy(
    make_gateway: GatewayFactory,
) -> None:
    agents = {
        "billing": {"public_key": "billing.pem", "serves": [r"auth\.login", r"admin\..*"]},
        "search": {"public_key": "search.pem"},
    }
    gateway = await make_gateway(
        agents=agents, authenticate_command="auth.login", acl=load_acl(POLICY)
    )
    # search's policy denies serving admin.*: the whole registration is refused.
    search = await gateway.tube("search")
    refused = await search.request(Command(c="asbp.register", names=["find", "admin.purge"], u=1))
    assert_fault(refused, 3201, u=1)
    await gateway.events.wait("acl.denied", command="admin.purge")

    billing = await gateway.tube("billing", serves=("auth.login", "admin.purge"))
    ua = await gateway.channel()
    # Anonymous: denied before any agent sees it.
    assert_fault(await ua.request(Command(c="admin.purge", u=2)), 3201, u=2)

    await ua.send(Command({"c": "auth.login", "u": 3}, b"root"))
    login = await billing.recv()
    await billing.send(Command(c="asbp.authenticated", s=login.subject_id, roles=["admin"]))
    signed_in = await ua.recv()
    assert (signed_in.name, signed_in.get("roles")) == ("asbp.authenticated", ("admin",))

    await ua.send(Command(c="admin.purge", s=signed_in.subject_id, u=4))
    got = await billing.recv()
    assert (got.name, got.subject_id, got.command_id) == ("admin.purge", signed_in.subject_id, 4)


async def test_an_agent_may_be_denied_sending_a_command(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(acl=load_acl(POLICY))
    billing = await gateway.tube("billing")
    ua = await gateway.channel()
    denied = await billing.request(Command(c="admin.broadcast", d=ua.id, u=5))
    assert_fault(denied, 3201, u=5)
    allowed = Command(c="news", d=ua.id)
    await billing.send(allowed)
    assert (await ua.recv()).name == "news"

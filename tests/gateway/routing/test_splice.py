"""The router's splices (adding i/b, or a, and removing d, in the frame's own
bytes) must give exactly the Command that rebuilding and encoding gives."""

from __future__ import annotations

import logging

import hypothesis.strategies as st
from hypothesis import given

import asbp
from asbp import ApplicationAgentId, Command
from gateway.config.model import ChannelLimits, TubeLimits
from gateway.connections.channels import ChannelKind, ChannelRegistry
from gateway.connections.outboxes import StreamOutbox
from gateway.connections.tubes import RespondentTable, Tube
from gateway.routing.router import Router
from gateway.routing.splice import without_pair as _without_pair
from tests.support.strategies import commands, uuid_hex


def _router(limits: asbp.Limits = asbp.DEFAULT_LIMITS) -> Router:
    return Router(
        broker_id="broker-1",
        channels=ChannelRegistry(),
        respondents=RespondentTable(),
        limits=limits,
        channel_limits=ChannelLimits(),
        tube_limits=TubeLimits(),
        log=logging.getLogger("test.splice"),
    )


ROUTER = _router()
CHANNEL = ROUTER.channels.open(ChannelKind.WEBSOCKET, StreamOutbox(10, 10_000))


def _tube(identity: str) -> Tube:
    return Tube(ApplicationAgentId(identity), StreamOutbox(10, 10_000))


@given(commands())
def test_adding_i_and_b_by_splice_equals_rebuilding(command: Command) -> None:
    frame = asbp.encode(command)
    spliced = ROUTER._from_channel(CHANNEL, command, frame)
    rebuilt = ROUTER._from_channel(CHANNEL, command, None)
    assert spliced is not None and rebuilt is not None
    assert asbp.decode(spliced) == asbp.decode(rebuilt)
    assert asbp.decode(spliced).channel_id == CHANNEL.id


@given(
    commands(),
    st.one_of(st.none(), uuid_hex, st.lists(uuid_hex, min_size=1, max_size=3)),
    st.sampled_from(["echo", "billing.v2", "team agent", "grüße"]),
)
def test_setting_a_and_dropping_d_by_splice_equals_rebuilding(
    command: Command, destinations: str | list[str] | None, identity: str
) -> None:
    if destinations is not None:
        command = command.with_keys(d=destinations)
    tube = _tube(identity)
    frame = asbp.encode(command)
    spliced = ROUTER._to_user_agents(tube, command, frame)
    rebuilt = ROUTER._to_user_agents(tube, command, None)
    assert spliced is not None and rebuilt is not None
    assert asbp.decode(spliced) == asbp.decode(rebuilt)
    assert "d" not in asbp.decode(spliced)
    assert asbp.decode(spliced).agent_id == identity


def test_without_pair_keeps_the_other_pairs() -> None:
    assert _without_pair(b"d=x,c=y", b"d") == b"c=y"
    assert _without_pair(b"c=y,d=[x,z],u=1", b"d") == b"c=y,u=1"
    assert _without_pair(b"c=y,d=x", b"d") == b"c=y"
    assert _without_pair(b"d=x", b"d") == b""
    assert _without_pair(b"c=y", b"d") is None


def test_a_header_with_no_room_for_the_broker_keys_is_a_fault() -> None:
    limits = asbp.Limits(max_header_bytes=64)
    router = _router(limits)
    channel = router.channels.open(ChannelKind.WEBSOCKET, StreamOutbox(10, 10_000))
    outbox = channel.outbox
    assert isinstance(outbox, StreamOutbox)
    command = Command(c="x" * 40, u=5)
    assert router._from_channel(channel, command, asbp.encode(command)) is None
    (fault,) = [asbp.decode(f) for f in outbox._frames]
    assert (fault.name, fault.get("code"), fault.command_id) == ("asbp.fault", "1104", 5)

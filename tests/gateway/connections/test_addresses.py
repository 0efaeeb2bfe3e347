"""Limits per client address: open Channels, and HTTP Channels opened per second.

The limiter on its own with a clock of our own (no sleeping), then the broker on
each server: past the count, a WebSocket Channel gets fault 2108 and close 1008,
an HTTP POST ``429`` and fault 2108; WebSocket and HTTP Channels count together;
closing one frees its place; the open rate answers ``429`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.exceptions import ConnectionClosed

from asbp import Command, FaultCode
from gateway.config.model import ChannelLimits
from gateway.connections.addresses import AddressLimits, TooManyChannels
from gateway.connections.channels import ChannelKind, ChannelRegistry
from gateway.connections.outboxes import StreamOutbox
from tests.support import ServerName, T
from tests.support.gateway import SERVERS, GatewayFactory, HttpChannel, assert_fault, decode

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits(
    *, max_per_address: int = 3, http_opens_per_second: int = 2, max_addresses: int = 100
) -> tuple[AddressLimits, ChannelRegistry, Clock]:
    registry = ChannelRegistry()
    clock = Clock()
    limiter = AddressLimits(
        registry,
        max_per_address=max_per_address,
        http_opens_per_second=http_opens_per_second,
        clock=clock,
        max_addresses=max_addresses,
    )
    return limiter, registry, clock


def open_one(
    limiter: AddressLimits, registry: ChannelRegistry, address: str, *, http: bool
) -> None:
    key = limiter.admit(address, http=http)
    registry.open(
        ChannelKind.HTTP if http else ChannelKind.WEBSOCKET, StreamOutbox(4, 4096), address_key=key
    )


def test_open_channels_are_counted_per_address_and_freed_on_close() -> None:
    limiter, registry, _ = limits(http_opens_per_second=0)
    for _ in range(3):
        open_one(limiter, registry, "192.0.2.1", http=False)
    with pytest.raises(TooManyChannels) as refused:
        limiter.admit("192.0.2.1", http=True)
    assert refused.value.code is FaultCode.TOO_MANY_CHANNELS
    assert refused.value.retry_after is None
    # Another address is not affected; an IPv4-mapped address is the same one.
    assert limiter.admit("192.0.2.2", http=False) == "192.0.2.2"
    with pytest.raises(TooManyChannels):
        limiter.admit("::ffff:192.0.2.1", http=False)
    registry.close(next(iter(registry)))
    assert registry.held_by("192.0.2.1") == 2
    assert limiter.admit("192.0.2.1", http=False) == "192.0.2.1"
    for channel in registry:
        registry.close(channel)
    assert registry.held_by("192.0.2.1") == 0


def test_ipv6_is_counted_per_64() -> None:
    limiter, registry, _ = limits(max_per_address=2, http_opens_per_second=0)
    open_one(limiter, registry, "2001:db8:1:2::1", http=False)
    open_one(limiter, registry, "2001:db8:1:2:ffff::9", http=False)
    with pytest.raises(TooManyChannels):
        limiter.admit("2001:db8:1:2:aaaa::7", http=False)
    assert limiter.admit("2001:db8:1:3::1", http=False) == "2001:db8:1:3::/64"


def test_http_opens_are_a_token_bucket() -> None:
    limiter, _, clock = limits(max_per_address=0, http_opens_per_second=2)
    limiter.admit("192.0.2.1", http=True)
    limiter.admit("192.0.2.1", http=True)
    with pytest.raises(TooManyChannels) as refused:
        limiter.admit("192.0.2.1", http=True)
    assert refused.value.retry_after == 1
    limiter.admit("192.0.2.1", http=False)  # WebSocket Channels take no token
    clock.now += 0.5  # one token back
    limiter.admit("192.0.2.1", http=True)
    with pytest.raises(TooManyChannels):
        limiter.admit("192.0.2.1", http=True)
    clock.now += 10  # a full bucket again: the address is forgotten after its next open
    limiter.admit("192.0.2.1", http=True)
    assert len(limiter) == 1


def test_memory_is_bounded_and_unknown_peers_are_not_limited() -> None:
    limiter, _, _ = limits(max_per_address=1, http_opens_per_second=1, max_addresses=10)
    for n in range(100):
        limiter.admit(f"198.51.100.{n}", http=True)
    assert len(limiter) == 10
    # The least recently used was forgotten: its budget is full again.
    limiter.admit("198.51.100.0", http=True)
    assert limiter.admit(None, http=True) is None
    assert limiter.admit("", http=True) is None


def test_no_limits() -> None:
    limiter, registry, _ = limits(max_per_address=0, http_opens_per_second=0)
    for _ in range(50):
        open_one(limiter, registry, "192.0.2.1", http=True)
    assert registry.held_by("192.0.2.1") == 50


@pytest.mark.parametrize("server_name", SERVERS)
async def test_past_the_count_websocket_gets_2108_then_1008_and_http_429(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(
        server=server_name, channels=ChannelLimits(max_per_address=3, http_opens_per_second=0)
    )
    first = await gateway.channel()
    await gateway.channel()
    user = await gateway.http_channel()  # HTTP and WebSocket Channels count together

    refused = await gateway.websocket("/asbp")
    assert_fault(decode(await asyncio.wait_for(refused.recv(), 5 * T)), 2108)
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(refused.recv(), 5 * T)
    assert refused.close_code == 1008
    assert refused.close_reason == "2108 Too many Channels"

    status, fault = await HttpChannel(user.client, gateway.url).post(Command(c="asbp.ping", u=3))
    assert status == 429
    assert_fault(fault, 2108, u=3)
    # The Channels it holds keep working, and one closed frees a place.
    assert (await first.request(Command(c="asbp.ping", u=1))).name == "asbp.pong"
    finished = gateway.finished(first.ws)
    await first.close()
    await asyncio.wait_for(finished.wait(), 5 * T)
    await gateway.channel()


@pytest.mark.parametrize("server_name", SERVERS)
async def test_http_opens_past_the_rate_get_429_with_retry_after(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(
        server=server_name, channels=ChannelLimits(http_opens_per_second=2)
    )
    client = await gateway.http_client()
    await HttpChannel(client, gateway.url).open()
    await HttpChannel(client, gateway.url).open()
    response = await client.post(
        gateway.url, content=b"c=asbp.channel,u=4;", headers={"Content-Type": "application/asbp"}
    )
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert_fault(decode(response.content), 2108, u=4)
    assert "reuse the 'i'" in decode(response.content).body.decode()
    # A WebSocket Channel takes no token.
    await gateway.channel()

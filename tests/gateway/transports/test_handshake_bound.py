"""Past ``channels.max_handshakes`` handshakes in flight, a fast 503 (gateway/transports/
handshakes.py), on both servers.

The handshakes are held in flight by the test's probe (tests/support/gateway.py
``BrokerProbe.hold_websockets``): the server has parsed each upgrade request and
counted it, and the application has not answered yet, as when a broker past its
capacity falls behind. Before the bound, the next upgrade was taken and served
whatever the number waiting (a 101 here, where the test wants a 503).
"""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Final

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidStatus

from asbp import FaultCode
from gateway.transports.handshakes import STATE_KEY, HandshakeBound, busy_body, peer_gone
from tests.support import ServerName, T
from tests.support.gateway import SERVERS, Gateway, GatewayFactory, assert_fault, decode

pytestmark = pytest.mark.anyio

#: The bound in these tests.
LIMIT: Final = 3

UPGRADE: Final = (
    b"GET /asbp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


async def held_handshakes(gateway: Gateway, count: int) -> list[asyncio.Task[ClientConnection]]:
    """Start ``count`` WebSocket handshakes and return once the probe holds them all."""
    loop = asyncio.get_running_loop()
    arrived = asyncio.Event()
    seen = 0

    def on_request(scope: dict[str, object]) -> None:  # in the server's loop
        nonlocal seen
        if scope["type"] == "websocket":
            seen += 1
            if seen == count:
                loop.call_soon_threadsafe(arrived.set)

    await gateway.probe.hold_websockets(True)
    gateway.probe.on_request(on_request)
    tasks = [asyncio.create_task(gateway.websocket("/asbp")) for _ in range(count)]
    await asyncio.wait_for(arrived.wait(), 5 * T)
    gateway.probe.on_request(None)
    return tasks


async def refusal(gateway: Gateway, path: str = "/asbp") -> tuple[int, dict[str, str], bytes]:
    with pytest.raises(InvalidStatus) as info:
        await gateway.websocket(path)
    response = info.value.response
    headers = {name.lower(): value for name, value in response.headers.raw_items()}
    return response.status_code, headers, response.body or b""


def bound_of(gateway: Gateway) -> HandshakeBound:
    bound = gateway.probe.state[STATE_KEY]
    assert isinstance(bound, HandshakeBound)
    return bound


@pytest.mark.parametrize("server_name", SERVERS)
async def test_past_the_bound_a_handshake_gets_503_and_the_held_ones_go_on(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    from gateway.config.model import ChannelLimits

    gateway = await make_gateway(server=server_name, channels=ChannelLimits(max_handshakes=LIMIT))
    held = await held_handshakes(gateway, LIMIT)
    assert bound_of(gateway).in_flight == LIMIT

    # One more, to either path: refused by the server at once, with no Channel made.
    channels_before = await gateway.call(lambda broker: broker.channels.opened)
    for path in ("/asbp", "/tube"):
        status, headers, body = await refusal(gateway, path)
        assert status == 503
        assert headers["retry-after"] == "1"
        assert headers["content-type"] == "application/asbp"
        fault = decode(body)
        assert_fault(fault, int(FaultCode.BROKER_BUSY))
        assert f"serving {LIMIT} handshakes" in fault.body.decode()
    # An HTTP Channel is not opened meanwhile either.
    client = await gateway.http_client()
    response = await client.post(gateway.url, content=b"c=asbp.channel,u=7;")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert_fault(decode(response.content), int(FaultCode.BROKER_BUSY), u=7)
    assert await gateway.call(lambda broker: broker.channels.opened) == channels_before

    # The held handshakes were never refused: let go, each is greeted.
    await gateway.probe.hold_websockets(False)
    for task in held:
        ws = await asyncio.wait_for(task, 5 * T)
        greeting = decode(await asyncio.wait_for(ws.recv(), 5 * T))
        assert greeting.name == "asbp.channel"
    assert bound_of(gateway).in_flight == 0

    # Below the bound again: handshakes and HTTP Channels are served.
    assert (await gateway.channel()).greeting.name == "asbp.channel"
    assert (await gateway.http_channel()).id
    await refusals_counted(gateway, client, 3)


async def refusals_counted(gateway: Gateway, client: httpx.AsyncClient, count: int) -> None:
    metrics = (await client.get(f"{gateway.server.http_url}/metrics")).text
    found = re.search(r"^asbp_busy_handshakes_total (\S+)$", metrics, re.M)
    assert found is not None, metrics
    assert float(found[1]) == count


@pytest.mark.parametrize("server_name", SERVERS)
async def test_a_closed_or_refused_handshake_leaves_the_bound(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    """Handshakes that end without a Channel (the client leaves while held; the
    broker refuses the origin) give their place back."""
    from gateway.config.model import ChannelLimits

    gateway = await make_gateway(
        server=server_name,
        channels=ChannelLimits(max_handshakes=LIMIT),
        cors_origins="https://app.example",
    )
    loop = asyncio.get_running_loop()
    arrived = asyncio.Event()
    seen = 0

    def on_request(scope: dict[str, object]) -> None:  # in the server's loop
        nonlocal seen
        seen += 1
        if seen == LIMIT:
            loop.call_soon_threadsafe(arrived.set)

    await gateway.probe.hold_websockets(True)
    gateway.probe.on_request(on_request)
    writers = []
    for _ in range(LIMIT):
        _, writer = await asyncio.open_connection(gateway.server.host, gateway.server.port)
        writer.write(UPGRADE)
        writers.append(writer)
    await asyncio.wait_for(arrived.wait(), 5 * T)
    gateway.probe.on_request(None)
    assert bound_of(gateway).in_flight == LIMIT
    for writer in writers:  # the clients give up: their connections close while held
        writer.close()
        await writer.wait_closed()
    await until_drained(gateway)
    await gateway.probe.hold_websockets(False)
    for _ in range(LIMIT + 1):
        with pytest.raises(InvalidStatus) as info:
            await gateway.websocket("/asbp", origin="https://evil.example")
        assert info.value.response.status_code == 403
    for _ in range(LIMIT + 1):
        assert (await gateway.channel()).greeting.name == "asbp.channel"
    await until_drained(gateway)


async def until_drained(gateway: Gateway) -> None:
    """Wait, turn by turn of the server's loop (each call is one), for no handshake
    in flight: the server learns of a closed connection in its own time."""
    bound = bound_of(gateway)

    async def drained() -> None:
        while await gateway.call(lambda _broker: bound.in_flight):
            pass

    await asyncio.wait_for(drained(), 5 * T)


def test_the_bound_counts_and_refuses() -> None:
    bound = HandshakeBound(2)
    assert bound.enter() and bound.enter()
    assert not bound.enter()
    assert bound.turns_away()
    assert bound.refused == 2
    bound.leave()
    assert not bound.turns_away()
    assert bound.enter()
    off = HandshakeBound(0)
    assert all(off.enter() for _ in range(1000))
    assert not off.turns_away()
    assert off.refused == 0
    assert_fault(decode(busy_body(2)), int(FaultCode.BROKER_BUSY))


@pytest.mark.parametrize("server_name", SERVERS)
async def test_a_handshake_whose_client_has_gone_is_not_served(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    """Clients that gave up while their upgrade waited (here: while the server's loop
    was held) get no Channel, no greeting and no answer; one still waiting is served."""
    gateway = await make_gateway(server=server_name)
    channels_before = await gateway.call(lambda broker: broker.channels.opened)
    async with gateway.probe.loop_stopped():
        gone = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection(gateway.server.host, gateway.server.port)
            writer.write(UPGRADE)
            await writer.drain()
            writer.close()  # the client gives up before the server reads its request
            await writer.wait_closed()
            gone.append(reader)
        waiting = await asyncio.open_connection(gateway.server.host, gateway.server.port)
        waiting[1].write(UPGRADE)
    answer = await asyncio.wait_for(waiting[0].readuntil(b"\r\n\r\n"), 5 * T)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    waiting[1].close()
    await until_drained(gateway)
    assert bound_of(gateway).abandoned == 3
    assert await gateway.call(lambda broker: broker.channels.opened) == channels_before + 1
    client = await gateway.http_client()
    metrics = (await client.get(f"{gateway.server.http_url}/metrics")).text
    assert re.search(r"^asbp_abandoned_handshakes_total 3\.0$", metrics, re.M), metrics


class _NoSocket:
    """A transport that has no socket to tell (a test double of asyncio's interface)."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def test_without_a_tcp_socket_nobody_counts_as_gone() -> None:
    assert not peer_gone(_NoSocket())
    ours, theirs = socket.socketpair()  # Unix sockets: no TCP_INFO to ask
    with ours, theirs:

        class Unix(_NoSocket):
            def get_extra_info(self, name: str, default: object = None) -> object:
                return ours if name == "socket" else default

        theirs.close()
        assert not peer_gone(Unix())


@pytest.mark.parametrize("server_name", SERVERS)
async def test_an_invalid_upgrade_refused_by_the_server_leaves_the_bound(
    make_gateway: GatewayFactory, server_name: ServerName
) -> None:
    gateway = await make_gateway(server=server_name)
    no_key = UPGRADE.replace(b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b"")
    for _ in range(3):
        reader, writer = await asyncio.open_connection(gateway.server.host, gateway.server.port)
        writer.write(no_key)
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5 * T)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        writer.close()
        await writer.wait_closed()
    await until_drained(gateway)
    assert bound_of(gateway).refused == 0


def h2_upgrade(port: int) -> tuple[bytes, bytes]:
    """A WebSocket upgrade to /asbp over HTTP/2 (RFC 8441, prior knowledge): the
    response's status and body, once the server ends the stream."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5 * T)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding=None)
    )
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    status, body, ended, asked = b"", b"", False, False
    try:
        while not ended:
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
                elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    raise AssertionError(f"the server failed the stream: {event}")
            if not asked and conn.remote_settings.enable_connect_protocol:
                asked = True
                conn.send_headers(
                    1,
                    [
                        (b":method", b"CONNECT"),
                        (b":protocol", b"websocket"),
                        (b":scheme", b"http"),
                        (b":path", b"/asbp"),
                        (b":authority", b"127.0.0.1"),
                        (b"sec-websocket-version", b"13"),
                    ],
                )
            sock.sendall(conn.data_to_send())
        return status, body
    finally:
        sock.close()


async def test_over_http2_past_the_bound_an_upgrade_gets_503_on_its_stream(
    make_gateway: GatewayFactory,
) -> None:
    """The refusal ends the upgrade's stream only: the connection stays up (RFC 8441)."""
    from gateway.config.model import ChannelLimits

    gateway = await make_gateway(server="hypercorn", channels=ChannelLimits(max_handshakes=1))
    held = await held_handshakes(gateway, 1)
    status, body = await asyncio.to_thread(h2_upgrade, gateway.server.port)
    assert status == b"503"
    assert_fault(decode(body), int(FaultCode.BROKER_BUSY))
    await gateway.probe.hold_websockets(False)
    ws = await asyncio.wait_for(held[0], 5 * T)
    assert decode(await asyncio.wait_for(ws.recv(), 5 * T)).name == "asbp.channel"

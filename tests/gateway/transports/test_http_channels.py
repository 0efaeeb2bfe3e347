"""Stateless HTTP Channels (draft §2.6): POST to send, GET to long-poll.

Over HTTP/1.0 (curl), HTTP/1.1 (httpx), h2c with prior knowledge (curl and httpx) and
HTTP/2 over TLS chosen by ALPN (httpx, verifying the test CA).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived, StreamEnded

import asbp
from asbp import Command
from gateway.config.model import ChannelLimits
from tests.support import ServerName, T, TlsFiles
from tests.support.gateway import (
    BROKER_ID,
    SERVERS,
    Gateway,
    GatewayFactory,
    HttpChannel,
    assert_fault,
    decode,
    parse_multipart,
    run_curl,
)

pytestmark = pytest.mark.anyio


# --------------------------------------------------------------------------
# The same conversation over every HTTP version


@dataclass(frozen=True)
class Flavour:
    server: ServerName
    tls: bool
    client: dict[str, Any]
    version: str


FLAVOURS = {
    "http1.1-hypercorn": Flavour("hypercorn", False, {}, "HTTP/1.1"),
    "http1.1-uvicorn": Flavour("uvicorn", False, {}, "HTTP/1.1"),
    "https1.1-uvicorn": Flavour("uvicorn", True, {}, "HTTP/1.1"),
    "h2c-prior-knowledge": Flavour("hypercorn", False, {"http1": False, "http2": True}, "HTTP/2"),
    "h2-tls-alpn": Flavour("hypercorn", True, {"http2": True}, "HTTP/2"),
}


@pytest.mark.parametrize("flavour", FLAVOURS.values(), ids=FLAVOURS.keys())
async def test_conversation_with_httpx(
    make_gateway: GatewayFactory, tls_files: TlsFiles, flavour: Flavour
) -> None:
    gateway = await make_gateway(server=flavour.server, tls=tls_files if flavour.tls else None)
    agent = await gateway.tube(serves=("echo",))
    client = await gateway.http_client(**flavour.client)

    # Opening: no i, so the broker assigns one.
    response = await client.post(gateway.url, content=b"c=asbp.channel;")
    assert response.http_version == flavour.version
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/asbp"
    accepted = decode(response.content)
    assert accepted.name == "asbp.accepted"
    assert accepted.get("b") == BROKER_ID
    assert accepted.channel_id is not None
    secret = accepted.get("secret")
    assert isinstance(secret, str) and len(secret) >= 22  # >= 128 random bits in base64
    assert response.headers["asbp-secret"] == secret
    user = HttpChannel(client, gateway.url, accepted.channel_id, secret=secret)

    # A Command for an agent, and one the broker answers itself.
    status, reply = await user.post(Command({"c": "echo", "i": user.id, "u": 1}, b"one"))
    assert (status, reply.name, reply.get("u"), reply.get("i")) == (
        200,
        "asbp.accepted",
        "1",
        user.id,
    )
    forwarded = await agent.recv()
    assert forwarded.channel_id == user.id
    await agent.send(Command({"c": "echo", "d": user.id, "u": 1}, forwarded.body))
    await user.post(Command({"c": "asbp.ping", "i": user.id, "u": 2}, b"two"))

    # Both come back in one long-poll, numbered, in order.
    response = await user.poll_response(wait=5 * T)
    assert response.http_version == flavour.version
    assert response.status_code == 200
    assert response.headers["asbp-last-seq"] == "2"
    parts = parse_multipart(response.headers["content-type"], response.content)
    assert [seq for seq, _ in parts] == [1, 2]
    answers = [decode(frame) for _, frame in parts]
    assert answers[0] == Command({"c": "echo", "u": 1, "a": "billing"}, b"one")
    assert answers[1] == Command({"c": "asbp.pong", "u": 2}, b"two")

    # Acknowledged: nothing left.
    response = await user.poll_response(after=2, wait=0)
    assert response.status_code == 204
    assert response.headers["asbp-last-seq"] == "2"


CURL_FLAVOURS = {
    "http1.0-hypercorn": ("hypercorn", "--http1.0"),
    "http1.0-uvicorn": ("uvicorn", "--http1.0"),
    "h2c-prior-knowledge": ("hypercorn", "--http2-prior-knowledge"),
}


@pytest.mark.parametrize(("server", "flag"), CURL_FLAVOURS.values(), ids=CURL_FLAVOURS.keys())
async def test_conversation_with_curl(
    make_gateway: GatewayFactory, server: ServerName, flag: str
) -> None:
    gateway = await make_gateway(server=server)
    status, headers, body = await run_curl(flag, gateway.url, data=b"c=asbp.channel;")
    assert status == 200
    assert headers["content-type"] == "application/asbp"
    assert int(headers["content-length"]) == len(body)
    channel_id = decode(body).channel_id
    assert channel_id is not None
    proof = f"ASBP-Secret: {headers['asbp-secret']}"

    status, _, body = await run_curl(
        flag, "-H", proof, gateway.url, data=b"c=asbp.ping,u=3,i=%s;hi" % channel_id.encode()
    )
    assert status == 200
    assert decode(body) == Command(c="asbp.accepted", i=channel_id, b=BROKER_ID, u=3)

    poll = f"{gateway.url}?i={channel_id}&after=0&wait={5 * T:g}"
    status, headers, body = await run_curl(flag, "-H", proof, poll)
    assert status == 200
    assert headers["asbp-last-seq"] == "1"
    assert [
        (seq, decode(frame)) for seq, frame in parse_multipart(headers["content-type"], body)
    ] == [(1, Command({"c": "asbp.pong", "u": 3}, b"hi"))]

    status, headers, body = await run_curl(
        flag, "-H", proof, f"{gateway.url}?i={channel_id}&after=1&wait=0"
    )
    assert (status, headers["asbp-last-seq"], body) == (204, "1", b"")


# --------------------------------------------------------------------------
# Opening and addressing Channels


@pytest.mark.parametrize("server_name", SERVERS)
async def test_post_without_i_opens_a_new_channel_each_time(gateway: Gateway) -> None:
    first = await gateway.http_channel()
    second = await gateway.http_channel()
    assert first.id != second.id

    # A routable Command without i opens a Channel too, and is routed on it.
    client = await gateway.http_client()
    fresh = HttpChannel(client, gateway.url)
    status, accepted = await fresh.post(Command({"c": "asbp.ping", "u": 9}, b"x"))
    assert (status, accepted.name, accepted.get("u")) == (200, "asbp.accepted", "9")
    assert accepted.channel_id not in (None, first.id, second.id)
    fresh.id = accepted.channel_id or ""
    fresh.secret = str(accepted.get("secret"))
    assert await fresh.poll() == [(1, Command({"c": "asbp.pong", "u": 9}, b"x"))]
    # ...and nothing went to the others.
    assert await first.poll(wait=0) == []


@pytest.mark.parametrize("server_name", SERVERS)
async def test_post_with_i_in_the_query_string_faults_and_opens_nothing(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    before = await gateway.call(lambda broker: len(broker.channels))
    response = await user.client.post(
        gateway.url,
        params={"i": user.id},
        content=asbp.encode(Command(c="asbp.ping", u=6)),
        headers={"Content-Type": "application/asbp"},
    )
    assert response.status_code == 400
    fault = decode(response.content)
    assert_fault(fault, 1201, u=6)
    assert "header" in fault.body.decode() and "query string" in fault.body.decode()
    assert await gateway.call(lambda broker: len(broker.channels)) == before
    assert await user.poll(wait=0) == []  # and the ping was not routed on the Channel


@pytest.mark.parametrize("server_name", SERVERS)
async def test_later_posts_carry_i(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    status, accepted = await user.post(Command(c="asbp.ping", i=user.id, u=1))
    assert (status, accepted.channel_id) == (200, user.id)
    assert [c.get("u") for _, c in await user.poll()] == ["1"]


@pytest.mark.parametrize("server_name", SERVERS)
async def test_unknown_channel_is_404_with_fault_2104(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    websocket_user = await gateway.channel()
    for unknown in ("0" * 32, websocket_user.id):  # a WebSocket Channel is no HTTP Channel
        status, fault = await user.post(Command(c="asbp.ping", i=unknown, u=4))
        assert status == 404
        assert_fault(fault, 2104, u=4)
        response = await HttpChannel(user.client, gateway.url, unknown).poll_response()
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/asbp"
        assert_fault(decode(response.content), 2104)
    missing = await user.client.get(gateway.url)  # no i at all
    assert missing.status_code == 404


# --------------------------------------------------------------------------
# Long-polling


async def test_unacknowledged_commands_are_returned_again(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    for u in (1, 2, 3):
        await user.post(Command(c="asbp.ping", i=user.id, u=u))
    first = await user.poll(after=0)
    assert [seq for seq, _ in first] == [1, 2, 3]
    # The response "was lost": the same after gets the same Commands.
    assert await user.poll(after=0) == first
    # Acknowledging part of them.
    assert [seq for seq, _ in await user.poll(after=2)] == [3]
    await user.post(Command(c="asbp.ping", i=user.id, u=4))
    assert [(seq, c.get("u")) for seq, c in await user.poll(after=3)] == [(4, "4")]
    assert await user.poll(after=4, wait=0) == []


async def test_long_poll_returns_at_most_long_poll_max_frames(
    make_gateway: GatewayFactory,
) -> None:
    gateway = await make_gateway(channels=ChannelLimits(long_poll_max_frames=2))
    user = await gateway.http_channel()
    for u in range(5):
        await user.post(Command(c="asbp.ping", i=user.id, u=u))
    assert [seq for seq, _ in await user.poll()] == [1, 2]
    assert [seq for seq, _ in await user.poll()] == [3, 4]
    assert [seq for seq, _ in await user.poll()] == [5]


@pytest.mark.parametrize("server_name", SERVERS)
async def test_empty_long_poll_answers_204_after_wait(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    wait = 0.3 * T
    started = time.monotonic()
    response = await user.poll_response(wait=wait)
    elapsed = time.monotonic() - started
    assert response.status_code == 204
    assert response.headers["asbp-last-seq"] == "0"
    assert elapsed >= wait * 0.9  # the broker held the request; the client adds only latency


async def test_long_poll_wakes_when_a_command_arrives(gateway: Gateway) -> None:
    agent = await gateway.tube()
    user = await gateway.http_channel()
    entered = await _request_entered(gateway)
    parked = asyncio.create_task(user.poll(wait=25))
    await asyncio.wait_for(entered.wait(), 5 * T)
    await agent.send(Command({"c": "news", "d": user.id}, b"now"))
    assert await asyncio.wait_for(parked, 5 * T) == [
        (1, Command({"c": "news", "a": "billing"}, b"now"))
    ]


async def test_a_second_poll_supersedes_a_parked_one(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    entered = await _request_entered(gateway)
    first = asyncio.create_task(user.poll_response(wait=25))
    await asyncio.wait_for(entered.wait(), 5 * T)
    entered.clear()
    second = asyncio.create_task(user.poll_response(wait=25))
    # The first ends at once, empty, well before its 25 s; the second stays parked...
    superseded = await asyncio.wait_for(first, 5 * T)
    assert superseded.status_code == 204
    assert not second.done()
    # ...and gets what arrives next.
    await user.post(Command(c="asbp.ping", i=user.id, u=1))
    response = await asyncio.wait_for(second, 5 * T)
    assert response.status_code == 200
    assert [
        seq for seq, _ in parse_multipart(response.headers["content-type"], response.content)
    ] == [1]


async def _request_entered(gateway: Gateway) -> asyncio.Event:
    """An event set when a GET request enters the app.

    The probe calls back inside the request's own task, which then runs without
    suspending until the long-poll parks in the mailbox (Starlette awaits nothing real
    before the handler of a GET). The server's loop handles no other request in between,
    so once the event is set, a request sent afterwards finds the poll parked.
    """
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()

    def on_request(scope: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            loop.call_soon_threadsafe(entered.set)

    gateway.probe.on_request(on_request)
    return entered


@pytest.mark.parametrize("query", ["after=x", "wait=soon"])
async def test_non_numeric_after_or_wait_is_400(gateway: Gateway, query: str) -> None:
    user = await gateway.http_channel()
    response = await user.client.get(
        f"{gateway.url}?i={user.id}&{query}", headers={"ASBP-Secret": user.secret}
    )
    assert response.status_code == 400
    assert_fault(decode(response.content), 1201)


# --------------------------------------------------------------------------
# Expiry


async def test_idle_channel_expires(make_gateway: GatewayFactory) -> None:
    # An idle timeout of 0 makes every Channel idle by the time expiry runs; the test
    # runs expiry itself, in the broker's loop, rather than waiting for housekeeping.
    gateway = await make_gateway(channels=ChannelLimits(http_idle_timeout=0))
    user = await gateway.http_channel()
    await gateway.call(lambda broker: broker.expire_idle_channels())
    response = await user.poll_response()
    assert response.status_code == 404
    assert_fault(decode(response.content), 2104)
    status, fault = await user.post(Command(c="asbp.ping", i=user.id, u=1))
    assert status == 404
    assert_fault(fault, 2104, u=1)


async def test_active_channel_does_not_expire(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    assert await gateway.call(lambda broker: broker.expire_idle_channels()) == 0
    await user.post(Command(c="asbp.ping", i=user.id, u=1))
    assert [c.name for _, c in await user.poll()] == ["asbp.pong"]


async def test_parked_poll_learns_its_channel_expired(make_gateway: GatewayFactory) -> None:
    gateway = await make_gateway(channels=ChannelLimits(http_idle_timeout=0))
    user = await gateway.http_channel()
    entered = await _request_entered(gateway)
    parked = asyncio.create_task(user.poll_response(wait=25))
    await asyncio.wait_for(entered.wait(), 5 * T)
    await gateway.call(lambda broker: broker.expire_idle_channels())
    response = await asyncio.wait_for(parked, 5 * T)
    assert response.status_code == 404
    assert_fault(decode(response.content), 2104)


# --------------------------------------------------------------------------
# Refused requests


@pytest.fixture
async def small_frames(make_gateway: GatewayFactory, server_name: ServerName) -> Gateway:
    limits = asbp.Limits(max_frame_bytes=1024, max_header_bytes=256)
    return await make_gateway(server=server_name, limits=limits)


@pytest.mark.parametrize("server_name", SERVERS)
async def test_oversized_post_is_413_with_fault_1101(small_frames: Gateway) -> None:
    user = await small_frames.http_channel()
    frame = b"c=asbp.ping,u=1,i=%s;" % user.id.encode()
    for size in (1025, 900_000):  # the larger is still uploading when the broker answers
        status, fault = await user.post(frame + b"x" * (size - len(frame)))
        assert status == 413
        assert_fault(fault, 1101)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
        yield frame
        for _ in range(64):
            yield b"x" * 512

    response = await user.client.post(small_frames.url, content=chunks())
    assert response.status_code == 413
    assert_fault(decode(response.content), 1101)

    # At the limit exactly: accepted.
    status, accepted = await user.post(frame + b"x" * (1024 - len(frame)))
    assert (status, accepted.name) == (200, "asbp.accepted")


@pytest.mark.parametrize("server_name", SERVERS)
async def test_oversized_header_is_431_with_fault_1104(small_frames: Gateway) -> None:
    user = await small_frames.http_channel()
    status, fault = await user.post(b"u=2,c=" + b"y" * 300 + b";")
    assert status == 431
    assert_fault(fault, 1104, u=2)


@pytest.mark.parametrize("server_name", SERVERS)
@pytest.mark.parametrize(
    ("frame", "code", "u"),
    [
        (b"u=7,c=echo,=x;", 1201, 7),
        (b"c=asbp.ping", 1201, None),
        (b"", 1201, None),
        (b"u=8,c=x,i=NOTHEX;", 1203, 8),
        (b"+u=9,c=x\xff;", 1201, 9),  # "+u=": u first in a header marked UTF-8 that is not
    ],
)
async def test_malformed_post_is_400(
    gateway: Gateway, frame: bytes, code: int, u: int | None
) -> None:
    user = await gateway.http_channel()
    status, fault = await user.post(frame)
    assert status == 400
    assert_fault(fault, code, u=u)
    # The Channel is unharmed.
    await user.post(Command(c="asbp.ping", i=user.id, u=1))
    assert [c.name for _, c in await user.poll()] == ["asbp.pong"]


async def test_routing_faults_arrive_through_the_mailbox(gateway: Gateway) -> None:
    user = await gateway.http_channel()
    status, accepted = await user.post(Command(c="nobody.serves.this", i=user.id, u=5))
    assert (status, accepted.name) == (200, "asbp.accepted")
    [(_, fault)] = await user.poll()
    assert_fault(fault, 2101, u=5)


async def test_a_query_string_that_is_not_utf8_gets_no_server_error(gateway: Gateway) -> None:
    """Found by bench/fuzz.py: building the request's URL raised on such a query
    string (a 500). HTTP/1.1 (h11) refuses it in the request line; HTTP/2 lets
    it through to the application, so this speaks h2c to Hypercorn."""
    running = gateway.server
    reader, writer = await asyncio.open_connection(running.host, running.port)
    try:
        h2 = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        h2.initiate_connection()
        body = asbp.encode(Command(c="asbp.ping", u=3))
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":authority", running.host.encode()),
            (b":path", b"/asbp?x=\xff"),
            (b"content-type", b"application/asbp"),
            (b"content-length", b"%d" % len(body)),
        ]
        h2.send_headers(1, headers)
        h2.send_data(1, body, end_stream=True)
        writer.write(h2.data_to_send())
        status, answer, ended = b"", b"", False
        while not ended:
            data = await asyncio.wait_for(reader.read(65536), 5 * T)
            assert data, "the server closed the connection"
            for event in h2.receive_data(data):
                if isinstance(event, ResponseReceived):
                    status = dict(event.headers)[b":status"]
                elif isinstance(event, DataReceived):
                    answer += event.data
                    h2.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, StreamEnded):
                    ended = True
            writer.write(h2.data_to_send())
        assert status == b"200", answer
        assert decode(answer).name == "asbp.accepted"
    finally:
        writer.close()

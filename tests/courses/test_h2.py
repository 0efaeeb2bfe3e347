"""Courses over HTTP/2 (RFC 8441): courses/h2.py and courses/transport.py against real servers.

Hypercorn with TLS offers ``h2`` by ALPN and enables extended CONNECT, so a Course
between two buses on it runs on HTTP/2 unless told ``never``; Uvicorn has no HTTP/2,
and Hypercorn can be told not to offer it, so ``auto`` falls back to HTTP/1.1 there.
Which one a link used is read from its ``course.up`` record (``http2``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, RequestReceived, StreamEnded
from h2.settings import SettingCodes
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from asbp import Command, decode, encode
from asbp.fault_commands import read_fault
from courses.credential import SigningKey
from courses.h2 import H2WebSocket, Http2Unavailable, h2_ssl_context, open_h2_websocket
from courses.transport import Dialler
from courses.wire import ACK, ID_KEY
from gateway.app import create_app
from tests.courses.buses import Bus, Relay, bus_config, make_bus, serve_bus, user
from tests.support import RunningServer, T, TlsFiles, serve_app_async
from tests.support.gateway import LogEvents
from tests.support.tls import client_ssl_context

pytestmark = pytest.mark.anyio


def key_of(bus: Bus) -> SigningKey:
    return SigningKey((bus.directory / "bus.pem").read_bytes(), domain=bus.domain)


@contextlib.contextmanager
def log_events(name: str) -> Any:
    events = LogEvents(asyncio.get_running_loop())
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)  # course.up is INFO
    log.addHandler(events)
    try:
        yield log, events
    finally:
        log.removeHandler(events)


@contextlib.asynccontextmanager
async def two_buses(
    tmp_path: Path,
    tls: TlsFiles,
    *,
    http2: str = "auto",
    b_serving: dict[str, Any] | None = None,
    relays: list[Relay] | None = None,
) -> AsyncIterator[tuple[RunningServer, RunningServer, LogEvents, LogEvents]]:
    """Buses a.test and b.test, each dialling the other with ``http2``; b served as
    ``b_serving`` says (Hypercorn by default). ``relays`` gets the relays to a and b."""
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with (
        log_events(f"h2-a-{tmp_path.name}") as (log_a, a_events),
        log_events(f"h2-b-{tmp_path.name}") as (log_b, b_events),
    ):
        async with Relay() as to_a, Relay() as to_b:
            if relays is not None:
                relays += [to_a, to_b]
            config_a = bus_config(bus_a, {bus_b: to_b.url()}, tls=tls)
            config_b = bus_config(bus_b, {bus_a: to_a.url()}, tls=tls)
            for config in (config_a, config_b):
                # Each peer's table, as bus_config wrote it: set its http2.
                for table in config.courses.values():
                    if isinstance(table, dict):
                        table["http2"] = http2
            async with (
                serve_bus(bus_a, config_a, tls, log=log_a) as a,
                serve_bus(bus_b, config_b, tls, log=log_b, **(b_serving or {})) as b,
            ):
                to_a.target, to_b.target = a.port, b.port
                try:
                    yield a, b, a_events, b_events
                finally:
                    await to_a.drain()
                    await to_b.drain()


async def test_a_course_over_http2_carries_commands_both_ways_and_replies_by_p(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files) as (a, b, a_events, b_events),
        user(a.ws_url, "alice", tls_files) as alice,
        user(b.ws_url, "bob", tls_files) as bob,
    ):
        # Each bus dials the other: both links are on HTTP/2.
        assert (await a_events.wait("course.up", timeout=10 * T)).http2 is True
        assert (await b_events.wait("course.up", timeout=10 * T)).http2 is True
        await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"hi"))
        got = await bob.recv()
        assert (got.name, got.publisher, got.body) == ("chat", "alice*a.test", b"hi")
        await bob.send(Command({"c": "chat.reply", "r": got.publisher, "u": 7}, b"hello"))
        back = await alice.recv()
        assert (back.name, back.publisher, back.command_id, back.body) == (
            "chat.reply",
            "bob*b.test",
            7,
            b"hello",
        )
        # Larger than HTTP/2's initial window (65,535 bytes): sent as the peer's
        # WINDOW_UPDATEs allow, and a burst of them in order.
        big = bytes(range(256)) * 600
        for n in range(5):
            await alice.send(Command({"c": "chat", "r": "bob*b.test", "u": n}, big))
        for n in range(5):
            got = await bob.recv()
            assert (got.command_id, got.body) == (n, big)


async def test_a_course_over_http2_cut_before_its_acknowledgements_delivers_once_in_order(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    relays: list[Relay] = []
    count = 50
    async with (
        two_buses(tmp_path, tls_files, relays=relays) as (a, b, a_events, _),
        user(a.ws_url, "alice", tls_files) as alice,
        user(b.ws_url, "bob", tls_files) as bob,
    ):
        to_b = relays[1]
        assert (await a_events.wait("course.up", timeout=10 * T)).http2 is True
        # Nothing b sends reaches a from now: no acknowledgement (nor WINDOW_UPDATE).
        to_b.hold_back = True
        for n in range(count):
            await alice.send(Command({"c": "chat", "r": "bob*b.test"}, str(n).encode()))
        first = [(await bob.recv()).body for _ in range(count)]
        assert first == [str(n).encode() for n in range(count)]
        # The link drops with all of them unacknowledged; a dials again (over HTTP/2),
        # sends them again, and b drops what it has seen.
        connections = to_b.connections
        to_b.cut()
        to_b.target = b.port
        await to_b.wait_connections(connections + 1)
        await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"after"))
        assert (await bob.recv()).body == b"after"  # no copy came before it
        ups = a_events.find("course.up")
        assert len(ups) >= 2 and all(record.http2 is True for record in ups)
        async with httpx.AsyncClient(verify=client_ssl_context(tls_files)) as http:
            metrics = (await http.get(f"{b.http_url}/metrics")).text
        # Every one came again, and was dropped as seen.
        assert f'asbp_course_received_total{{outcome="duplicate"}} {count}.0' in metrics
        assert f'asbp_course_received_total{{outcome="accepted"}} {count + 1}.0' in metrics
    print(f"{count} Commands sent, {count} sent again after the cut, each delivered once")


async def test_auto_falls_back_to_http1_against_uvicorn(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files, b_serving={"server": "uvicorn"}) as (a, b, a_events, _),
        user(a.ws_url, "alice", tls_files) as alice,
        user(b.ws_url, "bob", tls_files) as bob,
    ):
        # a dials Uvicorn (no HTTP/2): HTTP/1.1. b dials Hypercorn: HTTP/2.
        assert (await a_events.wait("course.up", timeout=10 * T)).http2 is False
        await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"over http/1.1"))
        got = await bob.recv()
        assert (got.publisher, got.body) == ("alice*a.test", b"over http/1.1")
        await bob.send(Command({"c": "chat.reply", "r": got.publisher}, b"over h2"))
        assert (await alice.recv()).body == b"over h2"


async def test_auto_falls_back_when_hypercorn_does_not_offer_h2(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files, b_serving={"h2": False}) as (a, b, a_events, b_events),
        user(a.ws_url, "alice", tls_files) as alice,
        user(b.ws_url, "bob", tls_files) as bob,
    ):
        assert (await a_events.wait("course.up", timeout=10 * T)).http2 is False
        assert (await b_events.wait("course.up", timeout=10 * T)).http2 is True
        await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"hi"))
        assert (await bob.recv()).body == b"hi"


async def test_auto_dials_a_server_without_http2_straight_over_http1_after_once(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    app = create_app(bus_config(b, {a: []}, tls=tls_files))
    async with serve_app_async(app, tls=tls_files, server="uvicorn") as server, Relay() as relay:
        relay.target = server.port
        dialler = Dialler(ca=tls_files.ca, http2="auto")
        # The first dial asks for h2 and dials again for HTTP/1.1; the next go
        # straight to HTTP/1.1 (for REPROBE seconds).
        for connections in (2, 3, 4):
            token, _ = key_of(a).sign("b.test", lifetime=60)
            headers = {"Authorization": f"Bearer {token}"}
            async with dialler.dial(relay.url(), headers=headers) as link:
                assert link.http2 is False
                assert decode(_bytes(await link.socket.recv())).name == "asbp.course"
            assert relay.connections == connections
        await relay.drain()


async def test_never_keeps_to_http1_where_http2_is_offered(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with (
        two_buses(tmp_path, tls_files, http2="never") as (a, b, a_events, b_events),
        user(a.ws_url, "alice", tls_files) as alice,
        user(b.ws_url, "bob", tls_files) as bob,
    ):
        assert (await a_events.wait("course.up", timeout=10 * T)).http2 is False
        assert (await b_events.wait("course.up", timeout=10 * T)).http2 is False
        await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"hi"))
        assert (await bob.recv()).body == b"hi"


async def test_always_does_not_fall_back(tmp_path: Path, tls_files: TlsFiles) -> None:
    async with two_buses(tmp_path, tls_files, http2="always", b_serving={"server": "uvicorn"}) as (
        _a,
        _b,
        a_events,
        b_events,
    ):
        # (Before the relays have their targets, attempts fail otherwise.)
        await a_events.wait(
            "course.link_failed",
            timeout=10 * T,
            error="the server chose no protocol by ALPN, not h2",
        )
        assert not a_events.find("course.up")
        # The other way (Hypercorn answering) HTTP/2 is there.
        assert (await b_events.wait("course.up", timeout=10 * T)).http2 is True


async def test_always_on_plain_text_is_h2c_under_the_development_flag(tmp_path: Path) -> None:
    """``ws://`` (loopback, the Tubes' dev flag) with ``http2 = "always"``: HTTP/2
    with prior knowledge, which Hypercorn answers, both ways."""
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with (
        log_events(f"h2c-a-{tmp_path.name}") as (log_a, a_events),
        log_events(f"h2c-b-{tmp_path.name}") as (log_b, b_events),
    ):
        async with Relay() as to_a, Relay() as to_b:
            config_a = bus_config(bus_a, {bus_b: to_b.url("ws")}, tls=None)
            config_b = bus_config(bus_b, {bus_a: to_a.url("ws")}, tls=None)
            for config in (config_a, config_b):
                for table in config.courses.values():
                    if isinstance(table, dict):
                        table["http2"] = "always"
            async with (
                serve_bus(bus_a, config_a, None, log=log_a) as a,
                serve_bus(bus_b, config_b, None, log=log_b) as b,
                user(a.ws_url, "alice", None) as alice,
                user(b.ws_url, "bob", None) as bob,
            ):
                to_a.target, to_b.target = a.port, b.port
                assert (await a_events.wait("course.up", timeout=10 * T)).http2 is True
                assert (await b_events.wait("course.up", timeout=10 * T)).http2 is True
                assert a.ws_url.startswith("ws://")
                await alice.send(Command({"c": "chat", "r": "bob*b.test"}, b"hi"))
                got = await bob.recv()
                assert (got.publisher, got.body) == ("alice*a.test", b"hi")
                await bob.send(Command({"c": "chat.reply", "r": got.publisher, "u": 3}))
                back = await alice.recv()
                assert (back.publisher, back.command_id) == ("bob*b.test", 3)
                await to_a.drain()
                await to_b.drain()


async def test_always_on_plain_text_fails_against_a_server_without_h2c(
    tmp_path: Path,
) -> None:
    """Uvicorn has no HTTP/2: the prior-knowledge attempt fails, never falls back."""
    bus_a, bus_b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with log_events(f"h2c-u-{tmp_path.name}") as (log_a, a_events):
        async with Relay() as to_b:
            config_a = bus_config(bus_a, {bus_b: to_b.url("ws")}, tls=None)
            for table in config_a.courses.values():
                if isinstance(table, dict):
                    table["http2"] = "always"
            config_b = bus_config(bus_b, {bus_a: []}, tls=None)
            async with (
                serve_bus(bus_b, config_b, None, server="uvicorn") as b,
                serve_bus(bus_a, config_a, None, log=log_a),
            ):
                to_b.target = b.port
                await a_events.wait("course.link_failed", timeout=10 * T)
                assert not a_events.find("course.up")
                await to_b.drain()


# -- the answering side refuses the same on both HTTPs -------------------------------


@contextlib.asynccontextmanager
async def bus_b(tmp_path: Path, tls: TlsFiles) -> AsyncIterator[tuple[RunningServer, Bus]]:
    """Bus b.test on Hypercorn, listing a.test (which it does not dial)."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    async with serve_app_async(create_app(bus_config(b, {a: []}, tls=tls)), tls=tls) as running:
        yield running, a


async def open_h2(
    server: RunningServer, tls: TlsFiles, token: str | None, **options: Any
) -> H2WebSocket:
    return await open_h2_websocket(
        "127.0.0.1",
        server.port,
        path="/course",
        authority=f"127.0.0.1:{server.port}",
        headers=[] if token is None else [("Authorization", f"Bearer {token}")],
        ssl_context=h2_ssl_context(str(tls.ca)),
        open_timeout=5 * T,
        **options,
    )


async def refusal_h2(server: RunningServer, tls: TlsFiles, token: str | None) -> tuple[int, int]:
    with pytest.raises(InvalidStatus) as caught:
        await open_h2(server, tls, token)
    response = caught.value.response
    return response.status_code, read_fault(decode(response.body or b"")).code


async def refusal_h1(server: RunningServer, tls: TlsFiles, token: str | None) -> tuple[int, int]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    with pytest.raises(InvalidStatus) as caught:
        async with connect(
            f"{server.ws_url}/course",
            additional_headers=headers,
            ssl=client_ssl_context(tls),
            open_timeout=5 * T,
        ):
            pass
    response = caught.value.response
    return response.status_code, read_fault(decode(response.body or b"")).code


@pytest.mark.parametrize("forgery", ["unlisted", "impostor", "none", "replayed"])
async def test_a_refused_credential_gets_the_same_refusal_over_http2_as_over_http1(
    tmp_path: Path, tls_files: TlsFiles, forgery: str
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a):
        other = make_bus(tmp_path, "c.test")

        def token() -> str | None:
            if forgery == "none":
                return None
            if forgery == "unlisted":
                return key_of(other).sign("b.test", lifetime=60)[0]
            if forgery == "impostor":
                signer = SigningKey((other.directory / "bus.pem").read_bytes(), domain="a.test")
                return signer.sign("b.test", lifetime=60)[0]
            return key_of(a).sign("b.test", lifetime=60)[0]

        first, second = token(), token()
        if forgery == "replayed":
            # Each used once, one on each HTTP, then offered again on the same one.
            async with await open_h2(server, tls_files, first) as ws:
                assert decode(_bytes(await ws.recv())).name == "asbp.course"
            async with connect(
                f"{server.ws_url}/course",
                additional_headers={"Authorization": f"Bearer {second}"},
                ssl=client_ssl_context(tls_files),
            ) as ws1:
                await asyncio.wait_for(ws1.recv(), 5 * T)
        over_h2 = await refusal_h2(server, tls_files, first)
        over_h1 = await refusal_h1(server, tls_files, second)
        expected = {"unlisted": 2203, "impostor": 2204, "none": 2204, "replayed": 2205}[forgery]
        assert over_h2 == over_h1 == (401, expected)


# -- the client itself ---------------------------------------------------------------


async def test_the_h2_client_speaks_a_course_and_closes_cleanly(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        async with await open_h2(server, tls_files, token) as ws:
            assert ws.http2 and ws.close_code is None
            hello = decode(_bytes(await ws.recv()))
            assert (hello.name, hello.get("domain")) == ("asbp.course", "b.test")
            # A crossing for nobody there is still accepted (its fault goes back by p)
            # and acknowledged: the answering broker read it off the HTTP/2 stream.
            crossing = Command(
                {"c": "chat", "r": "nobody*b.test", "p": "alice*a.test", ID_KEY: "a" * 32}, b"x"
            )
            await ws.send(encode(crossing))
            ack = decode(_bytes(await ws.recv()))
            assert (ack.name, ack.get(ID_KEY)) == (ACK, ("a" * 32,))
            await ws.close()
        assert ws.close_code == 1000
        with pytest.raises(ConnectionClosed):
            await ws.send(b"after close")
        with pytest.raises(ConnectionClosed):
            await ws.recv()


async def test_a_ping_gets_its_pong_and_fails_once_closed(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        async with await open_h2(server, tls_files, token, ping_interval=None) as ws:
            await ws.recv()
            pong = await ws.ping()
            await asyncio.wait_for(pong, 5 * T)
            unanswered = await ws.ping()
            await ws.close()
        # Closed before (or as) its pong came: done either way, never left hanging.
        assert unanswered.done()
        with pytest.raises(ConnectionClosed):
            await ws.ping()


async def test_a_bad_frame_ends_the_stream_and_iteration_raises(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        async with await open_h2(server, tls_files, token) as ws:
            await ws.recv()
            await ws.send("not a crossing")  # a text frame, and no course.id: 1008
            with pytest.raises(ConnectionClosed) as caught:
                async with asyncio.timeout(5 * T):
                    async for _ in ws:
                        pass
            assert caught.value.rcvd is not None and caught.value.rcvd.code == 1008
        assert ws.close_code == 1008


async def test_a_silent_peer_is_dropped_by_the_keepalive(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a), Relay() as relay:
        relay.target = server.port
        token, _ = key_of(a).sign("b.test", lifetime=60)
        ws = await open_h2_websocket(
            "127.0.0.1",
            relay.port,
            path="/course",
            authority=f"127.0.0.1:{relay.port}",
            headers=[("Authorization", f"Bearer {token}")],
            ssl_context=h2_ssl_context(str(tls_files.ca)),
            open_timeout=5 * T,
            ping_interval=0.05 * T,
            ping_timeout=0.2 * T,
        )
        async with ws:
            await ws.recv()
            relay.hold_back = True  # nothing comes back any more, pongs included
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(10 * T):
                    await ws.recv()
        await relay.drain()


async def test_a_server_without_h2_is_reported_unavailable(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    app = create_app(bus_config(b, {a: []}, tls=tls_files))
    async with serve_app_async(app, tls=tls_files, server="uvicorn") as server:
        with pytest.raises(Http2Unavailable, match="not h2"):
            await open_h2(server, tls_files, None)


@contextlib.asynccontextmanager
async def bare_h2_server(
    tls: TlsFiles,
    *,
    settings: bool,
    huge_message: bool = False,
    accept: bool = False,
    received: list[bytes] | None = None,
    ended: asyncio.Event | None = None,
) -> AsyncIterator[int]:
    """A TLS server that takes ``h2`` by ALPN and either sends SETTINGS without
    extended CONNECT (as an HTTP/2 server that serves no WebSocket does) or closes at
    once; or accepts the WebSocket and, with ``huge_message``, starts a 2 MiB message
    (a hostile answering peer), else keeps what comes in ``received`` and sets
    ``ended`` at the client's END_STREAM; its port."""
    context = ssl_module.create_default_context(ssl_module.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    context.set_alpn_protocols(["h2"])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if settings:
            connection = H2Connection(H2Configuration(client_side=False))
            connection.initiate_connection()
            if huge_message or accept:
                connection.update_settings({SettingCodes.ENABLE_CONNECT_PROTOCOL: 1})
            writer.write(connection.data_to_send())
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    for event in connection.receive_data(data):
                        if isinstance(event, RequestReceived):
                            connection.send_headers(event.stream_id, [(":status", "200")])
                            if huge_message:
                                # A binary frame announcing 2 MiB, and its first bytes.
                                header = b"\x82\x7f" + (2 * 2**20).to_bytes(8, "big")
                                connection.send_data(event.stream_id, header + b"x" * 1000)
                        elif isinstance(event, DataReceived) and received is not None:
                            received.append(event.data or b"")
                            connection.acknowledge_received_data(
                                event.flow_controlled_length or 0, event.stream_id
                            )
                        elif isinstance(event, StreamEnded) and ended is not None:
                            ended.set()
                    writer.write(connection.data_to_send())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.contextmanager
def handshake_resets_ignored() -> Iterator[None]:
    """A hostile TLS server of a test whose client (the Course link, retrying) is
    stopped mid-handshake: asyncio reports the reset to the loop's exception handler,
    which anyio's test runner turns into a failure of the test. Only those resets are
    let go; anything else still goes to the runner."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), ConnectionResetError | BrokenPipeError):
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    loop.set_exception_handler(handle)
    try:
        yield
    finally:
        loop.set_exception_handler(previous)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        (True, "does not enable extended CONNECT"),
        (False, "closed before the server's SETTINGS"),
    ],
)
async def test_an_h2_server_without_extended_connect_is_reported_unavailable(
    tls_files: TlsFiles, settings: bool, reason: str
) -> None:
    async with bare_h2_server(tls_files, settings=settings) as port:
        with pytest.raises(Http2Unavailable, match=reason):
            await open_h2_websocket(
                "127.0.0.1",
                port,
                path="/course",
                authority=f"127.0.0.1:{port}",
                headers=[],
                ssl_context=h2_ssl_context(str(tls_files.ca)),
                open_timeout=5 * T,
            )


async def test_an_answer_larger_than_a_megabyte_closes_an_http2_course(
    tls_files: TlsFiles,
) -> None:
    async with bare_h2_server(tls_files, settings=True, huge_message=True) as port:
        ws = await open_h2_websocket(
            "127.0.0.1",
            port,
            path="/course",
            authority=f"127.0.0.1:{port}",
            headers=[],
            ssl_context=h2_ssl_context(str(tls_files.ca)),
            open_timeout=5 * T,
            close_timeout=0.5 * T,
        )
        async with ws:
            with pytest.raises(ConnectionClosed) as caught:
                await asyncio.wait_for(ws.recv(), 5 * T)
        assert caught.value.sent is not None and caught.value.sent.code == 1009


async def test_closing_sends_a_close_frame_then_end_stream(tls_files: TlsFiles) -> None:
    received: list[bytes] = []
    ended = asyncio.Event()
    async with bare_h2_server(
        tls_files, settings=True, accept=True, received=received, ended=ended
    ) as port:
        ws = await open_h2_websocket(
            "127.0.0.1",
            port,
            path="/course",
            authority=f"127.0.0.1:{port}",
            headers=[],
            ssl_context=h2_ssl_context(str(tls_files.ca)),
            open_timeout=5 * T,
            close_timeout=0.2 * T,  # this server never answers the close frame
        )
        await ws.send(b"one")
        await ws.close(1001)
        await asyncio.wait_for(ended.wait(), 5 * T)
    frames = b"".join(received)
    # Two masked frames: a binary one of 3 bytes, then a close frame of 2 (the code).
    assert (frames[0], frames[1], len(frames)) == (0x82, 0x80 | 3, 2 + 4 + 3 + 2 + 4 + 2)
    assert (frames[9], frames[10]) == (0x88, 0x80 | 2)
    mask, code = frames[11:15], frames[15:17]
    assert bytes(c ^ m for c, m in zip(code, mask, strict=False)) == (1001).to_bytes(2, "big")


async def test_an_answer_larger_than_a_megabyte_closes_an_http1_course(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """A hostile answerer on HTTP/1.1 (no h2 by ALPN): the link is dropped, not grown."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")

    async def answer(ws: ServerConnection) -> None:
        await ws.send(b"x" * (2 * 2**20))
        await ws.wait_closed()

    context = ssl_module.create_default_context(ssl_module.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls_files.cert, tls_files.key)
    with handshake_resets_ignored():
        async with serve(answer, "127.0.0.1", 0, ssl=context, max_size=None) as hostile:
            port = next(iter(hostile.sockets)).getsockname()[1]
            with log_events(f"h2-hostile-{tmp_path.name}") as (log, events):
                config_a = bus_config(a, {b: f"wss://127.0.0.1:{port}/course"}, tls=tls_files)
                async with serve_bus(a, config_a, tls_files, log=log):
                    failed = await events.wait("course.link_failed", timeout=10 * T)
                    assert "1009" in failed.error
                    assert not events.find("course.up")


def _bytes(frame: str | bytes) -> bytes:
    return frame.encode() if isinstance(frame, str) else frame

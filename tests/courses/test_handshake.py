"""Each refusal of a Course handshake, against a real broker (docs/courses.md, "Handshake").

The dialling side is played by hand here (a WebSocket client with a credential
minted by :class:`courses.credential.SigningKey`), so each test can forge exactly
one thing: an unlisted domain, a replay, a key of another bus, plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl as ssl_module
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import InvalidStatus

from asbp import Command, decode, encode
from asbp.fault_commands import read_fault
from courses.credential import SigningKey, answer_jti
from courses.wire import pack
from gateway.app import create_app
from gateway.auth.credentials import AgentCredentials
from gateway.auth.keys import b64url_decode, load_pem_file
from tests.courses.buses import Bus, bus_config, make_bus, serve_bus, user
from tests.support import RunningServer, T, TlsFiles, serve_app_async
from tests.support.gateway import LogEvents
from tests.support.tls import client_ssl_context

pytestmark = pytest.mark.anyio


def key_of(bus: Bus) -> SigningKey:
    return SigningKey((bus.directory / "bus.pem").read_bytes(), domain=bus.domain)


@contextlib.asynccontextmanager
async def bus_b(
    tmp_path: Path, tls: TlsFiles | None, **overrides: object
) -> AsyncIterator[tuple[RunningServer, Bus, Bus]]:
    """Bus b.test listing a.test (no URL: it only answers), and a.test's files."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    config = bus_config(b, {a: []}, tls=tls, **overrides)  # type: ignore[arg-type]
    async with serve_app_async(create_app(config), tls=tls) as running:
        yield running, a, b


async def refusal(url: str, token: str | None, tls: TlsFiles | None) -> tuple[int, int]:
    """The HTTP status and the fault code of a refused handshake."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    ssl = None if tls is None else client_ssl_context(tls)
    with pytest.raises(InvalidStatus) as caught:
        async with connect(url, additional_headers=headers, ssl=ssl, open_timeout=5 * T):
            pass
    response = caught.value.response
    fault = read_fault(decode(response.body or b""))
    return response.status_code, fault.code


async def test_a_listed_peer_gets_a_signed_answer_bound_to_its_credential(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a, b):
        token, jti = key_of(a).sign("b.test", lifetime=60)
        async with connect(
            f"{server.ws_url}/course",
            additional_headers={"Authorization": f"Bearer {token}"},
            ssl=client_ssl_context(tls_files),
        ) as ws:
            frame = await asyncio.wait_for(ws.recv(), 5 * T)
            hello = decode(frame if isinstance(frame, bytes) else frame.encode())
        assert (hello.name, hello.get("domain")) == ("asbp.course", "b.test")
        verifier = AgentCredentials({"b.test": load_pem_file(b.public_key)}, audience="a.test")
        assert verifier.verify(hello.body.decode()).jti == answer_jti(jti)


async def test_an_unlisted_domain_is_refused_with_2203(tmp_path: Path, tls_files: TlsFiles) -> None:
    async with bus_b(tmp_path, tls_files) as (server, _a, _b):
        stranger = make_bus(tmp_path, "c.test")
        token, _ = key_of(stranger).sign("b.test", lifetime=60)
        url = f"{server.ws_url}/course"
        assert await refusal(url, token, tls_files) == (401, 2203)
        assert await refusal(url, None, tls_files) == (401, 2204)


async def test_a_replayed_credential_is_refused_with_2205(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, a, _b):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        url = f"{server.ws_url}/course"
        async with connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            ssl=client_ssl_context(tls_files),
        ) as ws:
            await asyncio.wait_for(ws.recv(), 5 * T)
        assert await refusal(url, token, tls_files) == (401, 2205)


async def test_a_peer_claiming_another_domain_is_refused_with_2204(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    async with bus_b(tmp_path, tls_files) as (server, _a, _b):
        # c.test's key, claiming to be a.test: the signature fails a.test's key.
        impostor = SigningKey(
            (make_bus(tmp_path, "c.test").directory / "bus.pem").read_bytes(), domain="a.test"
        )
        token, _ = impostor.sign("b.test", lifetime=60)
        assert await refusal(f"{server.ws_url}/course", token, tls_files) == (401, 2204)
        # a.test's own key, but for another audience: not for this bus.
        token, _ = key_of(_a).sign("c.test", lifetime=60)
        assert await refusal(f"{server.ws_url}/course", token, tls_files) == (401, 2204)


async def test_plain_text_is_refused_with_2206_without_the_dev_flag(tmp_path: Path) -> None:
    async with bus_b(tmp_path, None, insecure_dev_tubes=False) as (server, a, _b):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        assert await refusal(f"{server.ws_url}/course", token, None) == (403, 2206)


async def test_plain_text_on_loopback_is_accepted_behind_the_dev_flag(tmp_path: Path) -> None:
    async with bus_b(tmp_path, None, insecure_dev_tubes=True) as (server, a, _b):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        async with connect(
            f"{server.ws_url}/course", additional_headers={"Authorization": f"Bearer {token}"}
        ) as ws:
            frame = await asyncio.wait_for(ws.recv(), 5 * T)
        assert decode(frame if isinstance(frame, bytes) else frame.encode()).name == "asbp.course"


@pytest.mark.parametrize(
    ("domain", "signer", "bound", "reason"),
    [
        # Another bus's signed answer: not the peer dialled.
        ("c.test", "c.test", True, "the answer does not come from b.test"),
        # Claims b.test, signed with another key: does not verify.
        ("b.test", "c.test", True, "the answer does not verify"),
        # b.test's real key, but an answer recorded from another handshake.
        ("b.test", "b.test", False, "the answer belongs to another handshake"),
    ],
)
async def test_the_dialling_bus_refuses_an_answer_from_anyone_but_its_peer(
    tmp_path: Path, tls_files: TlsFiles, domain: str, signer: str, bound: bool, reason: str
) -> None:
    """A hostile answerer (a bare WebSocket server) plays each forgery at bus a.test."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    make_bus(tmp_path, "c.test")  # a key of another bus, for the forgeries

    async def answer(ws: ServerConnection) -> None:
        token = (ws.request.headers.get("Authorization") or "").removeprefix("Bearer ")
        claims = json.loads(b64url_decode(token.split(".")[1]))
        jti = answer_jti(claims["jti"]) if bound else "re.recorded-earlier"
        signed, _ = SigningKey((tmp_path / signer / "bus.pem").read_bytes(), domain=domain).sign(
            "a.test", lifetime=60, jti=jti
        )
        await ws.send(encode(Command({"c": "asbp.course", "domain": domain}, signed.encode())))
        await ws.wait_closed()

    ssl = tls_server_context(tls_files)
    async with serve(answer, "127.0.0.1", 0, ssl=ssl) as hostile:
        port = next(iter(hostile.sockets)).getsockname()[1]
        events = LogEvents(asyncio.get_running_loop())
        log = logging.getLogger(f"test-courses-a-{domain}-{signer}-{bound}")
        log.addHandler(events)
        try:
            url = f"wss://127.0.0.1:{port}/course"
            config_a = bus_config(a, {b: url}, tls=tls_files)
            async with serve_bus(a, config_a, tls_files, log=log):
                record = await events.wait("course.answer_refused")
                assert reason in record.error
                assert not events.find("course.up")
        finally:
            log.removeHandler(events)


def tls_server_context(tls: TlsFiles) -> ssl_module.SSLContext:
    context = ssl_module.create_default_context(ssl_module.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    return context


@pytest.mark.parametrize(
    ("publisher", "via"),
    [
        ("bob*b.test", ["a.test"]),  # speaking for the receiving bus's own user
        ("alice*a.test", ["c.test"]),  # hiding that it comes from a.test
    ],
)
async def test_a_peer_cannot_speak_for_the_receiving_bus_or_hide_its_origin(
    tmp_path: Path, tls_files: TlsFiles, publisher: str, via: list[str]
) -> None:
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    config_b = bus_config(b, {a: []}, tls=tls_files)
    async with (
        serve_bus(b, config_b, tls_files) as server,
        user(server.ws_url, "bob", tls_files) as bob,
    ):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        async with connect(
            f"{server.ws_url}/course",
            additional_headers={"Authorization": f"Bearer {token}"},
            ssl=client_ssl_context(tls_files),
        ) as course:
            await asyncio.wait_for(course.recv(), 5 * T)  # asbp.course
            for n, (p, v) in enumerate(((publisher, via), ("alice*a.test", ["a.test"]))):
                crossing = Command(
                    {
                        "c": "chat",
                        "r": "bob*b.test",
                        "p": p,
                        "course.id": f"{n:032x}",
                        "course.via": v,
                    },
                    str(n).encode(),
                )
                await course.send(encode(crossing))
            # Both acknowledged; only the honest one reaches bob.
            acked: list[str] = []
            while len(acked) < 2:
                frame = await asyncio.wait_for(course.recv(), 5 * T)
                ack = decode(frame if isinstance(frame, bytes) else frame.encode())
                ids = ack.get("course.id")
                acked += [ids] if isinstance(ids, str) else list(ids or ())
        got = await bob.recv()
        assert (got.body, got.publisher) == (b"1", "alice*a.test")


@pytest.mark.parametrize(
    "frame",
    [
        b"not asbp",
        b"c=chat,r=bob*b.test;no course.id",
        b"c=asbp.course.batch;9:truncated",
        b"c=asbp.course.batch;5:c=x;y",
    ],
)
async def test_a_peer_sending_what_is_not_a_crossing_loses_its_course(
    tmp_path: Path, frame: bytes
) -> None:
    """Over ws:// behind the dev flag: Hypercorn answering a WebSocket it closes
    itself over TLS sometimes fails with APPLICATION_DATA_AFTER_CLOSE_NOTIFY when the
    client's closing frame arrives after its close_notify (a Hypercorn issue)."""
    async with bus_b(tmp_path, None, insecure_dev_tubes=True) as (server, a, _b):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        async with connect(
            f"{server.ws_url}/course",
            additional_headers={"Authorization": f"Bearer {token}"},
        ) as course:
            await asyncio.wait_for(course.recv(), 5 * T)  # asbp.course
            await course.send(frame)
            await asyncio.wait_for(course.wait_closed(), 5 * T)
        assert course.close_code == 1008


async def test_a_crossing_that_does_not_decode_is_acknowledged_and_dropped(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    """Not a reason to end the Course: it would come back after every reconnection."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    config_b = bus_config(b, {a: []}, tls=tls_files)
    async with (
        serve_bus(b, config_b, tls_files) as server,
        user(server.ws_url, "bob", tls_files) as bob,
    ):
        token, _ = key_of(a).sign("b.test", lifetime=60)
        bad = [f"c=chat,u=99999999,course.id={n:032x};bad".encode() for n in (1, 2)]
        good = encode(
            Command(
                {
                    "c": "chat",
                    "r": "bob*b.test",
                    "p": "alice*a.test",
                    "course.id": f"{3:032x}",
                    "course.via": ["a.test"],
                },
                b"good",
            )
        )
        async with connect(
            f"{server.ws_url}/course",
            additional_headers={"Authorization": f"Bearer {token}"},
            ssl=client_ssl_context(tls_files),
        ) as course:
            await asyncio.wait_for(course.recv(), 5 * T)  # asbp.course
            await course.send(bad[0])
            await course.send(pack([bad[1], good])[0])
            acked: list[str] = []
            while len(acked) < 3:
                frame = await asyncio.wait_for(course.recv(), 5 * T)
                ack = decode(frame if isinstance(frame, bytes) else frame.encode())
                ids = ack.get("course.id")
                acked += [ids] if isinstance(ids, str) else list(ids or ())
        assert sorted(acked) == [f"{n:032x}" for n in (1, 2, 3)]
        assert (await bob.recv()).body == b"good"

"""The answering side's read path (courses/endpoint.py): a message accepted later
than it was read holds back the ones after it, which keep their order.

On a broker whose claims are in memory and which is alone on its bus, the Course
endpoint accepts each message as the server parses it (the RECEIVE_FRAMES
extension, on Hypercorn and on Uvicorn). A crossing for a further bus is accepted
only once it is stored in that bus's queue, at the end of a loop turn: the
messages read meanwhile must wait in the server's queue and come after it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from asbp import Command, FaultCode, decode, encode
from courses.credential import SigningKey
from gateway.app import create_app
from tests.courses.buses import bus_config, make_bus, serve_bus, user
from tests.support import RedisServer, T

pytestmark = pytest.mark.anyio


def _crossing(n: int, to: str) -> bytes:
    return encode(
        Command(
            {
                "c": "chat",
                "r": to,
                "p": "alice*a.test",
                "course.id": f"{n:032x}",
                "course.via": ["a.test"],
            },
            str(n).encode(),
        )
    )


@pytest.mark.parametrize("server", ["hypercorn", "uvicorn"])
async def test_messages_read_while_one_is_stored_onwards_keep_their_order(
    tmp_path: Path, server: str
) -> None:
    a, b, c = (make_bus(tmp_path, domain) for domain in ("a.test", "b.test", "c.test"))
    # c.test is dialled at a port nobody listens on: what goes there waits in b's queue.
    config_b = bus_config(b, {a: [], c: "ws://127.0.0.1:9/course"}, tls=None)
    async with (
        serve_bus(b, config_b, None, server=server) as running,
        user(running.ws_url, "bob", None) as bob,
    ):
        token, _ = SigningKey((a.directory / "bus.pem").read_bytes(), domain="a.test").sign(
            "b.test", lifetime=60
        )
        # The first for carol on c.test (stored for that Course: accepted a loop turn
        # later), then bob's, sent without waiting, so that the server reads them
        # while the first is still being stored.
        frames = [_crossing(0, "carol*c.test")] + [_crossing(n, "bob*b.test") for n in range(1, 40)]
        async with connect(
            f"{running.ws_url}/course", additional_headers={"Authorization": f"Bearer {token}"}
        ) as course:
            await asyncio.wait_for(course.recv(), 5 * T)  # asbp.course
            for frame in frames:
                await course.send(frame)
            acked: list[str] = []
            while len(acked) < len(frames):
                reply = await asyncio.wait_for(course.recv(), 5 * T)
                ack = decode(reply if isinstance(reply, bytes) else reply.encode())
                ids = ack.get("course.id")
                acked += [ids] if isinstance(ids, str) else list(ids or ())
        assert acked == [f"{n:032x}" for n in range(len(frames))]
        got = [(await bob.recv()).body for _ in range(1, len(frames))]
        assert got == [str(n).encode() for n in range(1, len(frames))]


async def test_on_redis_the_task_takes_each_message_and_ends_a_course_sending_junk(
    tmp_path: Path,
) -> None:
    """Claims in Redis wait for it: the endpoint's task takes the messages (not the
    read path), accepts crossings in order, and ends the Course at one that is not
    a crossing, as the read path does (tests/courses/test_handshake.py)."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    with RedisServer(tmp_path / "redis-b") as redis_b:
        config_b = bus_config(b, {a: []}, tls=None, engine="redis", redis_url=redis_b.url)
        async with (
            serve_bus(b, config_b, None) as running,
            user(running.ws_url, "bob", None) as bob,
        ):
            token, _ = SigningKey((a.directory / "bus.pem").read_bytes(), domain="a.test").sign(
                "b.test", lifetime=60
            )
            async with connect(
                f"{running.ws_url}/course", additional_headers={"Authorization": f"Bearer {token}"}
            ) as course:
                await asyncio.wait_for(course.recv(), 5 * T)  # asbp.course
                for n in range(1, 4):
                    await course.send(_crossing(n, "bob*b.test"))
                await course.send(b"not asbp")
                await asyncio.wait_for(course.wait_closed(), 5 * T)
            assert course.close_code == 1008
            got = [(await bob.recv()).body for _ in range(3)]
            assert got == [b"1", b"2", b"3"]


async def test_a_queue_delivery_from_an_older_peer_bus_is_refused_with_3201(
    tmp_path: Path,
) -> None:
    """Our brokers refuse an ``asbp.notification`` with a ``receipt`` where it starts;
    a peer bus that does not (an older version, here spoken by hand over the Course
    protocol with a.test's own key) still gets it refused here: bob never sees it,
    and the fault waits in b.test's queue for alice, on a.test, while what follows
    is delivered."""
    a, b = make_bus(tmp_path, "a.test"), make_bus(tmp_path, "b.test")
    # a.test is dialled at a port nobody listens on: what goes back waits in b's queue.
    config_b = bus_config(b, {a: "ws://127.0.0.1:9/course"}, tls=None)
    records: list[logging.LogRecord] = []
    log = logging.getLogger(f"test.receipt.{tmp_path.name}")
    log.setLevel(logging.INFO)
    log.addHandler(_Records(records))
    app_b = create_app(config_b, log=log)
    async with (
        serve_bus(b, config_b, None, app=app_b) as running,
        user(running.ws_url, "bob", None) as bob,
    ):
        token, _ = SigningKey((a.directory / "bus.pem").read_bytes(), domain="a.test").sign(
            "b.test", lifetime=60
        )
        receipt = encode(
            Command(
                {
                    "c": "asbp.notification",
                    "receipt": "r-1",
                    "r": "bob*b.test",
                    "p": "alice*a.test",
                    "u": 7,
                    "course.id": f"{0:032x}",
                    "course.via": ["a.test"],
                },
                b"relayed",
            )
        )
        async with connect(
            f"{running.ws_url}/course", additional_headers={"Authorization": f"Bearer {token}"}
        ) as course:
            await asyncio.wait_for(course.recv(), 5 * T)  # asbp.course
            await course.send(receipt)
            await course.send(_crossing(1, "bob*b.test"))
            acked: list[str] = []
            while len(acked) < 2:
                reply = await asyncio.wait_for(course.recv(), 5 * T)
                ack = decode(reply if isinstance(reply, bytes) else reply.encode())
                ids = ack.get("course.id")
                acked += [ids] if isinstance(ids, str) else list(ids or ())
        assert acked == [f"{0:032x}", f"{1:032x}"]
        assert (await bob.recv()).body == b"1"
        # The fault for alice, queued for the Course to a.test (never dialled here).
        assert app_b.state.courses.links["a.test"].depth == 1
        (refused,) = [r for r in records if r.msg == "course.refused_command"]
        assert refused.__dict__["code"] == FaultCode.ACCESS_DENIED
        assert refused.__dict__["command"] == "asbp.notification"
        assert "receipt" in refused.__dict__["reason"]


class _Records(logging.Handler):
    """Keeps the records the broker logs (from its server's thread)."""

    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

"""Answers across brokers close the books at the Channel's broker without decoding.

The serving broker B says beside each whole answer (``u``, no ``t``, no ``o``)
which Command it answers (gateway/plane/redis/batches.py, "Beside the records"),
so the Channel's broker A ends that Command in its own books from that; a
stream's parts go without it, and A reads ``t`` and ``o`` from the frame as
before, so a stream stays in flight at A until its last part. Two brokers (real
Hypercorn servers, each in its own thread) on one private redis-server, a real
User-Agent WebSocket on A, the SDK's agent on B.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.asyncio.client import ClientConnection, connect

from agents import ApplicationAgent, Request
from asbp import Command, decode
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from tests.gateway.engines._broker_process import receive
from tests.support import RedisServer, RunningServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import flush, until_in_directory

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("answers-redis")) as server:
        yield server.url


@contextlib.asynccontextmanager
async def broker(
    tmp_path: Path, broker_id: str, redis_url: str
) -> AsyncIterator[tuple[RunningServer, Any]]:
    directory = tmp_path / broker_id
    directory.mkdir()
    app = create_app(
        GatewayConfig(
            data_dir=directory,
            broker_id=broker_id,
            engine="redis",
            redis_url=redis_url,
            bus_lease=1.5,
            insecure_dev_tubes=True,
            agents={"echo": {"public_key": "echo.pem"}},
            agents_base_dir=tmp_path,
        )
    )
    async with serve_app_async(app) as running:
        yield running, app


def waiting(app: Any) -> int:
    """The Commands the broker's User-Agents sent to other brokers, still owed."""
    return len(app.state.broker.router.remote.waiting)


async def frame(connection: ClientConnection) -> Command:
    with anyio.fail_after(5 * T):
        return decode(await receive(connection))


async def test_a_whole_answer_ends_its_command_and_a_stream_its_last_part(
    tmp_path: Path, redis_url: str
) -> None:
    await flush(redis_url)
    credentials = make_credentials(tmp_path)
    arrived = asyncio.Event()
    released = asyncio.Event()
    async with (
        broker(tmp_path, "broker-a", redis_url) as (a, app_a),
        broker(tmp_path, "broker-b", redis_url) as (b, _),
    ):
        agent: ApplicationAgent = make_agent(credentials, [b.ws_url + "/tube"])

        @agent.respondent("echo")
        async def echo(request: Request) -> bytes:
            return request.body

        @agent.respondent("parts")
        async def parts(request: Request) -> bytes:
            arrived.set()
            await released.wait()
            return b"done"

        async with agent:
            await until_in_directory(redis_url, "name:parts", "broker-b")
            connection = await connect(a.ws_url + "/asbp", compression=None, max_size=None)
            try:
                greeting = await frame(connection)
                user = greeting.get("i")
                assert isinstance(user, str)
                # A whole answer: A's books let go of it as it is delivered.
                await connection.send("c=echo,u=1;hi")
                reply = await frame(connection)
                assert (reply.command_id, reply.body) == (1, b"hi")
                assert waiting(app_a) == 0
                # A stream: the first part keeps it in flight at A, the last ends it.
                await connection.send("c=parts,u=2;x")
                with anyio.fail_after(5 * T):
                    await arrived.wait()
                assert waiting(app_a) == 1
                await agent.send(Command(c="part", d=user, u=2, o=1, t=2))
                first = await frame(connection)
                assert (first.name, first.get("o")) == ("part", "1")
                assert waiting(app_a) == 1
                await agent.send(Command(c="part", d=user, u=2, o=2, t=2))
                last = await frame(connection)
                assert (last.name, last.get("o")) == ("part", "2")
                assert waiting(app_a) == 0
            finally:
                released.set()
                await connection.close()

"""The event log's row of a Command a User-Agent hands to the bus is written once
the bus says what became of it (gateway.routing.remote: the one callback of its
placing does the books, then the row): delivered when another broker took it,
fault 2101 when nobody on the bus serves its name, each after its own fault went
to the User-Agent.

Two Hypercorn brokers on one private redis-server; the agent ``echo`` (the SDK's)
holds one Tube to broker B; the User-Agent is a real WebSocket on broker A.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis

from agents import Request
from asbp import FaultCode
from asbp.eventlog import STREAM_FIELD, STREAM_KEY
from asbp.fault_commands import read_fault
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from tests.support import RedisServer, T, serve_app_async
from tests.support.agents import make_agent, make_credentials
from tests.support.bus import flush, frame, open_with_id, until_in_directory

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("bus-outcome-redis")) as server:
        yield server.url


def config(tmp_path: Path, broker_id: str, redis_url: str) -> GatewayConfig:
    directory = tmp_path / broker_id
    directory.mkdir()
    return GatewayConfig(
        data_dir=directory,
        broker_id=broker_id,
        engine="redis",
        redis_url=redis_url,
        insecure_dev_tubes=True,
        agents={"echo": {"public_key": "echo.pem", "serves": [".*"]}},
        agents_base_dir=tmp_path,
    )


async def rows(redis_url: str) -> list[dict[str, object]]:
    client = redis.Redis.from_url(redis_url)
    try:
        entries = await client.xrange(STREAM_KEY)
    finally:
        await client.aclose()
    assert entries is not None
    return [json.loads(fields[STREAM_FIELD]) for _, fields in entries if fields is not None]


@contextlib.asynccontextmanager
async def two_brokers(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[str, str]]:
    """Brokers A and B (their WebSocket URLs), stopped (rows written) on leaving."""
    async with (
        serve_app_async(create_app(config(tmp_path, "broker-a", redis_url))) as a,
        serve_app_async(create_app(config(tmp_path, "broker-b", redis_url))) as b,
    ):
        yield a.ws_url, b.ws_url


async def test_a_forwarded_commands_row_says_delivered_or_2101(
    tmp_path: Path, redis_url: str
) -> None:
    await flush(redis_url)
    credentials = make_credentials(tmp_path)
    async with two_brokers(tmp_path, redis_url) as (a, b):
        agent = make_agent(credentials, [b + "/tube"])  # one Tube, to broker B only

        @agent.respondent("echo")
        async def echo(request: Request) -> bytes:
            return request.body

        async with agent:
            await agent.wait_registered(5 * T)
            connection, identifier = await open_with_id(a + "/asbp")
            await until_in_directory(redis_url, "ch", identifier)
            try:
                await connection.send(b"c=echo,u=1;hi")
                answer = await frame(connection)
                assert (answer.command_id, answer.body) == (1, b"hi"), answer
                await connection.send(b"c=nobody.serves,u=2;")
                fault = read_fault(await frame(connection))
                assert (fault.code, fault.command_id) == (FaultCode.NO_RESPONDENT, 2)
            finally:
                await connection.close()
    logged = {
        row["command"]: (row["broker"], row["outcome"], row["fault"])
        for row in await rows(redis_url)
        if row["source_kind"] == "channel"
    }
    assert logged["echo"] == ("broker-a", "delivered", None)
    assert logged["nobody.serves"] == ("broker-a", "fault", int(FaultCode.NO_RESPONDENT))

from __future__ import annotations

import asyncio

from pyspark.sql import SparkSession

from agents import UserAgent
from tests.support.spark import Bus


def test_the_shared_session_runs_python_on_the_workers(spark: SparkSession) -> None:
    rows = spark.range(10).rdd.map(lambda row: row.id * 2).collect()
    assert sorted(rows) == [i * 2 for i in range(10)]


def test_the_bus_fixture_serves_a_channel(bus: Bus) -> None:
    async def ping() -> str:
        async with UserAgent.websocket(bus.channel_url) as ua:
            return ua.channel_id

    assert len(asyncio.run(ping())) == 32

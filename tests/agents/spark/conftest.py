"""One SparkSession for every Spark test: starting one takes about 10 seconds."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import SparkSession

from agents.credentials import generate_agent_key
from agents.spark.session import session
from gateway.app import create_app
from gateway.config.model import GatewayConfig
from tests.support import RedisServer
from tests.support.servers import serve_app
from tests.support.spark import AUDIENCE, SPARK_AGENTS, Bus, BusFactory


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    spark = session("asbp-tests", master="local[2]", conf={"spark.sql.session.timeZone": "UTC"})
    try:
        yield spark
    finally:
        spark.stop()


# --------------------------------------------------------------------------
# A real broker on a real redis-server, for the tests that talk to the bus.
# Spark's API is synchronous, so the broker runs in a server thread
# (tests.support.serve_app) and the tests drive it with blocking calls.
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("spark-redis")) as server:
        yield server


@pytest.fixture(scope="session")
def spark_agent_keys() -> dict[str, tuple[str, str]]:
    return {identity: generate_agent_key() for identity in SPARK_AGENTS}


@pytest.fixture
def make_bus(
    tmp_path: Path,
    spark_redis: RedisServer,
    spark_agent_keys: dict[str, tuple[str, str]],
) -> Iterator[BusFactory]:
    """Start brokers on the session's Redis (emptied first): ``make_bus(**config)``.

    Defaults: the redis engine, ``insecure_dev_tubes`` on loopback, the identities of
    :data:`SPARK_AGENTS` trusted with any name. Stopped at teardown.
    """
    client = redis.Redis.from_url(spark_redis.url)
    try:
        client.flushall()
    finally:
        client.close()
    for identity, (_, public) in spark_agent_keys.items():
        (tmp_path / f"{identity}.pem").write_text(public)
    with contextlib.ExitStack() as stack:

        def start(**overrides: Any) -> Bus:
            broker_id = overrides.pop("broker_id", f"spark-broker-{uuid.uuid4().hex[:8]}")
            options: dict[str, Any] = {
                "broker_id": broker_id,
                "data_dir": tmp_path / "data",
                "engine": "redis",
                "redis_url": spark_redis.url,
                "agents": {i: {"public_key": f"{i}.pem"} for i in SPARK_AGENTS},
                "agents_base_dir": tmp_path,
                "audience": AUDIENCE,
                "insecure_dev_tubes": True,
            }
            options.update(overrides)
            app = create_app(GatewayConfig(**options))
            running = stack.enter_context(serve_app(app))
            return Bus(
                running,
                spark_redis,
                {identity: private for identity, (private, _) in spark_agent_keys.items()},
                Path(options["data_dir"]),
                broker_id,
            )

        yield start


@pytest.fixture
def bus(make_bus: BusFactory) -> Bus:
    """One broker on the redis engine."""
    return make_bus()

"""Fixtures for end-to-end broker tests: ``make_gateway``, ``gateway`` and their keys.

The helpers they return (:class:`~tests.support.gateway.Gateway`, its clients and
probes) are in :mod:`tests.support.gateway`, whose docstring tells how they work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agents.credentials import generate_agent_key
from gateway.app import create_app
from gateway.config.model import GatewayConfig, TubeLimits
from tests.support import (
    ServerName,
    T,
    TlsFiles,
    generate_tls_files,
    serve_app_async,
)
from tests.support.gateway import (
    AGENTS,
    AUDIENCE,
    BROKER_ID,
    AgentKeys,
    BrokerProbe,
    Gateway,
    GatewayFactory,
    LogEvents,
)


@pytest.fixture(scope="session")
def agent_keys() -> AgentKeys:
    pairs = {identity: generate_agent_key() for identity in AGENTS}
    return AgentKeys(
        private={identity: private for identity, (private, _) in pairs.items()},
        public={identity: public for identity, (_, public) in pairs.items()},
        stranger=generate_agent_key()[0],
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return generate_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def make_gateway(
    tmp_path: Path, agent_keys: AgentKeys
) -> AsyncIterator[Callable[..., Awaitable[Gateway]]]:
    """Start brokers: ``await make_gateway(server=..., tls=..., **GatewayConfig fields)``.

    Defaults: ``insecure_dev_tubes=True`` (loopback Tubes without TLS) and a 5 T
    Respondent timeout. Each broker is stopped at teardown, its clients closed first.
    """
    for identity, public in agent_keys.public.items():
        (tmp_path / f"{identity}.pem").write_text(public)
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as outer:

        async def start(
            *, server: ServerName = "hypercorn", tls: TlsFiles | None = None, **overrides: Any
        ) -> Gateway:
            options: dict[str, Any] = {
                "broker_id": BROKER_ID,
                "data_dir": tmp_path / "data",
                "agents": {i: {"public_key": f"{i}.pem"} for i in AGENTS},
                "agents_base_dir": tmp_path,
                "audience": AUDIENCE,
                "insecure_dev_tubes": True,
                "tubes": TubeLimits(respondent_timeout=5 * T),
            }
            options.update(overrides)
            log = logging.getLogger(f"tests.gateway.{uuid.uuid4().hex}")
            log.setLevel(logging.DEBUG)
            log.propagate = False
            events = LogEvents(loop)
            log.addHandler(events)
            outer.callback(log.removeHandler, events)
            probe = BrokerProbe(create_app(GatewayConfig(**options), log=log))
            running = await outer.enter_async_context(
                serve_app_async(probe, server=server, tls=tls)
            )
            # Entered after the server: its clients close before the server stops.
            stack = await outer.enter_async_context(contextlib.AsyncExitStack())
            return Gateway(running, probe, events, agent_keys, tls, stack)

        yield start


@pytest.fixture
def server_name() -> ServerName:
    """The server for ``gateway``; tests parametrise it where the transport matters."""
    return "hypercorn"


@pytest.fixture
async def gateway(make_gateway: GatewayFactory, server_name: ServerName) -> Gateway:
    """A broker with the default test configuration."""
    return await make_gateway(server=server_name)

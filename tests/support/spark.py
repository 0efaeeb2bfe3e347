"""The bus the Spark tests talk to: a real broker on a real ``redis-server``.

Spark's API is synchronous, so the broker runs in a server thread
(:func:`tests.support.serve_app`) and the tests drive it with blocking calls. The
fixtures ``make_bus`` and ``bus`` (tests/agents/spark/conftest.py) return a :class:`Bus`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agents.credentials import AgentCredentialSource
from tests.support import RedisServer
from tests.support.servers import RunningServer

#: The agent identities the test broker trusts; each has a key in ``bus.keys``.
SPARK_AGENTS: tuple[str, ...] = ("spark", "analytics", "client")
AUDIENCE = "asbp-broker"


@dataclass(frozen=True)
class Bus:
    """A running broker, its Redis and the agents' private keys."""

    server: RunningServer
    redis: RedisServer
    keys: Mapping[str, str]
    data_dir: Path
    broker_id: str

    @property
    def channel_url(self) -> str:
        """``ws://127.0.0.1:PORT/asbp``: where User-Agents open Channels."""
        return f"{self.server.ws_url}/asbp"

    @property
    def tube_url(self) -> str:
        """``ws://127.0.0.1:PORT/tube``: plain-text Tubes (``insecure_dev_tubes``)."""
        return f"{self.server.ws_url}/tube"

    def credentials(self, identity: str = "spark") -> AgentCredentialSource:
        """Credentials the SDK can mint tokens from for ``identity``."""
        return AgentCredentialSource(identity, self.keys[identity], audience=AUDIENCE)


BusFactory = Callable[..., Bus]

"""``server = "auto"``: which ASGI server a broker runs (issue 17; docs/operations.md).

End to end, with the ``asbp broker`` process, in tests/gateway/ops/test_cli.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.model import GatewayConfig, ServerName, TlsConfig, chosen_server

TLS = TlsConfig(certfile=Path("broker.pem"), keyfile=Path("broker.key"))


@pytest.mark.parametrize(
    ("server", "tls", "runs"),
    [
        ("auto", None, "uvicorn"),
        ("auto", TLS, "hypercorn"),
        ("hypercorn", None, "hypercorn"),
        ("uvicorn", TLS, "uvicorn"),
    ],
)
def test_auto_runs_hypercorn_only_with_tls(
    server: ServerName, tls: TlsConfig | None, runs: str
) -> None:
    assert chosen_server(GatewayConfig(server=server, tls=tls)) == runs


def test_the_default_is_auto() -> None:
    assert GatewayConfig().server == "auto"

"""The TypeScript client through a rolling restart of its broker (gateway.drain).

Two ``python -m gateway`` processes on one private redis-server, the SDK's echo
Application-Agent on both, and a TCP proxy in front of broker A standing for a
Kubernetes Service. agents/js/test/restart.mjs sends requests at a steady pace; the
test points the proxy at broker B and stops A with SIGTERM. A closes the Channel
with 1012 and ``read=<n>``; the client must resume at B at once (its backoff is a
minute) and send again what A did not read: every request answered once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest

from tests.gateway.engines._broker_process import BrokerProcess, broker_process
from tests.support import RedisServer, T
from tests.support.agents import TcpProxy, install_echo, make_agent, make_credentials
from tests.support.bus import flush, until_in_directory
from tests.support.js import built_client, node

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("node-restart-redis")) as server:
        yield server


def _settings(tmp_path: Path, name: str) -> str:
    return (
        f'broker_id = "{name}"\ninsecure_dev_tubes = true\n'
        f"[agents.echo]\npublic_key = {str(tmp_path / 'echo.pem')!r}\n"
    )


def _port(broker: BrokerProcess) -> int:
    return int(broker.url.rsplit(":", 1)[1].split("/", 1)[0])


async def test_the_typescript_client_resumes_at_once_and_loses_nothing_when_its_broker_stops(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    await flush(redis_server.url)
    credentials = make_credentials(tmp_path, "echo")
    js = built_client()
    start = [
        broker_process(
            redis_server.url,
            tmp_path / n,
            ack_timeout=30,
            prefetch=8,
            settings=_settings(tmp_path, n),
        )
        for n in ("broker-a", "broker-b")
    ]
    async with start[0] as a, start[1] as b, TcpProxy() as proxy:
        proxy.target = _port(a)
        agent = make_agent(
            credentials, [a.url.replace("/asbp", "/tube"), b.url.replace("/asbp", "/tube")]
        )
        install_echo(agent)
        async with agent:
            await until_in_directory(redis_server.url, "name:echo", "broker-a")
            await until_in_directory(redis_server.url, "name:echo", "broker-b")
            env = {**os.environ, "ASBP_URL": f"http://127.0.0.1:{proxy.port}"}
            script = await asyncio.create_subprocess_exec(
                node(),
                "--experimental-websocket",
                "test/restart.mjs",
                cwd=js,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            try:
                assert script.stdout is not None and script.stderr is not None
                with anyio.move_on_after(30 * T):
                    ready = b""
                    ready = await script.stdout.readline()
                if not ready:
                    script.kill()
                    await script.wait()
                    raise AssertionError(f"no 'ready': {(await script.stderr.read()).decode()}")
                assert ready == b"ready\n", ready + await script.stderr.read()
                proxy.target = _port(b)  # the Service now sends new connections to B
                a.process.send_signal(signal.SIGTERM)
                with anyio.fail_after(90 * T):
                    out, err = await script.communicate()
                    assert await a.process.wait() == 0
            finally:
                if script.returncode is None:
                    script.kill()
                    await script.wait()
    assert script.returncode == 0, out.decode() + err.decode()
    summary = orjson.loads(out.splitlines()[-1])
    print(f"TypeScript client through a broker's stop: {summary}")
    assert summary["resumedAt"] >= 0 and not summary["newChannel"], summary
    assert summary["failed"] == 0 and summary["wrong"] == 0, summary
    assert summary["answered"] == summary["sent"], summary

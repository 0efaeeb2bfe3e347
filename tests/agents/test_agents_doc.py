"""docs/agents.md's snippets, run: the key pair, the broker's TOML and the agent program.

The key snippet runs in a temporary folder, the TOML is loaded as ``asbp broker
--config`` loads it and served, and the agent runs as a script there; a
User-Agent then uses every Respondent it describes, and SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from agents import FaultError, UserAgent
from gateway.app import create_app
from gateway.config.loading import load_config
from tests.support import T, free_port, serve_app_async

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)


async def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    keys, agent_program = blocks("python")
    (toml,) = blocks("toml")
    (tmp_path / "keys.py").write_text(keys)
    made = await asyncio.create_subprocess_exec(sys.executable, "keys.py", cwd=tmp_path)
    assert await made.wait() == 0
    assert (tmp_path / "billing.key").stat().st_mode & 0o777 == 0o600
    port = free_port()
    config_file = tmp_path / "broker.toml"
    config_file.write_text(toml.replace("port = 8080", f"port = {port}"))
    config = load_config({"config": str(config_file)}, environ={})
    assert config.authenticate_command == "auth.login"
    config = dataclasses.replace(config, data_dir=tmp_path / ".asbp")
    async with serve_app_async(create_app(config)) as server:
        (tmp_path / "billing_agent.py").write_text(agent_program)
        env = {**os.environ, "ASBP_TUBE_URL": server.ws_url + "/tube"}
        env["PYTHONPATH"] = str(DOC.parents[1])
        agent = await asyncio.create_subprocess_exec(
            sys.executable,
            "billing_agent.py",
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert agent.stdout is not None
            async with asyncio.timeout(30 * T):
                line = (await agent.stdout.readline()).decode()
            assert line.split()[0] == "serving", line
            assert "invoice.refund" in line
            async with UserAgent.websocket(server.ws_url + "/asbp") as user:
                total = await user.request("invoice.total", timeout=10 * T)
                assert (total.name, total.body) == ("invoice.total.reply", b"42.00")
                parts = [p async for p in user.stream("invoice.lines", timeout=10 * T)]
                assert [p.body for p in parts] == [b"coffee 3.50", b"bagel 2.25", b"tip 1.00"]
                assert parts[0].get("t") == "3"
                joined = await user.request("rooms.join", "lobby", timeout=10 * T)
                assert joined.body == b"joined lobby"
                refund = await user.request("invoice.refund", timeout=10 * T)
                assert refund.body == b"refund queued"
                alice = await user.request("auth.login", "alice:s3cret", timeout=10 * T)
                assert alice.name == "asbp.authenticated"
                assert alice.get("p") == "alice*billing.example"
                with pytest.raises(FaultError) as refused:
                    await user.request("auth.login", "alice:guess", timeout=10 * T)
                assert refused.value.code == 3101
            agent.send_signal(signal.SIGTERM)
            async with asyncio.timeout(20 * T):
                rest = (await agent.stdout.read()).decode()
                assert await agent.wait() == 0
            assert "stopped" in rest
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
